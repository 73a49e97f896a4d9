"""Migration runs 0010 / approvals 0004: RestartHandoff and TaskState move from the
approvals app to runs. A database with rows, migrated forward, keeps every row, its
tables and their content types (so permissions on them stay granted)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from runs.lifecycle import start_run
from runs.models import RestartHandoff, TaskState

pytestmark = pytest.mark.django_db

BEFORE = [("runs", "0009_run_verdict_blocked"), ("approvals", "0003_background_work")]
AT = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _migrate(targets) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


def test_rows_written_before_the_move_are_read_after_it(agent):
    # The whole test is one transaction: foreign keys checked at once, not at its end,
    # so no row leaves a pending trigger event on a table a later migration indexes
    # (PostgreSQL refuses CREATE INDEX on such a table: runs 0012 adds indexes).
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    run = start_run(agent, "handed-back", now=AT).run
    content_type = ContentType.objects.get_for_model(RestartHandoff)
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()

    # The release before: the models are the approvals app's.
    old = _migrate(BEFORE).loader.project_state(BEFORE).apps
    old.get_model("approvals", "RestartHandoff").objects.create(
        run_id=run.pk, attempt=2, status="given_up", due_at=AT, tries=5, failures=5,
        last_answer={"reason": "HTTP 503"}, created_at=AT, updated_at=AT,
    )  # fmt: skip
    old.get_model("approvals", "TaskState").objects.create(name="sweep", runs_total=7)
    assert ContentType.objects.get(pk=content_type.pk).app_label == "approvals"

    _migrate(leaves)

    handoff = RestartHandoff.objects.get(run=run)
    assert (handoff.attempt, handoff.status, handoff.tries, handoff.last_answer) == (
        2,
        "given_up",
        5,
        {"reason": "HTTP 503"},
    )
    assert TaskState.objects.get(name="sweep").runs_total == 7
    # The same tables, the same content type row (its permissions point to it).
    assert RestartHandoff._meta.db_table == "approvals_restarthandoff"
    assert TaskState._meta.db_table == "approvals_taskstate"
    moved = ContentType.objects.get(pk=content_type.pk)
    assert (moved.app_label, moved.model) == ("runs", "restarthandoff")
