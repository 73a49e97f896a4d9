"""The Idempotency-Key's advisory lock and the answer kept with the work (runs/api/idempotency.py).

These tests commit for real: a second PostgreSQL connection holds the key's lock as a
concurrent duplicate would, and a duplicate's kept answer must be one another
transaction committed.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import lifecycle
from runs.api import idempotency
from runs.models import Attempt, AuditEvent, Call, Effect, IdempotentRequest, Run
from tests.api_client import Answer, Api
from tests.race_helpers import Worker, pool_room, row_locked, run_together, wait_for_lock_waiters

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the key's lock is PostgreSQL's advisory lock"
    ),
]


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


def _start(api: Api, key: str, run_key: str = "t"):
    return api.post("/runs", {"run_key": run_key}, headers={"Idempotency-Key": key})


def test_a_key_locked_by_another_transaction_is_request_in_progress_until_it_is_freed(
    api, agent, other_connection
):
    lock = idempotency._lock_key(agent.token_hash, "busy-key")
    other_connection.execute("SELECT pg_advisory_lock(%s)", [lock])

    busy = _start(api, "busy-key")

    assert busy.status == 409 and busy.code == "request_in_progress"
    assert busy.headers["Retry-After"] == "1"
    assert busy.body["error"]["details"] == {"idempotency_key": "busy-key"}
    assert not Run.objects.exists()
    assert not IdempotentRequest.objects.exists()

    unlocked = other_connection.execute("SELECT pg_advisory_unlock(%s)", [lock]).fetchone()[0]
    assert unlocked is True

    first = _start(api, "busy-key")
    again = _start(api, "busy-key")

    assert first.status == again.status == 201
    assert "Idempotent-Replayed" not in first.headers
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.body == first.body
    assert Run.objects.count() == 1
    assert IdempotentRequest.objects.get(key="busy-key").response_status == 201


def test_the_lock_of_one_key_does_not_hold_another(api, agent, other_connection):
    other_connection.execute(
        "SELECT pg_advisory_lock(%s)", [idempotency._lock_key(agent.token_hash, "busy-key")]
    )

    answer = _start(api, "free-key")

    assert answer.status == 201


def test_the_kept_answer_is_read_after_the_keys_lock_is_taken(api):
    """A duplicate that held the lock has committed its answer by the time this
    request takes it; a statement begun after the lock sees that answer (READ
    COMMITTED), so a duplicate never does the work a second time."""
    first = _start(api, "race-key")

    with CaptureQueriesContext(connection) as queries:
        again = _start(api, "race-key")

    assert again.status == 201 and again.headers["Idempotent-Replayed"] == "true"
    assert again.body == first.body
    sql = [q["sql"] for q in queries]
    lock = next(i for i, s in enumerate(sql) if "pg_try_advisory_xact_lock" in s)
    read = next(i for i, s in enumerate(sql) if 'FROM "runs_idempotentrequest"' in s)
    assert lock < read
    assert "runs_idempotentrequest" not in sql[lock]


def test_a_server_error_keeps_nothing_and_the_retry_runs(api, monkeypatch):
    real = lifecycle.start_run
    calls = []

    def start_then_fail(*args, **kwargs):
        calls.append(real(*args, **kwargs))  # the work is done, then the request dies
        raise RuntimeError("boom")

    monkeypatch.setattr(lifecycle, "start_run", start_then_fail)

    failed = _start(api, "crash-key")

    assert len(calls) == 1
    assert failed.status == 500 and failed.code == "internal_error"
    assert not IdempotentRequest.objects.filter(key="crash-key").exists()
    assert not Run.objects.exists()  # the work went with the answer

    monkeypatch.setattr(lifecycle, "start_run", real)
    retry = _start(api, "crash-key")

    assert retry.status == 201
    assert "Idempotent-Replayed" not in retry.headers
    assert Run.objects.count() == 1
    assert IdempotentRequest.objects.get(key="crash-key").response_status == 201


def test_a_rule_that_fails_after_writing_rolls_the_request_back_and_keeps_its_answer(
    api, monkeypatch
):
    """Inside the API's request transaction a rule takes no savepoint: when it fails
    after writing, the request's transaction rolls back with its writes, and its
    error is kept as the key's answer (in a short transaction of its own)."""
    from runs import outcomes
    from runs.errors import ClaimConflict
    from runs.models import AuditEvent

    run = _start(api, "start").body["run"]
    recorded = api.post(
        f"/runs/{run['id']}/calls",
        {
            "attempt": 1,
            "tool": "mail.send",
            "kind": "effect",
            "key": "m1",
            "key_source": "intent",
            "args": {"to": "a@example.com"},
        },
        headers={"Idempotency-Key": "record"},
    )
    effect_id = recorded.body["effect"]["id"]
    real_save_effect = outcomes.save_effect

    def save_then_fail(effect, *args, **kwargs):
        real_save_effect(effect, *args, **kwargs)  # the effect's row and its event written
        raise ClaimConflict("Failed after writing.", {"status": effect.status})

    monkeypatch.setattr(outcomes, "save_effect", save_then_fail)
    body = {"run_id": run["id"], "attempt": 1, "outcome": "done", "result": {"id": "x"}}
    answer = api.post(f"/effects/{effect_id}/complete", body, headers={"Idempotency-Key": "done"})

    assert answer.status == 409 and answer.code == "claim_conflict"
    effect = Effect.objects.get(pk=effect_id)
    assert effect.status == "in_flight" and effect.result is None
    assert not AuditEvent.objects.filter(effect_id=effect_id, verb="completed").exists()
    assert IdempotentRequest.objects.get(key="done").response_status == 409
    monkeypatch.undo()
    repeat = api.post(f"/effects/{effect_id}/complete", body, headers={"Idempotency-Key": "done"})
    assert repeat.status == 409 and repeat.headers.get("Idempotent-Replayed") == "true"
    assert Effect.objects.get(pk=effect_id).status == "in_flight"


