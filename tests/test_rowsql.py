"""Constant SQL for model rows (runs/rowsql.py): it reads what the ORM reads, and writes
a change of the journal in one statement on PostgreSQL, sending the ORM's signals."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.db.models.signals import post_save
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from lifecycle_helpers import send, start

from runs import rowsql
from runs.models import AuditEvent, Effect, EffectStatus

pytestmark = pytest.mark.django_db

on_postgresql = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="one statement and row locks are PostgreSQL's"
)


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def _effect(agent, **kwargs) -> Effect:
    run = start(agent).run
    args = {"subject": "Hi", "to": ["a@example.com"], "n": 1.5, "nested": {"x": None}}
    return send(agent, run, args=args, **kwargs).effect


def _event(effect: Effect, verb: str) -> AuditEvent:
    return AuditEvent(
        at=timezone.now(),
        actor="system",
        actor_kind="system",
        verb=verb,
        agent_id=effect.agent_id,
        run_id=effect.run_id,
        attempt_number=1,
        effect=effect,
        old_status="in_flight",
        new_status="in_flight",
        note=f"note {verb}",
        data={"verb": verb, "list": [1, 2]},
    )


def test_a_fetched_effect_equals_what_the_orm_reads(agent):
    effect = _effect(agent)

    fetched = rowsql.fetch(Effect, id=effect.pk)
    expected = Effect.objects.get(pk=effect.pk)

    assert type(fetched) is Effect
    assert _fields(fetched) == _fields(expected)
    # The values are the ORM's own types, not the database's raw ones.
    assert isinstance(fetched.id, uuid.UUID) and isinstance(fetched.agent_id, uuid.UUID)
    assert fetched.args == {
        "subject": "Hi",
        "to": ["a@example.com"],
        "n": 1.5,
        "nested": {"x": None},
    }
    assert isinstance(fetched.created_at, datetime) and fetched.created_at.tzinfo is not None
    assert fetched.claimed_at is not None and fetched.claimed_at.tzinfo is not None
    assert fetched.result is None and fetched.error is None and fetched.decision is None
    assert fetched.approval_expires_at is None
    # A row read from the database is not one to insert.
    assert not fetched._state.adding and fetched._state.db == "default"


def test_fetch_by_several_fields_by_attname(agent):
    effect = _effect(agent)

    fetched = rowsql.fetch(Effect, agent_id=agent.pk, key="outlook:message:1")

    assert fetched is not None and fetched.pk == effect.pk


def test_fetch_returns_none_when_no_row_matches(agent):
    _effect(agent)

    assert rowsql.fetch(Effect, id=uuid.uuid4()) is None
    assert rowsql.fetch(Effect, agent_id=agent.pk, key="no-such-key") is None


def test_exists_answers_whether_a_row_matches_in_one_statement(agent):
    effect = _effect(agent)

    with CaptureQueriesContext(connection) as queries:
        found = rowsql.exists(Effect, agent_id=agent.pk, key="outlook:message:1")
        missing = rowsql.exists(Effect, agent_id=agent.pk, key="no-such-key")

    assert found is True and missing is False
    assert rowsql.exists(Effect, id=effect.pk) is True
    assert len(queries) == 2


@on_postgresql
def test_a_locked_fetch_asks_for_update(agent):
    effect = _effect(agent)

    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        fetched = rowsql.fetch(Effect, lock=True, id=effect.pk)

    assert fetched.pk == effect.pk
    assert len(queries) == 1 and "FOR UPDATE" in queries[0]["sql"]


def test_an_unlocked_fetch_does_not_lock(agent):
    effect = _effect(agent)

    with CaptureQueriesContext(connection) as queries:
        rowsql.fetch(Effect, id=effect.pk)

    assert "FOR UPDATE" not in queries[0]["sql"]


@on_postgresql
def test_inserts_and_an_update_land_in_one_statement(agent):
    effect = _effect(agent)
    before = AuditEvent.objects.filter(effect=effect).count()
    first, second = _event(effect, "test_first"), _event(effect, "test_second")
    effect.preview = "changed by rowsql"
    effect.revision += 1
    effect.result = {"ok": True}

    with CaptureQueriesContext(connection) as queries:
        rowsql.write(inserts=[first, second], updates=[effect])

    assert len(queries) == 1, [q["sql"] for q in queries]
    assert queries[0]["sql"].startswith("WITH ")
    stored = Effect.objects.get(pk=effect.pk)
    assert (stored.preview, stored.revision, stored.result) == (
        "changed by rowsql",
        effect.revision,
        {"ok": True},
    )
    events = AuditEvent.objects.filter(effect=effect).order_by("id")
    assert events.count() == before + 2
    written = {e.verb: e for e in events if e.verb.startswith("test_")}
    assert set(written) == {"test_first", "test_second"}
    assert written["test_first"].data == {"verb": "test_first", "list": [1, 2]}
    assert written["test_second"].note == "note test_second"
    assert written["test_first"].run_id == effect.run_id
    # The written instances are saved ones now.
    assert not first._state.adding and not second._state.adding


def test_the_update_rewrites_every_column_of_the_row(agent):
    effect = _effect(agent)
    effect.error = "went wrong"
    effect.timeout = 30

    rowsql.write(updates=[effect])

    assert _fields(Effect.objects.get(pk=effect.pk)) == _fields(effect)


def test_post_save_is_sent_for_every_written_row(agent):
    effect = _effect(agent)
    first, second = _event(effect, "test_first"), _event(effect, "test_second")
    effect.preview = "changed"
    seen = []

    def receiver(sender, instance, created, update_fields, raw, using, **kwargs):
        seen.append((sender, instance, created, update_fields, raw, using))

    post_save.connect(receiver, weak=False, dispatch_uid="test_rowsql_post_save")
    try:
        rowsql.write(inserts=[first, second], updates=[effect])
    finally:
        post_save.disconnect(dispatch_uid="test_rowsql_post_save")

    assert [(s, i, c) for s, i, c, *_ in seen] == [
        (AuditEvent, first, True),
        (AuditEvent, second, True),
        (Effect, effect, False),
    ]
    assert all(i is w for (_, i, *_), w in zip(seen, [first, second, effect], strict=True))
    assert all((u, r, db) == (None, False, "default") for *_, u, r, db in seen)


def test_the_cursor_is_reused_on_one_connection_and_logged_while_logging(agent):
    with rowsql.cursor() as first:
        first.execute("SELECT 1")
    with rowsql.cursor() as second:
        second.execute("SELECT 2")
        assert second.fetchone() == (2,)

    assert second is first
    with CaptureQueriesContext(connection) as queries, rowsql.cursor() as logged:
        logged.execute("SELECT 3")
    assert logged is not first and [q["sql"] for q in queries] == ["SELECT 3"]


@pytest.mark.django_db(transaction=True)
def test_a_new_connection_gets_a_new_cursor(agent):
    with rowsql.cursor() as before:
        before.execute("SELECT 1")
    old = connection.connection
    connection.close()  # SQLite's in-memory test database stays open

    with rowsql.cursor() as after:
        after.execute("SELECT 1")
        assert after.fetchone() == (1,)

    assert (after is before) == (connection.connection is old)


def test_values_skip_only_what_the_field_would_send_unchanged(agent):
    """The fast path sends exactly what get_db_prep_save sends, field by field."""
    effect = _effect(agent)
    effect.status = EffectStatus.DONE  # a choices enum: through the field
    effect.timeout = 30
    effect.claimed_at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    event = _event(effect, "test_values")
    for obj in (effect, event):
        table = rowsql.table(type(obj))
        expected = [f.get_db_prep_save(getattr(obj, f.attname), connection) for f in table.fields]
        got = table.values(obj, table.fields, connection)
        for field, want, have in zip(table.fields, expected, got, strict=True):
            assert type(have) is type(want) and str(have) == str(want), field.name


@on_postgresql
def test_times_read_by_the_reused_cursor_are_what_the_orm_reads(agent):
    effect = _effect(agent)
    effect.claimed_at = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    rowsql.write(updates=[effect])

    fetched = rowsql.fetch(Effect, id=effect.pk)
    orm = Effect.objects.get(pk=effect.pk)

    for name in ("claimed_at", "created_at", "updated_at"):
        mine, theirs = getattr(fetched, name), getattr(orm, name)
        assert (mine, mine.tzinfo) == (theirs, theirs.tzinfo), name
    assert fetched.claimed_at == effect.claimed_at
