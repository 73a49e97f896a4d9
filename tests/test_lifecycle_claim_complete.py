"""Claiming an effect and reporting its outcome, late reports included (runs/lifecycle.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import send, start, transitions

from approvals.decisions import approve_effect, reject_effect, release_effect
from runs.errors import AttemptSuperseded, ClaimConflict, InvalidRequest, RunFinished
from runs.lifecycle import action_for, finish_run
from runs.models import AuditEvent, EffectStatus
from runs.outcomes import claim_effect, complete_effect
from runs.sweep import sweep

pytestmark = pytest.mark.django_db


def _awaiting(agent, run, **kwargs):
    return send(agent, run, needs_approval=True, **kwargs).effect


def test_claiming_an_approved_effect_executes_it(agent, operator):
    run = start(agent).run
    effect = _awaiting(agent, run)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    effect, action = claim_effect(agent, effect.pk, run_id=run.pk, attempt=1)

    assert action == "execute"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.IN_FLIGHT
    assert effect.claimed_by == {"run_id": str(run.pk), "attempt": 1}
    assert ("approved", "in_flight") in transitions(effect)


def test_a_second_claim_of_an_effect_in_flight_waits(agent, operator):
    run = start(agent).run
    effect = _awaiting(agent, run)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    claim_effect(agent, effect.pk, run_id=run.pk, attempt=1)

    _, action = claim_effect(agent, effect.pk, run_id=run.pk, attempt=1)

    # Rule 2: one execute per claim, a retried claim never executes twice.
    assert action == "wait"
    assert AuditEvent.objects.filter(effect=effect, verb="claimed").count() == 1


def test_a_run_that_never_recorded_the_effect_cannot_claim_it(agent, operator):
    owner = start(agent, "a").run
    stranger = start(agent, "b").run
    effect = _awaiting(agent, owner)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    with pytest.raises(ClaimConflict):
        claim_effect(agent, effect.pk, run_id=stranger.pk, attempt=1)

    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED


def test_a_rejected_effect_is_never_claimed(agent, operator):
    run = start(agent).run
    effect = _awaiting(agent, run)
    reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="no")

    _, action = claim_effect(agent, effect.pk, run_id=run.pk, attempt=1)

    assert action == "blocked"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.REJECTED
    assert effect.first_claimed_at is None


def test_claiming_past_the_deadline_records_the_expiry_and_is_blocked(agent):
    t0 = timezone.now()
    run = start(agent, heartbeat_timeout=3600, now=t0).run
    effect = _awaiting(agent, run, approval_ttl=60, now=t0)

    _, action = claim_effect(
        agent, effect.pk, run_id=run.pk, attempt=1, now=t0 + timedelta(minutes=2)
    )

    assert action == "blocked"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.EXPIRED
    assert AuditEvent.objects.get(effect=effect, verb="expired").actor == "system"


def test_the_poll_action_of_an_awaiting_effect_past_its_deadline_is_blocked(agent):
    t0 = timezone.now()
    run = start(agent, now=t0).run
    effect = _awaiting(agent, run, approval_ttl=60, now=t0)

    assert action_for(effect, t0) == "wait"
    assert action_for(effect, t0 + timedelta(seconds=60)) == "blocked"


def test_a_stopped_attempt_cannot_claim(agent, operator):
    run = start(agent).run
    effect = _awaiting(agent, run)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    start(agent, supersede=1)

    with pytest.raises(AttemptSuperseded):
        claim_effect(agent, effect.pk, run_id=run.pk, attempt=1)


def test_completing_done_records_the_result(agent):
    run = start(agent).run
    effect = send(agent, run).effect

    effect = complete_effect(
        agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": "m1"}
    )

    assert effect.status == EffectStatus.DONE
    effect.refresh_from_db()
    assert effect.result == {"id": "m1"}
    assert transitions(effect)[-1] == ("in_flight", "done")


def test_a_repeated_done_report_keeps_the_first_result(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"n": 1})

    again = complete_effect(
        agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"n": 2}
    )

    assert again.result == {"n": 1}
    assert AuditEvent.objects.filter(effect=effect, verb="completed").count() == 1


def test_a_failed_effect_is_retried_by_the_next_claim(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="failed", error="503")
    effect.refresh_from_db()
    assert (effect.status, effect.error) == (EffectStatus.FAILED, "503")

    _, action = claim_effect(agent, effect.pk, run_id=run.pk, attempt=1)

    assert action == "execute"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.IN_FLIGHT
    # The failure stays in the audit log even though the row starts clean.
    assert AuditEvent.objects.get(effect=effect, verb="completed").note == "503"


def test_an_outcome_other_than_done_or_failed_is_invalid(agent):
    run = start(agent).run
    effect = send(agent, run).effect

    with pytest.raises(InvalidRequest):
        complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="maybe")


def test_a_late_completion_report_is_recorded_after_the_attempt_stopped(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    start(agent, supersede=1)
    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN

    effect = complete_effect(
        agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"sent": True}
    )

    # Rule 5: the truth from the attempt that claimed it is never thrown away.
    assert effect.status == EffectStatus.DONE
    effect.refresh_from_db()
    assert effect.result == {"sent": True}
    event = AuditEvent.objects.get(effect=effect, verb="completed_late")
    assert (event.old_status, event.new_status, event.attempt_number) == ("unknown", "done", 1)


def test_a_late_failure_report_settles_an_unknown_effect_as_failed(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    start(agent, supersede=1)

    effect = complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="failed")

    assert effect.status == EffectStatus.FAILED


def test_a_late_report_after_a_release_is_refused_and_kept_for_operators(agent, operator):
    run = start(agent).run
    effect = send(agent, run).effect
    start(agent, supersede=1)
    effect.refresh_from_db()
    release_effect(operator, effect.pk, args_hash=effect.args_hash, note="provider says no")

    with pytest.raises(ClaimConflict) as caught:
        complete_effect(
            agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": "x"}
        )

    assert caught.value.details == {"status": "pending"}
    effect.refresh_from_db()
    assert effect.status == EffectStatus.PENDING
    # The released effect may have happened after all: operators must see the report.
    late = AuditEvent.objects.get(effect=effect, verb="late_report")
    assert late.data["result"] == {"id": "x"}
    assert late.data["attempt"] == 1


def test_a_report_from_an_attempt_that_does_not_hold_the_claim_is_a_claim_conflict(agent):
    run = start(agent).run
    effect = send(agent, run).effect

    with pytest.raises(ClaimConflict):
        complete_effect(agent, effect.pk, run_id=run.pk, attempt=2, outcome="done")

    effect.refresh_from_db()
    assert effect.status == EffectStatus.IN_FLIGHT
    assert AuditEvent.objects.filter(effect=effect, verb="late_report").count() == 1


def test_a_report_after_the_run_finished_is_run_finished_and_kept(agent):
    run = start(agent).run
    effect = send(agent, run).effect
    finish_run(agent, run.pk, attempt=1, outcome="completed")

    with pytest.raises(RunFinished):
        complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done")

    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN
    assert AuditEvent.objects.filter(effect=effect, verb="late_report").count() == 1


def test_an_effect_in_flight_past_its_timeout_becomes_unknown(agent):
    t0 = timezone.now()
    run = start(agent, heartbeat_timeout=3600, now=t0).run
    effect = send(agent, run, timeout=30, now=t0).effect

    sweep(now=t0 + timedelta(seconds=31))

    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN
    # An effect that timed out can still be settled by its attempt's late report.
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done")
    effect.refresh_from_db()
    assert effect.status == EffectStatus.DONE


def test_a_late_done_report_on_an_effect_a_person_marked_done_is_kept(agent, operator):
    from approvals.decisions import mark_effect_done

    run = start(agent).run
    effect = send(agent, run).effect
    start(agent, supersede=1)
    effect.refresh_from_db()
    mark_effect_done(operator, effect.pk, args_hash=effect.args_hash, note="saw it sent")

    for _ in range(2):  # a retried report is not news
        again = complete_effect(
            agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": "m9"}
        )

    # The person's settlement stands; the agent's own account is kept beside it.
    assert again.status == EffectStatus.DONE
    effect.refresh_from_db()
    assert effect.result is None
    kept = AuditEvent.objects.filter(effect=effect, verb="late_report")
    assert [e.data["result"] for e in kept] == [{"id": "m9"}]


def test_every_change_of_an_effect_bumps_its_revision(agent, operator):
    run = start(agent).run
    effect = send(agent, run, needs_approval=True).effect
    revisions = [effect.revision]
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    effect.refresh_from_db()
    revisions.append(effect.revision)
    claim_effect(agent, effect.pk, run_id=run.pk, attempt=1)
    effect.refresh_from_db()
    revisions.append(effect.revision)
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done")
    effect.refresh_from_db()
    revisions.append(effect.revision)

    # The poll's ETag is built from the revision: every change must show.
    assert revisions == sorted(set(revisions))


def test_recording_a_new_keyed_effect_stays_within_its_query_budget(
    agent, django_assert_max_num_queries
):
    run = start(agent).run

    # 15 today: lock the run, its attempt, the last seq, the key lookup, the key's
    # tombstone lookup (a key pruned earlier comes back with its outcome), a
    # savepoint, the effect insert and its release, the "recorded" audit row, the
    # claim (update and audit row), the call insert, the version insert, and the
    # outer savepoint pair. A regression (a query per effect or per call) shows up
    # here first.
    with django_assert_max_num_queries(15):
        send(agent, run)