def test_a_rule_that_fails_after_writing_without_a_key_rolls_the_request_back(api, monkeypatch):
    """Without a key too the rule runs in the request's transaction, without a
    savepoint: its failure rolls the whole request back, and nothing is kept."""
    from runs import calls
    from runs.errors import KeyConflict

    run = _start(api, "start").body["run"]
    real_add_version = calls.add_version

    def add_then_fail(*args, **kwargs):
        real_add_version(*args, **kwargs)  # the effect, its events and the call written
        raise KeyConflict("Failed after writing.", {"tool": "mail.send"})

    monkeypatch.setattr(calls, "add_version", add_then_fail)
    call = {"attempt": 1, "tool": "mail.send", "kind": "effect", "args": {"to": "a@example.com"}}
    answer = api.post(f"/runs/{run['id']}/calls", call)

    assert answer.status == 409 and answer.code == "key_conflict"
    assert not Effect.objects.exists() and not Call.objects.exists()
    assert not AuditEvent.objects.filter(verb__in=("recorded", "claimed")).exists()
    assert IdempotentRequest.objects.filter(key="start").count() == 1  # the start's only


_CALL = {
    "attempt": 1,
    "tool": "email.send",
    "kind": "effect",
    "key": "msg-1",
    "key_source": "intent",
    "args": {"to": "a@example.com"},
}


