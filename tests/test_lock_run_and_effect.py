"""The agent's report locks its run, then its effect (runs/lifecycle.py).

Committed for real: a second PostgreSQL connection checks which rows are locked.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from lifecycle_helpers import send, start

from runs.errors import NotFound
from runs.lifecycle import lock_run_and_effect

pytestmark = pytest.mark.django_db(transaction=True)


def _locked(conn, table: str, pk) -> bool:
    try:
        conn.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR UPDATE NOWAIT", [pk])
    except psycopg.errors.LockNotAvailable:
        return True
    return False


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks are PostgreSQL's")
def test_both_rows_are_locked_the_run_first(agent, other_connection):
    run = start(agent).run
    effect = send(agent, run).effect

    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        locked_run, locked_effect = lock_run_and_effect(agent, run.pk, effect.pk)
        assert _locked(other_connection, "runs_run", run.pk)
        assert _locked(other_connection, "runs_effect", effect.pk)

    assert (locked_run.pk, locked_effect.pk) == (run.pk, effect.pk)
    assert locked_effect.key == effect.key and locked_run.run_key == run.run_key
    # The run, then the effect: the lock order of every rule (runs/lifecycle.py).
    assert [q["sql"].split(" FROM ")[1].split()[0] for q in queries] == [
        '"runs_run"',
        '"runs_effect"',
    ]
    assert all("FOR UPDATE" in q["sql"] for q in queries)
    assert not _locked(other_connection, "runs_effect", effect.pk)


def test_a_missing_run_or_effect_is_not_found_by_name(agent, other_agent):
    run = start(agent).run
    effect = send(agent, run).effect

    with pytest.raises(NotFound, match="No such effect"), transaction.atomic():
        lock_run_and_effect(agent, run.pk, uuid.uuid4())
    with pytest.raises(NotFound, match="No such run"), transaction.atomic():
        lock_run_and_effect(agent, uuid.uuid4(), effect.pk)
    with pytest.raises(NotFound, match="No such run"), transaction.atomic():
        lock_run_and_effect(other_agent, run.pk, effect.pk)
