"""Races on real PostgreSQL connections: the database, not the process, keeps the rules.

Each worker is a thread with its own connection (closed at its end, back to the
pool). Their transactions are proven to overlap (tests/race_helpers.py): a barrier
releases them once every one holds its own session, or they are seen waiting on a
row lock that the test holds from outside Django, all at once, before it lets go.
"""

from __future__ import annotations

import uuid

import httpx
import pytest
from django.db import connection
from fault_helpers import Gunicorn
from lifecycle_helpers import send, start
from race_helpers import (
    Worker,
    pool_room,
    row_locked,
    run_together,
    start_waiting_on,
    wait_for_lock_waiters,
)

from approvals.decisions import approve_effect, mark_effect_done, reject_effect, release_effect
from runs.calls import record_call
from runs.errors import AlreadyRunning, NotAllowed, StaleArgs
from runs.lifecycle import start_run
from runs.models import Attempt, AttemptStatus, AuditEvent, Call, Effect, EffectStatus
from runs.outcomes import claim_effect, complete_effect, reconcile_effect

pytestmark = pytest.mark.django_db(transaction=True)


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

    actions = run_together([call(run) for run in runs])

    # Nobody failed with a unique violation; the losers read the winner's row.
    assert sorted(actions) == ["execute"] + ["wait"] * 19
    effect = Effect.objects.get(agent=agent, key=key)
    assert effect.status == EffectStatus.IN_FLIGHT
    assert Call.objects.filter(effect=effect).count() == 20
    # Rule 2: one claim in the audit log, so the effect ran once.
    assert AuditEvent.objects.filter(effect=effect, verb="claimed").count() == 1


def test_ten_concurrent_restarts_naming_one_attempt_create_one_new_attempt(agent):
    run = start(agent).run

    outcomes = run_together([lambda: start_run(agent, "job-1", supersede=1) for _ in range(10)])

    started = [o for o in outcomes if not isinstance(o, Exception)]
    refused = [o for o in outcomes if isinstance(o, AlreadyRunning)]
    assert (len(started), len(refused)) == (1, 9)
    assert started[0].attempt.number == 2
    assert list(Attempt.objects.filter(run=run).values_list("number", "status")) == [
        (1, AttemptStatus.SUPERSEDED),
        (2, AttemptStatus.RUNNING),
    ]


def test_concurrent_first_starts_of_one_run_key_create_one_run(agent):
    outcomes = run_together([lambda: start_run(agent, "new-key") for _ in range(10)])

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

    actions = run_together([call(i) for i in range(10)])

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

    with pool_room(1), transaction.atomic():
        winner = start_run(agent, "raced-key")
        loser = Worker(lambda: start_run(agent, "raced-key", supersede=1))
        # Proof that it runs the losing path: it waits on our uncommitted row.
        waiting = wait_for_lock_waiters(1, unless=loser.finished.is_set)
        assert waiting == 1, loser.outcome
    outcome = loser.result()

    assert winner.created is True
    assert isinstance(outcome, AlreadyRunning), outcome
    attempts = Attempt.objects.filter(run__run_key="raced-key")
    assert [(a.number, a.status) for a in attempts] == [(1, AttemptStatus.RUNNING)]


