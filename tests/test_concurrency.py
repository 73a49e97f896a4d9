"""Races on real PostgreSQL connections: the database, not the process, keeps the rules.

Each worker is a thread with its own connection (closed at its end, back to the
pool); a barrier releases them together so their transactions really overlap.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection
from lifecycle_helpers import send, start

from approvals.decisions import approve_effect
from runs.calls import record_call
from runs.errors import AlreadyRunning, StaleArgs
from runs.lifecycle import start_run
from runs.models import Attempt, AttemptStatus, AuditEvent, Call, Effect, EffectStatus

pytestmark = pytest.mark.django_db(transaction=True)


def _race(workers: list) -> list:
    """Run each callable in its own thread at once; return what each returned or raised."""
    barrier = threading.Barrier(len(workers))
    results: list = [None] * len(workers)

    def run(i, work):
        try:
            barrier.wait(timeout=30)
            results[i] = work()
        except Exception as exc:  # the answer under test may be an error
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, w)) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_twenty_concurrent_calls_of_one_new_key_give_exactly_one_execute(agent):
    runs = [start(agent, f"webhook-{i}").run for i in range(20)]
    key = f"outlook:message:{uuid.uuid4()}"

    def call(run):
        return lambda: (
            record_call(
                agent,
                run.pk,
                attempt=1,
                tool="reply",
                kind="effect",
                args={"body": "hi"},
                key=key,
                key_source="provider",
            ).action
        )

    actions = _race([call(run) for run in runs])

    # Nobody failed with a unique violation; the losers read the winner's row.
    assert sorted(actions) == ["execute"] + ["wait"] * 19
    effect = Effect.objects.get(agent=agent, key=key)
    assert effect.status == EffectStatus.IN_FLIGHT
    assert Call.objects.filter(effect=effect).count() == 20
    # Rule 2: one claim in the audit log, so the effect ran once.
    assert AuditEvent.objects.filter(effect=effect, verb="claimed").count() == 1


def test_ten_concurrent_restarts_naming_one_attempt_create_one_new_attempt(agent):
    run = start(agent).run

    outcomes = _race([lambda: start_run(agent, "job-1", supersede=1) for _ in range(10)])

    started = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, AlreadyRunning)]
    assert (len(started), len(refused)) == (1, 9)
    assert started[0].attempt.number == 2
    assert list(Attempt.objects.filter(run=run).values_list("number", "status")) == [
        (1, AttemptStatus.SUPERSEDED),
        (2, AttemptStatus.RUNNING),
    ]


def test_concurrent_first_starts_of_one_run_key_create_one_run(agent):
    outcomes = _race([lambda: start_run(agent, "new-key") for _ in range(10)])

    created = [o for o in outcomes if not isinstance(o, Exception)]
    assert len(created) == 1 and created[0].created is True
    assert all(isinstance(o, AlreadyRunning) for o in outcomes if o not in created)
    assert Attempt.objects.filter(run__run_key="new-key").count() == 1


def test_concurrent_calls_of_one_attempt_each_get_their_own_seq(agent):
    """Parallel tool calls of one run: each waits for the run lock, then numbers its
    call after the one committed before it (a 500 on the seq's unique constraint
    when the last seq was read with the lock, in the snapshot taken before it)."""
    run = start(agent).run

    def call(i: int):
        return lambda: (
            record_call(
                agent,
                run.pk,
                attempt=1,
                tool="reply",
                kind="effect",
                args={"i": i},
                key=f"reply:{i}",
                key_source="provider",
            ).action
        )

    actions = _race([call(i) for i in range(10)])

    assert [a for a in actions if isinstance(a, Exception)] == []
    assert actions == ["execute"] * 10
    seqs = sorted(Call.objects.filter(run=run).values_list("seq", flat=True))
    assert seqs == list(range(1, 11))


def test_a_first_start_that_loses_the_insert_ignores_its_supersede(agent):
    """api.md: on a new run_key ``supersede`` is ignored, and the other first starts
    get ``already_running``. The loser must not supersede the winner's attempt 1.

    The winner's insert is held uncommitted (this thread's transaction) while the
    other start runs: it finds no run, its insert waits on the unique index, then
    fails when the winner commits: the losing path, every time.
    """
    from django.db import transaction

    outcome: list = []

    def loser() -> None:
        try:
            outcome.append(start_run(agent, "raced-key", supersede=1))
        except Exception as exc:  # the answer under test is an error
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=loser)
    with transaction.atomic():
        winner = start_run(agent, "raced-key")
        thread.start()
        thread.join(timeout=1)  # it is now waiting on our uncommitted row
        assert thread.is_alive()
    thread.join(timeout=30)

    assert winner.created is True
    assert len(outcome) == 1 and isinstance(outcome[0], AlreadyRunning), outcome
    attempts = Attempt.objects.filter(run__run_key="raced-key")
    assert [(a.number, a.status) for a in attempts] == [(1, AttemptStatus.RUNNING)]


def test_an_approval_racing_a_rewriting_replay_never_approves_unseen_content(agent, operator):
    run = start(agent).run
    for round_number in range(8):
        key = f"campaign:{round_number}"
        seen = send(agent, run, key=key, key_source="intent", needs_approval=True, args={"v": 1})
        shown_hash = seen.effect.args_hash

        approval, replay = _race(
            [
                lambda pk=seen.effect.pk, shown=shown_hash: approve_effect(
                    operator, pk, args_hash=shown
                ),
                lambda key=key: send(agent, run, key=key, key_source="intent", args={"v": 2}),
            ]
        )

        assert not isinstance(replay, Exception), replay
        effect = Effect.objects.get(pk=seen.effect.pk)
        if isinstance(approval, StaleArgs):
            # The replay won: the operator is told to look again at v2.
            assert effect.status == EffectStatus.AWAITING_APPROVAL
            assert effect.args == {"v": 2}
            assert replay.action == "wait"
        else:
            assert not isinstance(approval, Exception), approval
            # The approval won: v1, which the operator saw, is what executes; v2 is drift.
            assert effect.args_hash == shown_hash
            assert effect.args == {"v": 1}
            assert replay.action == "execute"
            assert effect.versions.get(number=2).adopted is False
