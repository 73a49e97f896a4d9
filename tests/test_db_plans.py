"""The console's statements are never prepared; the API's hot statements are.

A prepared statement may get a generic plan, made without its parameters' values,
after its tenth execution on a connection; the runs page's search then walked every
run instead of using its trigram index (startsafe/postgresql/plans.py).
"""

from __future__ import annotations

import pytest
from api_client import Api
from django.db import connection

from runs.models import Run
from startsafe.postgresql.plans import unprepared

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql"
    or not connection.settings_dict["OPTIONS"].get("server_side_binding"),
    reason="prepared statements need PostgreSQL with DATABASE_PREPARE on (the default)",
)

SEARCH_SQL_PART = "LIKE UPPER("


def _prepared(part: str) -> int:
    """Statements this connection has prepared that contain ``part``."""
    with unprepared(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE strpos(statement, %s) > 0",
            [part],
        )
        return cursor.fetchone()[0]


def _search(term: str) -> None:
    list(Run.objects.filter(run_key__icontains=term)[:5])


def test_a_statement_sent_often_is_prepared_outside_the_console(db):
    # The control: without this the test below could not fail.
    for _ in range(6):
        _search("refund")
    assert _prepared(SEARCH_SQL_PART) == 1


def test_inside_unprepared_nothing_is_prepared(db):
    with unprepared():
        for _ in range(12):
            _search("refund")
    assert _prepared(SEARCH_SQL_PART) == 0


def test_the_console_runs_page_search_is_never_prepared(client, viewer, agent):
    client.force_login(viewer)
    for _ in range(12):
        assert client.get("/runs/?q=refund").status_code == 200
    assert _prepared(SEARCH_SQL_PART) == 0


def test_the_api_keeps_its_prepared_statements(agent):
    api = Api(agent.token)
    for number in range(6):
        started = api.start(f"prep-{number}")
        assert started.status == 201, started.body
    # The token lookup, sent once per request, prepared at the fifth.
    assert _prepared("token_hash") >= 1