def test_an_approval_racing_a_rewriting_replay_never_approves_unseen_content(agent, operator):
    run = start(agent).run
    for round_number in range(8):
        key = f"campaign:{round_number}"
        seen = send(agent, run, key=key, key_source="intent", needs_approval=True, args={"v": 1})
        shown_hash = seen.effect.args_hash

        approval, replay = run_together(
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


# --- Rule 2 on existing effects: every claimable status, claims and replays -------------

SHARED_KEY = "outlook:message:shared"
CLAIMANTS = 6


def _claimable(agent, operator, how: str, key: str = SHARED_KEY) -> tuple[Effect, list]:
    """An effect of one key in a claimable status, that CLAIMANTS other running runs
    recorded a call to (so each may claim it), and how it got there:

    - ``approved``: an operator approved it;
    - ``failed``: the attempt that held it reported it failed (a retry is due);
    - ``released_pending``/``released_approved``: its attempt stopped (unknown), and
      an operator released it; to ``approved`` when it needed approval;
    - ``reconciled_pending``: its attempt stopped, and the agent's own lookup found
      it not done.
    """
    needs_approval = how in ("approved", "released_approved")
    origin = start(agent, f"origin-{key}").run
    effect = send(agent, origin, key=key, needs_approval=needs_approval).effect
    claimants = [start(agent, f"claimant-{i}-{key}").run for i in range(CLAIMANTS)]
    for run in claimants:
        # In flight or awaiting: each call is journaled and waits.
        assert send(agent, run, key=key).action == "wait"
    if needs_approval:
        effect = approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    if how == "released_approved":
        claim_effect(agent, effect.pk, run_id=origin.pk, attempt=1)
    if how == "failed":
        complete_effect(agent, effect.pk, run_id=origin.pk, attempt=1, outcome="failed")
    if how.startswith(("released", "reconciled")):
        start(agent, f"origin-{key}", supersede=1)  # attempt 1 stops: the effect is unknown
        effect.refresh_from_db()
        assert effect.status == EffectStatus.UNKNOWN
    if how.startswith("released"):
        release_effect(operator, effect.pk, args_hash=effect.args_hash, note="not sent")
    if how == "reconciled_pending":
        reconcile_effect(
            agent, effect.pk, run_id=origin.pk, attempt=2, outcome="not_done", evidence="none"
        )
    effect.refresh_from_db()
    expected = "approved" if how in ("approved", "released_approved") else how.split("_")[-1]
    assert effect.status == expected
    return effect, claimants


CLAIMABLE = ["approved", "failed", "released_pending", "released_approved", "reconciled_pending"]


def _exactly_one_execute(effect: Effect, answers: list, claimed_before: int, claimants) -> None:
    assert [a for a in answers if isinstance(a, Exception)] == []
    assert sorted(answers) == ["execute"] + ["wait"] * (len(answers) - 1)
    winner = claimants[answers.index("execute")]
    effect.refresh_from_db()
    assert effect.status == EffectStatus.IN_FLIGHT
    assert effect.claimed_by == {"run_id": str(winner.pk), "attempt": 1}
    # One claim in the audit log: the effect runs once.
    claimed = AuditEvent.objects.filter(effect=effect, verb="claimed").count()
    assert claimed == claimed_before + 1


@pytest.mark.parametrize("how", CLAIMABLE)
def test_concurrent_claims_of_an_existing_effect_give_exactly_one_execute(agent, operator, how):
    effect, claimants = _claimable(agent, operator, how)
    claimed_before = AuditEvent.objects.filter(effect=effect, verb="claimed").count()

    def claim(run):
        return lambda: claim_effect(agent, effect.pk, run_id=run.pk, attempt=1)[1]

    # Every claim waits on the effect's row at once, then they meet it in turn.
    answers = start_waiting_on(Effect, effect.pk, [claim(run) for run in claimants])

    _exactly_one_execute(effect, answers, claimed_before, claimants)


@pytest.mark.parametrize("how", CLAIMABLE)
def test_concurrent_replays_of_an_existing_key_give_exactly_one_execute(agent, operator, how):
    effect, claimants = _claimable(agent, operator, how)
    claimed_before = AuditEvent.objects.filter(effect=effect, verb="claimed").count()
    calls_before = Call.objects.filter(effect=effect).count()

    def replay(run):
        return lambda: send(agent, run, key=SHARED_KEY).action

    answers = start_waiting_on(Effect, effect.pk, [replay(run) for run in claimants])

    _exactly_one_execute(effect, answers, claimed_before, claimants)
    # Rule 1: every replay is journaled against the one effect, none made a second.
    assert Call.objects.filter(effect=effect).count() == calls_before + CLAIMANTS
    assert Effect.objects.filter(agent=agent, key=SHARED_KEY).count() == 1


def test_claims_and_replays_released_by_a_barrier_give_exactly_one_execute(agent, operator):
    """The same race without the held lock: eight rounds, each with its sessions open
    before a barrier lets them go together."""
    for round_number in range(8):
        how = CLAIMABLE[round_number % len(CLAIMABLE)]
        key = f"outlook:message:{round_number}"
        effect, claimants = _claimable(agent, operator, how, key)
        claimed_before = AuditEvent.objects.filter(effect=effect, verb="claimed").count()
        works = [
            (lambda run=run, pk=effect.pk: claim_effect(agent, pk, run_id=run.pk, attempt=1)[1])
            if i % 2
            else (lambda run=run, key=key: send(agent, run, key=key).action)
            for i, run in enumerate(claimants)
        ]

        answers = run_together(works)

        _exactly_one_execute(effect, answers, claimed_before, claimants)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="a server process per request")