def test_the_kept_answer_is_written_in_the_transaction_of_the_work(api):
    run_id = _start(api, "start-key").body["run"]["id"]

    with CaptureQueriesContext(connection) as queries:
        recorded = api.post(f"/runs/{run_id}/calls", _CALL, headers={"Idempotency-Key": "call-1"})

    assert recorded.status == 201
    sql = [q["sql"] for q in queries]
    kept = [i for i, s in enumerate(sql) if 'INSERT INTO "runs_idempotentrequest"' in s]
    work = [i for i, s in enumerate(sql) if 'INSERT INTO "runs_call"' in s]
    commits = [i for i, s in enumerate(sql) if s == "COMMIT"]
    assert len(kept) == 1 and len(work) == 1 and len(commits) == 1
    assert work[0] < kept[0] < commits[0]
    stored = IdempotentRequest.objects.get(key="call-1")
    assert stored.response_status == 201
    assert json.loads(bytes(stored.response_body)) == recorded.body


# --- Two real requests with one key, at the same time ---------------------------------


def _same_answer_or_in_progress(first: Answer, second: Answer) -> None:
    """api.md: the duplicate gets ``409 request_in_progress`` while the first runs, or
    the first answer again (status and body), never an answer of its own."""
    assert "Idempotent-Replayed" not in first.headers
    if second.status == 409:
        assert second.code == "request_in_progress", second.body
    else:
        assert (second.status, second.body) == (first.status, first.body)
        assert second.headers["Idempotent-Replayed"] == "true"


def test_a_duplicate_sent_while_the_first_request_runs_gets_no_answer_of_its_own(api, agent):
    """The first request holds the key and waits, inside its transaction, on the run's
    row (locked here from outside Django); the duplicate is sent then, on its own
    connection. The first cannot end before the lock is let go, so the two overlap."""
    run_id = _start(api, "start-key").body["run"]["id"]

    def record() -> Answer:
        return Api(agent.token).post(
            f"/runs/{run_id}/calls", _CALL, headers={"Idempotency-Key": "dup"}
        )

    with pool_room(2), row_locked(Run, run_id):
        first = Worker(record)
        assert wait_for_lock_waiters(1, unless=first.finished.is_set) == 1, first.outcome
        second = Worker(record)
        # It answers at once (the key is taken), or it waits as well.
        waiting = wait_for_lock_waiters(2, unless=second.finished.is_set)
        assert second.finished.is_set() or waiting == 2
        assert not first.finished.is_set()
    first, second = first.result(), second.result()

    assert first.status == 201 and first.body["action"] == "execute"
    _same_answer_or_in_progress(first, second)
    # One journal entry, one claim, one kept answer.
    assert Call.objects.filter(run_id=run_id).count() == 1
    assert AuditEvent.objects.filter(verb="claimed", effect__key="msg-1").count() == 1
    assert IdempotentRequest.objects.get(key="dup").response_status == 201
    again = record()
    assert (again.status, again.body) == (first.status, first.body)


def test_duplicates_released_together_give_one_answer_and_one_journal_entry(api, agent):
    """Without a held lock: pairs of requests with one key, each pair on two sessions
    opened before a barrier lets them go; starts of a new run and recorded calls."""
    client = Api(agent.token)
    run_id = _start(api, "start-key").body["run"]["id"]
    for n in range(6):
        key = f"pair-{n}"
        if n % 2:
            call = dict(_CALL, key=f"msg-{key}")

            def request(call=call, key=key) -> Answer:
                headers = {"Idempotency-Key": key}
                return client.post(f"/runs/{run_id}/calls", call, headers=headers)
        else:

            def request(key=key) -> Answer:
                return client.post("/runs", {"run_key": key}, headers={"Idempotency-Key": key})

        answers = run_together([request, request])

        fresh = [a for a in answers if "Idempotent-Replayed" not in a.headers and a.status != 409]
        assert len(fresh) == 1, [(a.status, a.body) for a in answers]
        assert fresh[0].status == 201, fresh[0].body
        other = answers[1 - answers.index(fresh[0])]
        _same_answer_or_in_progress(fresh[0], other)
        if n % 2:
            assert Call.objects.filter(run_id=run_id, effect__key=f"msg-{key}").count() == 1
        else:
            assert Attempt.objects.filter(run__run_key=key).count() == 1
