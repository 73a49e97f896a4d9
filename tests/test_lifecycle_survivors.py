"""What a run's start, finish, heartbeat and stop leave behind, in full (runs/lifecycle.py).

``make mutate`` found these unread by the other tests, so each is held here:

- each refusal of the lifecycle (not found, already running, a superseded attempt,
  a bad outcome) answers its error class, its message and its details: the message
  is what a person reads (product.md: errors say what to do), the details what an
  agent acts on;
- a refused finish inside a caller's transaction rolls back only itself (the default
  ``savepoint=True``, the module's docstring): the caller carries on;
- a finish keeps the agent's error on the attempt and as the run's note, and writes
  the run's ``updated_at``;
- stopping a run ends only its current attempt: not its earlier attempts, not another
  run's attempt; it audits, in this order, the attempt's end, each effect it held,
  the run's end, each with its attempt, old and new status and why (the sweep's
  note for each run is that run's own);
- an effect in flight when its attempt stops becomes ``unknown`` as one change of
  the effect (its revision, the poll's ETag, bumped once; its ``updated_at``; no
  ``timeout_at`` left for the sweep), and so does one the sweep times out, with the
  attempt that claimed it on its audit event;
- the audit events of a supersede, an automatic restart and an abandon say why and
  what changed (note, reason, old and new status, attempt);
- a start writes what the agent asked (or the defaults) on the run, and each attempt
  who started it, why, with which agent version and on which verdict; an operator's
  override is consumed by the start it let through;
- a claim starts clean (the earlier error gone, a new timeout from the claim) and
  keeps when the effect was first claimed; an effect awaiting approval expires at
  its deadline, not a microsecond before, by the system, with its decision recorded;
- a refused restart names every blocking reason and starts nothing; the stored
  verdict flag (``verdict_blocked``, the console's filter) is set when a reason
  appears: at a manual run's creation, at the first claim of an unkeyed effect;
- each version of an effect's arguments says what, who, when, from which call and
  whether it was adopted (a replay of a frozen effect is kept as drift); an effect
  awaiting approval with no ttl of its own gets the configured one; one whose tool's
  policy says ``on_expiry: reject`` is rejected (not finally) by the system instead.

The start, claim and expiry tests were written ahead of the mutation run reaching
``start_run``, ``_new_attempt``, ``set_claim`` and ``expire_if_past_deadline`` (the
first run left 15 to 17 survivors in ``_new_attempt`` and in the expiry).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from lifecycle_helpers import send, start

from approvals.decisions import abandon_run, allow_restart
from runs.errors import (
    AlreadyRunning,
    AttemptSuperseded,
    InvalidRequest,
    NotFound,
    RestartBlocked,
    RunFinished,
)
from runs.lifecycle import finish_run, heartbeat, start_run
from runs.models import (
    Attempt,
    AttemptStatus,
    AuditEvent,
    Effect,
    EffectStatus,
    EffectVersion,
    Run,
    RunStatus,
    Tool,
    ToolPolicy,
)
from runs.outcomes import claim_effect, complete_effect
from runs.registry import declare_tools
from runs.sweep import sweep

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
T1 = T0 + timedelta(seconds=10)
T2 = T0 + timedelta(seconds=20)
MICRO = timedelta(microseconds=1)


def _event(verb: str, **filters) -> AuditEvent:
    return AuditEvent.objects.get(verb=verb, **filters)


def _said(event: AuditEvent) -> tuple:
    """What an audit event says happened: the attempt, old -> new status, and why."""
    return (event.attempt_number, event.old_status, event.new_status, event.note)


# --- Refusals ---------------------------------------------------------------------
# Each case makes its rows, then returns the refused call.


def _finish_with_a_bad_outcome(agent, other_agent):
    run = start(agent, now=T0).run
    return lambda: finish_run(agent, run.pk, attempt=1, outcome="done")


def _finish_of_another_agents_run(agent, other_agent):
    run = start(other_agent, now=T0).run
    return lambda: finish_run(agent, run.pk, attempt=1, outcome="completed")


def _heartbeat_of_another_agents_run(agent, other_agent):
    run = start(other_agent, now=T0).run
    return lambda: heartbeat(agent, run.pk, attempt=1, now=T1)


def _heartbeat_of_a_superseded_attempt(agent, other_agent):
    run = start(agent, now=T0).run
    start(agent, supersede=1, now=T0)
    return lambda: heartbeat(agent, run.pk, attempt=1, now=T1)


def _heartbeat_of_an_interrupted_attempt(agent, other_agent):
    run = start(agent, heartbeat_timeout=5, restart_policy="manual", now=T0).run
    sweep(now=T0 + timedelta(seconds=6))
    return lambda: heartbeat(agent, run.pk, attempt=1, now=T1)


def _report_on_an_effect_the_agent_does_not_have(agent, other_agent):
    run = start(agent, now=T0).run
    return lambda: complete_effect(
        agent, uuid.uuid4(), run_id=run.pk, attempt=1, outcome="done", now=T1
    )


def _start_of_a_running_run_without_supersede(agent, other_agent):
    start(agent, now=T0)
    return lambda: start(agent, now=T1)


def _supersede_of_an_attempt_that_is_not_the_current_one(agent, other_agent):
    start(agent, now=T0)
    return lambda: start(agent, supersede=2, now=T1)


def _start_of_a_completed_run(agent, other_agent):
    run = start(agent, now=T0).run
    finish_run(agent, run.pk, attempt=1, outcome="completed", now=T0)
    return lambda: start(agent, now=T1)


def _restart_of_a_manual_run(agent, other_agent):
    run = start(agent, restart_policy="manual", now=T0).run
    finish_run(agent, run.pk, attempt=1, outcome="failed", now=T0)
    return lambda: start(agent, now=T1)


RUNNING_AT_T0 = {"attempt": 1, "heartbeat_at": T0.isoformat()}
MANUAL = "The run's restart policy is manual: a person always decides."

REFUSALS = [
    (
        _finish_with_a_bad_outcome,
        InvalidRequest,
        "outcome must be completed or failed.",
        {"fields": {"outcome": "done"}},
    ),
    (_finish_of_another_agents_run, NotFound, "No such run for this agent.", {}),
    (_heartbeat_of_another_agents_run, NotFound, "No such run for this agent.", {}),
    (
        _heartbeat_of_a_superseded_attempt,
        AttemptSuperseded,
        "Attempt 1 is not the run's current running attempt: stop.",
        {"attempt": 2, "status": RunStatus.RUNNING},
    ),
    (
        _heartbeat_of_an_interrupted_attempt,
        AttemptSuperseded,
        "Attempt 1 is not the run's current running attempt: stop.",
        {"attempt": 1, "status": RunStatus.INTERRUPTED},
    ),
    (_report_on_an_effect_the_agent_does_not_have, NotFound, "No such effect for this agent.", {}),
    (
        _start_of_a_running_run_without_supersede,
        AlreadyRunning,
        "Attempt 1 of this run is running; send supersede with its number to replace it.",
        RUNNING_AT_T0,
    ),
    (
        _supersede_of_an_attempt_that_is_not_the_current_one,
        AlreadyRunning,
        "supersede=2 is not the run's current attempt 1.",
        RUNNING_AT_T0,
    ),
    (
        _start_of_a_completed_run,
        RunFinished,
        "The run is completed: it takes no more starts or attempt requests.",
        {"status": RunStatus.COMPLETED},
    ),
    (
        _restart_of_a_manual_run,
        RestartBlocked,
        f"The restart is not safe: {MANUAL}",
        None,  # the verdict's own shape: checked below
    ),
]


@pytest.mark.parametrize(
    ("case", "error", "message", "details"), REFUSALS, ids=[r[0].__name__[1:] for r in REFUSALS]
)
def test_each_refusal_answers_its_error_message_and_details(
    agent, other_agent, case, error, message, details
):
    refused = case(agent, other_agent)

    with pytest.raises(error) as caught:
        refused()

    assert type(caught.value) is error
    assert caught.value.message == message
    if error is RestartBlocked:
        verdict = caught.value.details["verdict"]
        assert (verdict["safe"], verdict["policy"]) == (False, "manual")
        assert [b["message"] for b in verdict["blocking"]] == [MANUAL]
    else:
        assert caught.value.details == details


def test_a_refused_finish_inside_a_callers_transaction_rolls_back_only_itself(agent):
    run = start(agent, now=T0).run

    with transaction.atomic():  # the caller's (the console's, a test's)
        with pytest.raises(AttemptSuperseded):
            finish_run(agent, run.pk, attempt=2, outcome="completed", now=T1)
        # Still usable: the refusal was a savepoint of its own.
        finish_run(agent, run.pk, attempt=1, outcome="completed", now=T1)

    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED


# --- Finishing and stopping ---------------------------------------------------------


@pytest.mark.parametrize(
    ("outcome", "error"), [(RunStatus.FAILED, "the mailbox is full"), (RunStatus.COMPLETED, None)]
)
def test_a_finish_keeps_the_agents_error_on_the_attempt_and_as_the_runs_note(agent, outcome, error):
    run = start(agent, now=T0).run

    finish_run(agent, run.pk, attempt=1, outcome=outcome, error=error, now=T1)

    attempt = Attempt.objects.get(run=run, number=1)
    assert (attempt.status, attempt.ended_at, attempt.error) == (outcome, T1, error)
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.updated_at) == (outcome, T1)
    said = error or ""
    assert _said(_event(f"attempt_{outcome}", run=run)) == (1, AttemptStatus.RUNNING, outcome, said)
    assert _said(_event(f"run_{outcome}", run=run)) == (1, RunStatus.RUNNING, outcome, said)


def test_stopping_a_run_ends_only_its_current_attempt_not_earlier_ones_nor_another_runs(
    agent,
):
    run = start(agent, "job-a", now=T0).run
    start(agent, "job-a", supersede=1, now=T1)
    other = start(agent, "job-b", now=T0).run

    finish_run(agent, run.pk, attempt=2, outcome="completed", now=T2)

    ended = {a.number: (a.status, a.ended_at) for a in Attempt.objects.filter(run=run)}
    assert ended == {1: (AttemptStatus.SUPERSEDED, T1), 2: (AttemptStatus.COMPLETED, T2)}
    untouched = Attempt.objects.get(run=other, number=1)
    assert (untouched.status, untouched.ended_at) == (AttemptStatus.RUNNING, None)


def test_an_effect_in_flight_when_its_attempt_stops_becomes_unknown_as_one_change(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, timeout=300, now=T0).effect
    before = Effect.objects.get(pk=effect.pk)
    assert before.status == EffectStatus.IN_FLIGHT
    assert before.timeout_at == T0 + timedelta(seconds=300)

    finish_run(agent, run.pk, attempt=1, outcome="failed", now=T1)

    after = Effect.objects.get(pk=effect.pk)
    assert after.status == EffectStatus.UNKNOWN
    assert after.revision == before.revision + 1
    assert after.updated_at == T1
    assert after.timeout_at is None  # nothing left for the sweep to time out


def test_a_stop_audits_the_attempt_then_each_effect_it_held_then_the_run(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, now=T0).effect

    start(agent, supersede=1, now=T1)

    stop = ["attempt_superseded", "outcome_unknown", "run_interrupted"]
    events = list(AuditEvent.objects.filter(at=T1, verb__in=stop).order_by("id"))
    assert [e.verb for e in events] == stop
    assert [_said(e) for e in events] == [
        (1, AttemptStatus.RUNNING, AttemptStatus.SUPERSEDED, ""),
        (
            1,
            EffectStatus.IN_FLIGHT,
            EffectStatus.UNKNOWN,
            "Attempt 1 ended superseded while it was in flight.",
        ),
        (1, RunStatus.RUNNING, RunStatus.INTERRUPTED, "superseded by a new start"),
    ]
    assert (events[0].run_id, events[1].effect_id, events[2].run_id) == (run.pk, effect.pk, run.pk)


def test_the_sweep_says_of_each_run_it_interrupts_since_when_it_was_silent(agent):
    first = start(agent, "job-a", heartbeat_timeout=5, now=T0).run
    second = start(agent, "job-b", heartbeat_timeout=5, now=T0).run
    heartbeat(agent, second.pk, attempt=1, now=T0 + timedelta(seconds=1))

    sweep(now=T0 + timedelta(seconds=60))  # one batch stops both

    for run, silent_since in [(first, T0), (second, T0 + timedelta(seconds=1))]:
        event = _event("run_interrupted", run=run)
        assert event.note == f"No heartbeat since {silent_since.isoformat()}."


def test_an_effect_the_sweep_times_out_is_unknown_under_the_attempt_that_claimed_it(agent):
    run = start(agent, heartbeat_timeout=86_400, now=T0).run
    start(agent, supersede=1, now=T0)
    effect = send(agent, run, attempt=2, timeout=5, now=T0).effect

    sweep(now=T0 + timedelta(seconds=6))

    event = _event("outcome_unknown", effect=effect)
    assert event.attempt_number == 2
    assert (event.old_status, event.new_status) == (EffectStatus.IN_FLIGHT, EffectStatus.UNKNOWN)


# --- Why it happened: the audit events of a supersede, a restart, an abandon --------


def test_a_superseding_start_says_why_it_interrupted_the_run(agent):
    run = start(agent, now=T0).run

    start(agent, supersede=1, now=T1)

    interrupted = _event("run_interrupted", run=run)
    assert interrupted.note == "superseded by a new start"
    assert (interrupted.attempt_number, interrupted.new_status) == (1, RunStatus.INTERRUPTED)


def test_a_start_of_a_run_the_sweep_handed_back_says_so(agent):
    run = start(agent, heartbeat_timeout=5, now=T0).run
    sweep(now=T0 + timedelta(seconds=6))  # safe and keyed: handed back

    started = start(agent, now=T1)

    reason = "handed back to its runtime: the verdict was safe"
    assert (started.attempt.started_by, started.attempt.reason) == ("auto", reason)
    assert Attempt.objects.get(run=run, number=2).reason == reason
    assert _event("attempt_started", run=run, attempt_number=2).note == reason


def test_abandoning_a_run_records_the_change_of_its_status_in_full(agent, operator):
    run = start(agent, now=T0).run
    start(agent, supersede=1, now=T0)
    finish_run(agent, run.pk, attempt=2, outcome="failed", error="boom", now=T0)

    abandon_run(operator, run.pk, note="given up", now=T1)

    abandoned = _event("run_abandoned", run=run)
    assert (abandoned.old_status, abandoned.new_status) == (RunStatus.FAILED, RunStatus.ABANDONED)
    assert (abandoned.attempt_number, abandoned.note) == (2, "given up")
    assert (abandoned.actor, abandoned.at) == (operator.get_username(), T1)


# --- What a start writes: the run, its attempt, the attempt_started event -----------


def test_a_first_start_writes_the_run_and_attempt_1_as_the_agent_asked(agent):
    started = start(
        agent,
        "ticket-7",
        title="Reply to ticket 7",
        input={"ticket": 7},
        restart_policy="manual",
        heartbeat_timeout=30,
        restart_url="https://runtime.example/restart",
        agent_version="v1",
        now=T0,
    )

    assert started.created is True
    # The answer's verdict: a manual run is blocked from its creation.
    assert (started.verdict.safe, started.verdict.policy) == (False, "manual")
    run = Run.objects.get(pk=started.run.pk)
    assert (run.agent, run.run_key, run.title, run.input) == (
        agent,
        "ticket-7",
        "Reply to ticket 7",
        {"ticket": 7},
    )
    assert (run.restart_policy, run.heartbeat_timeout, run.restart_url) == (
        "manual",
        30,
        "https://runtime.example/restart",
    )
    assert (run.status, run.current_attempt, run.restart_ready) == (RunStatus.RUNNING, 1, False)
    assert (run.heartbeat_at, run.stale_at) == (T0, T0 + timedelta(seconds=30))
    assert (run.created_at, run.updated_at) == (T0, T0)
    attempt = Attempt.objects.get(run=run)
    assert (attempt.number, attempt.status, attempt.started_at, attempt.ended_at) == (
        1,
        AttemptStatus.RUNNING,
        T0,
        None,
    )
    assert (attempt.started_by, attempt.reason, attempt.agent_version) == (
        "agent",
        "first start",
        "v1",
    )
    assert attempt.verdict_at_start is None
    event = _event("attempt_started", run=run)
    assert _said(event) == (1, "", RunStatus.RUNNING, "first start")
    assert (event.actor, event.at) == (f"agent:{agent.name}", T0)
    assert event.data == {"started_by": "agent", "agent_version": "v1"}


def test_a_first_start_without_options_takes_the_defaults(agent):
    run = start_run(agent, "job-1", now=T0).run

    run = Run.objects.get(pk=run.pk)
    assert (run.title, run.input, run.restart_policy) == ("", {}, "keyed")
    assert (run.heartbeat_timeout, run.restart_url) == (60, None)
    assert Attempt.objects.get(run=run).agent_version is None


@pytest.mark.parametrize("ended", ["failed", "superseded"])
def test_a_restart_writes_the_next_attempt_with_the_verdict_it_started_on(agent, ended):
    run = start(agent, heartbeat_timeout=30, agent_version="v1", now=T0).run
    if ended == "failed":
        finish_run(agent, run.pk, attempt=1, outcome="failed", now=T1)
        started = start(agent, agent_version="v2", now=T2)
        reason, was = "restart after attempt 1 ended failed", RunStatus.FAILED
    else:
        started = start(agent, supersede=1, agent_version="v2", now=T2)
        reason, was = "superseded attempt 1", RunStatus.INTERRUPTED

    assert started.created is False
    assert started.verdict.safe is True
    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.current_attempt, run.restart_ready) == (RunStatus.RUNNING, 2, False)
    assert (run.heartbeat_at, run.stale_at, run.updated_at) == (
        T2,
        T2 + timedelta(seconds=30),
        T2,
    )
    attempt = Attempt.objects.get(run=run, number=2)
    assert (attempt.status, attempt.started_at, attempt.started_by, attempt.reason) == (
        AttemptStatus.RUNNING,
        T2,
        "agent",
        reason,
    )
    assert attempt.agent_version == "v2"
    assert attempt.verdict_at_start == started.verdict.as_dict()
    assert attempt.verdict_at_start["safe"] is True
    event = _event("attempt_started", run=run, attempt_number=2)
    assert _said(event) == (2, was, RunStatus.RUNNING, reason)
    assert event.data == {"started_by": "agent", "agent_version": "v2"}


def test_a_start_an_operator_allowed_names_them_and_consumes_the_override(agent, operator):
    run = start(agent, restart_policy="manual", now=T0).run
    finish_run(agent, run.pk, attempt=1, outcome="failed", now=T0)
    allow_restart(operator, run.pk, note="checked the outbox", now=T1)

    started = start(agent, now=T2)

    name = operator.get_username()
    reason = f"allowed by {name}: checked the outbox"
    assert (started.attempt.started_by, started.attempt.reason) == (f"operator:{name}", reason)
    run = Run.objects.get(pk=run.pk)
    assert (run.override_by, run.override_at, run.override_note) == (None, None, "")
    assert (run.status, run.restart_ready) == (RunStatus.RUNNING, False)
    assert started.verdict.override is None  # the verdict now: no override waiting
    event = _event("attempt_started", run=run, attempt_number=2)
    assert event.data == {"started_by": f"operator:{name}", "agent_version": None}


# --- A claim and an expiry (set_claim, expire_if_past_deadline, save_effect) --------


def test_a_claim_again_by_a_later_attempt_starts_clean_and_keeps_the_first_claim_time(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, timeout=10, now=T0).effect  # claimed by attempt 1 at T0
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="failed", error="smtp down")
    start(agent, supersede=1, now=T1)
    before = Effect.objects.get(pk=effect.pk)
    assert (before.status, before.error) == (EffectStatus.FAILED, "smtp down")

    claimed, action = claim_effect(agent, effect.pk, run_id=run.pk, attempt=2, now=T2)

    assert action == "execute"
    after = Effect.objects.get(pk=effect.pk)
    assert (after.status, after.claimed_run_id, after.claimed_attempt) == (
        EffectStatus.IN_FLIGHT,
        run.pk,
        2,
    )
    assert (after.claimed_at, after.first_claimed_at) == (T2, T0)
    assert after.timeout_at == T2 + timedelta(seconds=10)
    assert after.error is None  # the earlier failure stays in the audit log only
    assert (after.revision, after.updated_at) == (before.revision + 1, T2)
    event = AuditEvent.objects.filter(effect=effect, verb="claimed").latest("id")
    assert _said(event) == (2, EffectStatus.FAILED, EffectStatus.IN_FLIGHT, "")
    assert (event.run_id, event.actor, event.at) == (run.pk, f"agent:{agent.name}", T2)


def test_a_claim_of_an_effect_without_a_timeout_sets_none(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, now=T0).effect
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="failed")

    claim_effect(agent, effect.pk, run_id=run.pk, attempt=1, now=T1)

    after = Effect.objects.get(pk=effect.pk)
    assert (after.status, after.claimed_at, after.timeout_at) == (EffectStatus.IN_FLIGHT, T1, None)


@pytest.mark.parametrize(
    ("after", "expired"), [(timedelta(seconds=60), True), (timedelta(seconds=60) - MICRO, False)]
)
def test_an_effect_awaiting_approval_expires_at_its_deadline_by_the_system(agent, after, expired):
    run = start(agent, now=T0).run
    effect = send(agent, run, needs_approval=True, approval_ttl=60, now=T0).effect
    before = Effect.objects.get(pk=effect.pk)
    now = T0 + after

    claimed, action = claim_effect(agent, effect.pk, run_id=run.pk, attempt=1, now=now)

    stored = Effect.objects.get(pk=effect.pk)
    if not expired:
        assert (action, stored.status, stored.revision) == (
            "wait",
            EffectStatus.AWAITING_APPROVAL,
            before.revision,
        )
        return
    assert (action, stored.status) == ("blocked", EffectStatus.EXPIRED)
    assert (stored.revision, stored.updated_at) == (before.revision + 1, now)
    assert stored.decision == {
        "verb": "expired",
        "by": "system",
        "at": now.isoformat(),
        "note": "No decision before the deadline.",
        "args_hash": effect.args_hash,
        "final": False,
    }
    event = _event("expired", effect=effect)
    assert (event.actor, event.actor_kind, event.at) == ("system", "system", now)
    assert (event.old_status, event.new_status) == (
        EffectStatus.AWAITING_APPROVAL,
        EffectStatus.EXPIRED,
    )


def test_a_restart_blocked_for_several_reasons_names_each_and_starts_nothing(agent):
    run = start(agent, now=T0).run
    send(agent, run, key=None, tool="refund", now=T0)
    send(agent, run, key=None, tool="charge", now=T0)
    finish_run(agent, run.pk, attempt=1, outcome="failed", now=T0)

    with pytest.raises(RestartBlocked) as caught:
        start(agent, now=T1)

    unkeyed = "An unkeyed effect of {} was started: nothing could deduplicate it on replay."
    reasons = [unkeyed.format("refund"), unkeyed.format("charge")]
    assert caught.value.message == "The restart is not safe: " + " ".join(reasons)
    assert [b["message"] for b in caught.value.details["verdict"]["blocking"]] == reasons
    stored = Run.objects.get(pk=run.pk)
    assert (stored.status, stored.current_attempt) == (RunStatus.FAILED, 1)
    assert Attempt.objects.filter(run=run).count() == 1


@pytest.mark.parametrize(
    ("policy", "key", "blocked"),
    [
        ("manual", "outlook:message:1", True),  # from its creation
        ("keyed", None, True),  # from the first claim of an unkeyed effect
        ("keyed", "outlook:message:1", False),
    ],
)
def test_the_stored_verdict_flag_is_set_when_a_blocking_reason_appears(agent, policy, key, blocked):
    run = start(agent, restart_policy=policy, now=T0).run
    assert Run.objects.get(pk=run.pk).verdict_blocked is (policy == "manual")

    send(agent, run, key=key, now=T0)

    assert Run.objects.get(pk=run.pk).verdict_blocked is blocked


# --- Argument versions (add_version) and the default deadline ------------------------


def test_each_version_of_an_effects_arguments_says_what_who_when_and_whether_adopted(agent):
    run = start(agent, now=T0).run
    first = send(agent, run, needs_approval=True, args={"to": "a"}, now=T0)
    revised = send(agent, run, needs_approval=True, args={"to": "b"}, now=T1)  # adopted
    effect = first.effect

    versions = list(EffectVersion.objects.filter(effect=effect).order_by("number"))
    assert [(v.number, v.args, v.adopted, v.at) for v in versions] == [
        (1, {"to": "a"}, True, T0),
        (2, {"to": "b"}, True, T1),
    ]
    assert [v.call_id for v in versions] == [first.call.pk, revised.call.pk]
    assert [v.author for v in versions] == [f"agent:{agent.name}"] * 2
    assert versions[0].args_hash == first.effect.args_hash != versions[1].args_hash
    assert versions[1].args_hash == Effect.objects.get(pk=effect.pk).args_hash
    event = _event("args_revised", effect=effect)
    awaiting = EffectStatus.AWAITING_APPROVAL
    assert _said(event) == (1, awaiting, awaiting, "")
    assert (event.run_id, event.at, event.data) == (
        run.pk,
        T1,
        {"args_hash": versions[1].args_hash},
    )


def test_a_replay_with_other_arguments_of_an_effect_in_flight_is_kept_as_drift(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, args={"to": "a"}, now=T0).effect  # claimed: frozen
    replay = send(agent, run, args={"to": "b"}, now=T1)

    drift = EffectVersion.objects.get(effect=effect, number=2)
    assert (drift.args, drift.adopted, drift.call_id, drift.at) == (
        {"to": "b"},
        False,
        replay.call.pk,
        T1,
    )
    assert drift.args_hash == replay.call.args_hash != effect.args_hash
    stored = Effect.objects.get(pk=effect.pk)
    assert (stored.args, stored.status, stored.revision) == (
        {"to": "a"},
        "in_flight",
        effect.revision + 1,
    )
    event = _event("args_drift", effect=effect)
    assert event.data == {"args_hash": drift.args_hash, "current_args_hash": effect.args_hash}
    assert (event.run_id, event.attempt_number, event.at) == (run.pk, 1, T1)


def test_an_effect_awaiting_approval_without_a_ttl_gets_the_configured_one(agent, settings):
    run = start(agent, now=T0).run

    effect = send(agent, run, needs_approval=True, now=T0).effect

    ttl = settings.STARTSAFE["APPROVAL_TTL"]
    stored = Effect.objects.get(pk=effect.pk)
    assert (stored.approval_ttl, stored.approval_expires_at) == (ttl, T0 + timedelta(seconds=ttl))


def test_an_effect_whose_tools_policy_rejects_on_expiry_is_rejected_at_its_deadline(agent):
    declare_tools(agent, [{"name": "send_campaign", "kind": "effect"}])
    ToolPolicy.objects.create(
        tool=Tool.objects.get(agent=agent, name="send_campaign"),
        updated_at=T0,
        needs_approval=True,
        approval_ttl=60,
        on_expiry="reject",
    )
    run = start(agent, now=T0).run
    effect = send(agent, run, tool="send_campaign", now=T0).effect
    before = Effect.objects.get(pk=effect.pk)
    now = T0 + timedelta(seconds=60)

    claimed, action = claim_effect(agent, effect.pk, run_id=run.pk, attempt=1, now=now)

    note = "No decision before the deadline: the tool's policy rejects."
    stored = Effect.objects.get(pk=effect.pk)
    assert (action, stored.status) == ("blocked", EffectStatus.REJECTED)
    assert (stored.revision, stored.updated_at) == (before.revision + 1, now)
    assert stored.decision == {
        "verb": "rejected",
        "by": "system",
        "at": now.isoformat(),
        "note": note,
        "args_hash": effect.args_hash,
        "final": False,  # a revision asks again
    }
    event = _event("rejected", effect=effect)
    assert (event.actor, event.at, event.note) == ("system", now, note)
    assert (event.old_status, event.new_status) == (
        EffectStatus.AWAITING_APPROVAL,
        EffectStatus.REJECTED,
    )
    assert not AuditEvent.objects.filter(effect=effect, verb="expired").exists()