def test_claims_and_replays_from_four_server_processes_give_exactly_one_execute(
    agent, operator, tmp_path
):
    """Rule 2 says "from any number of processes": what no process's memory can
    enforce. Four gunicorn sync workers (one request at a time each) serve two claims
    and two replays over HTTP; all four are seen waiting on the effect's row at once,
    so four processes held four requests together."""
    effect, claimants = _claimable(agent, operator, "approved")
    runs = claimants[:4]
    claimed_before = AuditEvent.objects.filter(effect=effect, verb="claimed").count()
    headers = {"Authorization": f"Bearer {agent.token}"}

    with Gunicorn(tmp_path, workers=4) as server:

        def post(path: str, body: dict):
            def work():
                answer = httpx.post(server.url + path, json=body, headers=headers, timeout=60)
                assert answer.status_code in (200, 201), answer.text
                return answer.json()["action"]

            return work

        claim = {"attempt": 1}
        replay = {
            "attempt": 1,
            "tool": "send_email",
            "kind": "effect",
            "args": {"subject": "Hello"},
        }
        replay |= {"key": SHARED_KEY, "key_source": "provider"}
        works = [
            post(f"/api/v1/effects/{effect.pk}/claim", {**claim, "run_id": str(runs[0].pk)}),
            post(f"/api/v1/effects/{effect.pk}/claim", {**claim, "run_id": str(runs[1].pk)}),
            post(f"/api/v1/runs/{runs[2].pk}/calls", replay),
            post(f"/api/v1/runs/{runs[3].pk}/calls", replay),
        ]
        answers = start_waiting_on(Effect, effect.pk, works)

    _exactly_one_execute(effect, answers, claimed_before, runs)


# --- Decisions racing claims: the effect's row lock serialises them -------------------


def _one_after_the_other(effect: Effect, first, second) -> tuple:
    """Start ``first``, wait until it waits on the effect's row (locked here), then
    start ``second`` and wait until both wait; let go. They meet the row in that
    order, each in a transaction that began before the other ended."""
    with pool_room(2), row_locked(Effect, effect.pk):
        one = Worker(first)
        assert wait_for_lock_waiters(1, unless=one.finished.is_set) == 1, one.outcome
        two = Worker(second)
        assert wait_for_lock_waiters(2, unless=two.finished.is_set) == 2, two.outcome
    return one.result(), two.result()


@pytest.mark.parametrize("decision", ["reject", "mark_done"])
def test_a_decision_that_meets_a_claim_first_is_refused_and_changes_nothing(
    agent, operator, decision
):
    """product.md: reject and mark done apply to an approved effect *before it is
    claimed*. A decision that read the effect before the claim committed must not
    overwrite the claim: what runs is never also marked rejected or done."""
    effect, claimants = _claimable(agent, operator, "approved")
    decide = {"reject": reject_effect, "mark_done": mark_effect_done}[decision]

    claimed, decided = _one_after_the_other(
        effect,
        lambda: claim_effect(agent, effect.pk, run_id=claimants[0].pk, attempt=1)[1],
        lambda: decide(operator, effect.pk, args_hash=effect.args_hash, note="no"),
    )

    assert claimed == "execute"
    assert isinstance(decided, NotAllowed) and decided.details == {"status": "in_flight"}
    effect.refresh_from_db()
    assert effect.status == EffectStatus.IN_FLIGHT
    assert effect.decision["verb"] == "approved"
    settled = AuditEvent.objects.filter(effect=effect, new_status__in=["rejected", "done"])
    assert not settled.exists()


def test_a_claim_that_meets_a_rejection_first_is_blocked(agent, operator):
    effect, claimants = _claimable(agent, operator, "approved")

    decided, claimed = _one_after_the_other(
        effect,
        lambda: reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="no"),
        lambda: claim_effect(agent, effect.pk, run_id=claimants[0].pk, attempt=1)[1],
    )

    assert decided.status == EffectStatus.REJECTED
    assert claimed == "blocked"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.REJECTED and effect.claimed_run_id is None


def test_two_operators_approving_at_once_both_count(agent, operator, second_operator):
    """Two of two required approvals, decided at the same moment: neither is lost."""
    run = start(agent).run
    effect = send(agent, run, needs_approval=True, approvals_required=2).effect

    first, second = _one_after_the_other(
        effect,
        lambda: approve_effect(operator, effect.pk, args_hash=effect.args_hash),
        lambda: approve_effect(second_operator, effect.pk, args_hash=effect.args_hash),
    )

    assert not isinstance(first, Exception) and not isinstance(second, Exception)
    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED
    assert sorted(a["by"] for a in effect.current_approvals) == ["olivia", "oscar"]
