"""Recording a call: dedupe on the key, argument versions, what a new version does per status."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import read, send, start, transitions

from approvals.decisions import approve_effect, reject_effect, release_effect
from runs.calls import record_call
from runs.errors import AttemptSuperseded, InvalidRequest, KeyConflict, RunFinished
from runs.lifecycle import finish_run
from runs.models import AuditEvent, Call, Effect, EffectStatus, EffectVersion, Run
from runs.outcomes import complete_effect

pytestmark = pytest.mark.django_db


def _versions(effect):
    return list(effect.versions.order_by("number").values_list("args", "adopted", "author"))


def test_a_read_is_journaled_and_executes_without_an_effect(agent):
    run = start(agent).run

    recorded = read(agent, run)

    assert (recorded.action, recorded.effect) == ("execute", None)
    call = Call.objects.get(run=run)
    assert (call.kind, call.action, call.seq) == ("read", "execute", 1)
    assert not Effect.objects.exists()


def test_a_read_may_not_carry_a_key(agent):
    run = start(agent).run

    with pytest.raises(InvalidRequest):
        record_call(
            agent,
            run.pk,
            attempt=1,
            tool="search",
            kind="read",
            args={},
            key="k",
            key_source="intent",
        )

    assert not Call.objects.exists()


def test_a_key_needs_its_source(agent):
    run = start(agent).run

    with pytest.raises(InvalidRequest):
        send(agent, run, key="campaign:x", key_source=None)


def test_the_first_call_of_a_key_creates_the_effect_and_claims_it(agent):
    run = start(agent).run

    recorded = send(agent, run, args={"subject": "Hi"})

    assert recorded.action == "execute"
    recorded.effect.refresh_from_db()
    assert recorded.effect.status == EffectStatus.IN_FLIGHT
    assert recorded.effect.claimed_by == {"run_id": str(run.pk), "attempt": 1}
    assert recorded.effect.first_claimed_at is not None
    assert _versions(recorded.effect) == [({"subject": "Hi"}, True, "agent:support-bot")]
    # The audit log tells the effect's whole story: recorded pending, then claimed.
    assert transitions(recorded.effect) == [("", "pending"), ("pending", "in_flight")]


def test_unkeyed_effects_are_new_effects_every_time(agent):
    run = start(agent).run

    first = send(agent, run, key=None)
    second = send(agent, run, key=None)

    assert first.action == second.action == "execute"
    assert first.effect.pk != second.effect.pk
    assert Effect.objects.filter(key__isnull=True).count() == 2


def test_a_replay_of_a_done_key_is_skipped_with_the_recorded_result(agent):
    run = start(agent).run
    first = send(agent, run)
    complete_effect(
        agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={"id": "m1"}
    )

    replay = send(agent, run)

    assert replay.action == "skip"
    assert replay.effect.pk == first.effect.pk
    assert replay.effect.result == {"id": "m1"}
    # Rule 1: one effect per key, never a second one.
    assert Effect.objects.count() == 1
    assert Call.objects.filter(run=run).count() == 2


def test_two_runs_woken_by_one_message_share_one_reply_effect(agent):
    run_a = start(agent, "webhook-1").run
    run_b = start(agent, "webhook-2").run

    first = send(agent, run_a)
    second = send(agent, run_b)

    assert first.action == "execute"
    assert second.action == "wait"  # in flight under run A's running attempt
    assert second.effect.pk == first.effect.pk
    assert Effect.objects.count() == 1


def test_keys_live_in_their_agents_namespace(agent, other_agent):
    mine = send(agent, start(agent).run)
    theirs = send(other_agent, start(other_agent).run)

    assert mine.action == theirs.action == "execute"
    assert mine.effect.pk != theirs.effect.pk


def test_the_same_key_for_another_tool_is_a_key_conflict(agent):
    run = start(agent).run
    send(agent, run, tool="send_email")

    with pytest.raises(KeyConflict) as caught:
        send(agent, run, tool="archive_message")

    assert caught.value.details == {"tool": "send_email"}
    # Rule 9: nothing was journaled for the conflicting call.
    assert Call.objects.filter(run=run).count() == 1


def test_a_call_that_needs_approval_waits_with_a_deadline(agent):
    t0 = timezone.now()
    run = start(agent, now=t0).run

    recorded = send(agent, run, needs_approval=True, approval_ttl=600, now=t0)

    assert recorded.action == "wait"
    recorded.effect.refresh_from_db()
    assert recorded.effect.status == EffectStatus.AWAITING_APPROVAL
    assert recorded.effect.approval_expires_at == t0 + timedelta(seconds=600)
    assert recorded.effect.claimed_run is None


def test_the_first_call_declares_the_effect_and_later_calls_cannot_change_it(agent):
    run = start(agent).run
    send(agent, run, needs_approval=True, approvals_required=2, preview="Send to EU")

    replay = send(agent, run, needs_approval=False, preview="other")

    assert replay.action == "wait"
    replay.effect.refresh_from_db()
    assert (replay.effect.needs_approval, replay.effect.approvals_required) == (True, 2)
    assert replay.effect.preview == "Send to EU"


def test_new_arguments_of_an_awaiting_effect_become_current_and_reset_approvals(agent, operator):
    run = start(agent).run
    first = send(agent, run, needs_approval=True, approvals_required=2)
    approve_effect(operator, first.effect.pk, args_hash=first.effect.args_hash)

    replay = send(agent, run, args={"subject": "Hello again"})

    assert replay.action == "wait"
    replay.effect.refresh_from_db()
    assert replay.effect.args == {"subject": "Hello again"}
    assert replay.effect.args_versions == 2
    # Approvals name the version they approved: the new one starts with none.
    assert replay.effect.current_approvals == []
    assert [adopted for _, adopted, _ in _versions(replay.effect)] == [True, True]


def test_an_approved_effect_keeps_its_arguments_and_a_rewritten_replay_is_drift(agent, operator):
    run = start(agent).run
    first = send(agent, run, needs_approval=True, args={"subject": "Winter sale"})
    approve_effect(operator, first.effect.pk, args_hash=first.effect.args_hash)

    replay = send(agent, run, args={"subject": "WINTER SALE!!"})

    # Rule 3: what runs is what the operator saw.
    assert replay.action == "execute"
    replay.effect.refresh_from_db()
    assert replay.effect.args == {"subject": "Winter sale"}
    assert replay.effect.args_hash == first.effect.args_hash
    assert _versions(replay.effect)[-1][:2] == ({"subject": "WINTER SALE!!"}, False)
    # Drift is shown to operators, so it is in the audit log.
    assert AuditEvent.objects.filter(effect=replay.effect, verb="args_drift").count() == 1


@pytest.mark.parametrize("settle", ["in_flight", "done", "unknown"])
def test_a_claimed_effect_never_takes_new_arguments(agent, settle):
    run = start(agent).run
    first = send(agent, run, args={"v": 1})
    if settle == "done":
        complete_effect(agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done")
    elif settle == "unknown":
        run = start(agent, supersede=1).run
    attempt = run.current_attempt

    replay = send(agent, run, attempt=attempt, args={"v": 2})

    replay.effect.refresh_from_db()
    assert replay.effect.args == {"v": 1}
    assert replay.effect.status == settle
    assert replay.action == {"in_flight": "wait", "done": "skip", "unknown": "review"}[settle]
    assert replay.effect.versions.filter(adopted=False).count() == 1


def test_a_failed_effect_takes_the_new_version_and_is_retried_with_it(agent):
    run = start(agent).run
    first = send(agent, run, args={"v": 1})
    complete_effect(
        agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="failed", error="timeout"
    )

    retry = send(agent, run, args={"v": 2})

    assert retry.action == "execute"
    retry.effect.refresh_from_db()
    assert retry.effect.args == {"v": 2}
    assert retry.effect.status == EffectStatus.IN_FLIGHT
    assert retry.effect.error is None  # a retry starts clean; the error is in the audit log
    assert ("failed", "in_flight") in transitions(retry.effect)


def test_a_failed_effect_that_needs_approval_with_new_arguments_asks_again(agent, operator):
    t0 = timezone.now()
    run = start(agent, now=t0).run
    first = send(agent, run, needs_approval=True, args={"v": 1}, now=t0)
    approve_effect(operator, first.effect.pk, args_hash=first.effect.args_hash, now=t0)
    claimed = send(agent, run, args={"v": 1}, now=t0)
    assert claimed.action == "execute"
    complete_effect(agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="failed", now=t0)

    later = t0 + timedelta(hours=30)
    revised = send(agent, run, args={"v": 2}, now=later)

    assert revised.action == "wait"
    revised.effect.refresh_from_db()
    assert revised.effect.status == EffectStatus.AWAITING_APPROVAL
    assert revised.effect.args == {"v": 2}
    assert revised.effect.current_approvals == []
    # A fresh deadline, counted from the revision, not from the first call.
    assert revised.effect.approval_expires_at > later


def test_a_failed_effect_replayed_with_the_same_arguments_is_retried(agent):
    run = start(agent).run
    first = send(agent, run)
    complete_effect(agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="failed")

    retry = send(agent, run)

    assert retry.action == "execute"
    assert retry.effect.args_versions == 1


def test_a_rejected_effect_with_new_arguments_is_a_revision_that_asks_again(agent, operator):
    run = start(agent).run
    first = send(agent, run, needs_approval=True, args={"v": 1})
    reject_effect(operator, first.effect.pk, args_hash=first.effect.args_hash, note="typo")

    same = send(agent, run, args={"v": 1})
    assert same.action == "blocked"

    revised = send(agent, run, args={"v": 2})

    assert revised.action == "wait"
    revised.effect.refresh_from_db()
    assert revised.effect.status == EffectStatus.AWAITING_APPROVAL
    assert revised.effect.args == {"v": 2}
    assert ("rejected", "awaiting_approval") in transitions(revised.effect)


def test_a_finally_rejected_effect_never_asks_again(agent, operator):
    run = start(agent).run
    first = send(agent, run, needs_approval=True, args={"v": 1})
    reject_effect(
        operator, first.effect.pk, args_hash=first.effect.args_hash, note="never", final=True
    )

    revised = send(agent, run, args={"v": 2})

    assert revised.action == "blocked"
    revised.effect.refresh_from_db()
    assert revised.effect.status == EffectStatus.REJECTED
    assert revised.effect.args == {"v": 1}
    assert revised.effect.versions.get(number=2).adopted is False


def test_an_expired_effect_is_blocked_until_a_revision_asks_again(agent):
    t0 = timezone.now()
    run = start(agent, heartbeat_timeout=86_400, now=t0).run
    first = send(agent, run, needs_approval=True, approval_ttl=60, args={"v": 1}, now=t0)

    late = send(agent, run, args={"v": 1}, now=t0 + timedelta(seconds=61))
    assert late.action == "blocked"
    late.effect.refresh_from_db()
    assert late.effect.status == EffectStatus.EXPIRED
    # Expiry is the system's doing, not the agent's.
    assert AuditEvent.objects.get(effect=first.effect, verb="expired").actor == "system"

    revised = send(agent, run, args={"v": 2}, now=t0 + timedelta(seconds=62))

    assert revised.action == "wait"
    revised.effect.refresh_from_db()
    assert revised.effect.status == EffectStatus.AWAITING_APPROVAL
    assert revised.effect.approval_expires_at == t0 + timedelta(seconds=122)


def test_a_released_effect_takes_new_arguments_and_executes_them(agent, operator):
    run = start(agent).run
    first = send(agent, run, args={"v": 1})
    run = start(agent, supersede=1).run
    first.effect.refresh_from_db()
    release_effect(operator, first.effect.pk, args_hash=first.effect.args_hash, note="not sent")

    replay = send(agent, run, attempt=2, args={"v": 2})

    assert replay.action == "execute"
    replay.effect.refresh_from_db()
    assert replay.effect.args == {"v": 2}
    assert replay.effect.claimed_by == {"run_id": str(run.pk), "attempt": 2}


def test_an_effect_left_in_flight_by_a_stopped_attempt_becomes_unknown_on_replay(agent):
    run_a = start(agent, "a").run
    first = send(agent, run_a)
    # Attempt 1 of run A stops by a path that did not settle its effects.
    Run.objects.filter(pk=run_a.pk).update(status="interrupted")
    run_b = start(agent, "b").run

    replay = send(agent, run_b)

    assert replay.action == "review"
    first.effect.refresh_from_db()
    assert first.effect.status == EffectStatus.UNKNOWN
    assert AuditEvent.objects.get(effect=first.effect, verb="outcome_unknown").actor == "system"


def test_a_superseded_attempt_cannot_record_calls(agent):
    run = start(agent).run
    start(agent, supersede=1)

    with pytest.raises(AttemptSuperseded):
        send(agent, run, attempt=1)

    assert not Call.objects.filter(attempt_number=1).exists()


def test_a_finished_run_cannot_record_calls(agent):
    run = start(agent).run
    finish_run(agent, run.pk, attempt=1, outcome="completed")

    with pytest.raises(RunFinished):
        read(agent, run)


def test_calls_are_numbered_in_order_within_each_attempt(agent):
    run = start(agent).run
    read(agent, run)
    send(agent, run)
    start(agent, supersede=1)
    read(agent, run, attempt=2)

    seqs = list(Call.objects.filter(run=run).values_list("attempt_number", "seq"))

    assert seqs == [(1, 1), (1, 2), (2, 1)]


def test_every_adopted_or_drifted_version_is_kept(agent, operator):
    run = start(agent).run
    first = send(agent, run, needs_approval=True, args={"v": 1})
    send(agent, run, args={"v": 2})
    effect = Effect.objects.get(pk=first.effect.pk)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    send(agent, run, args={"v": 3})

    # Rule 5: nothing is lost, including what the model proposed after approval.
    assert list(EffectVersion.objects.filter(effect=effect).values_list("number", "adopted")) == [
        (1, True),
        (2, True),
        (3, False),
    ]


def test_runs_effects_and_calls_get_time_ordered_ids(agent):
    """Version 7: each new id sorts after the ones made before it (runs.models)."""
    first_run, second_run = start(agent, "a").run, start(agent, "b").run
    first = send(agent, first_run, key="k-1").effect
    second = send(agent, first_run, key="k-2").effect
    calls = list(Call.objects.filter(run=first_run).order_by("seq"))

    for made in (first_run, second_run, first, second, *calls):
        assert made.pk.version == 7
    assert first_run.pk < second_run.pk
    assert first.pk < second.pk
    assert [c.pk for c in calls] == sorted(c.pk for c in calls)
