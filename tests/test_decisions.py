"""People's decisions on effects and runs (approvals/decisions.py, product.md's action table)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import send, start, transitions

from approvals.decisions import (
    abandon_run,
    allow_restart,
    approve_effect,
    mark_effect_done,
    reject_effect,
    release_effect,
)
from approvals.models import Approval
from runs.errors import Forbidden, InvalidRequest, NotAllowed, NotFound, RunFinished, StaleArgs
from runs.lifecycle import finish_run
from runs.models import AuditEvent, EffectStatus, EffectVersion, RunStatus
from runs.outcomes import complete_effect
from runs.verdict import restart_verdict

pytestmark = pytest.mark.django_db


def _awaiting(agent, run=None, **kwargs):
    run = run or start(agent).run
    return send(agent, run, needs_approval=True, **kwargs).effect


def _unknown(agent, **kwargs):
    run = start(agent).run
    effect = send(agent, run, **kwargs).effect
    start(agent, supersede=1)
    effect.refresh_from_db()
    return effect


def test_a_viewer_may_not_decide(agent, viewer):
    effect = _awaiting(agent)

    with pytest.raises(Forbidden):
        approve_effect(viewer, effect.pk, args_hash=effect.args_hash)

    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert not Approval.objects.exists()


def test_a_deactivated_operator_may_not_decide(agent, outsider):
    effect = _awaiting(agent)

    with pytest.raises(Forbidden):
        reject_effect(outsider, effect.pk, args_hash=effect.args_hash, note="no")

    effect.refresh_from_db()
    assert (effect.status, effect.decision) == (EffectStatus.AWAITING_APPROVAL, None)


def test_a_missing_args_hash_or_note_is_invalid_before_permission_is_checked(agent, viewer):
    effect = _awaiting(agent)

    # The console answers 400 first, whoever asks (product.md).
    with pytest.raises(InvalidRequest):
        approve_effect(viewer, effect.pk, args_hash="")
    with pytest.raises(InvalidRequest):
        reject_effect(viewer, effect.pk, args_hash=effect.args_hash, note="  ")
    with pytest.raises(InvalidRequest):
        approve_effect(viewer, effect.pk, args_hash=effect.args_hash, edited_args=["not", "obj"])


def test_a_missing_effect_is_not_found(operator):
    import uuid

    with pytest.raises(NotFound):
        approve_effect(operator, uuid.uuid4(), args_hash="x")


def test_an_approval_of_the_version_seen_approves_it(agent, operator):
    effect = _awaiting(agent)

    effect = approve_effect(operator, effect.pk, args_hash=effect.args_hash, note="ok")

    assert effect.status == EffectStatus.APPROVED
    effect.refresh_from_db()
    assert effect.decision["by"] == "olivia"
    assert effect.decision["args_hash"] == effect.args_hash
    assert Approval.objects.get(effect=effect).args_hash == effect.args_hash
    # The audit log names the operator and the transition.
    event = AuditEvent.objects.get(effect=effect, verb="approved")
    assert (event.actor, event.actor_kind, event.old_status, event.new_status) == (
        "olivia",
        "operator",
        "awaiting_approval",
        "approved",
    )


def test_an_approval_for_a_stale_hash_is_refused(agent, operator):
    run = start(agent).run
    effect = _awaiting(agent, run, args={"v": 1})
    seen = effect.args_hash
    send(agent, run, args={"v": 2})

    with pytest.raises(StaleArgs) as caught:
        approve_effect(operator, effect.pk, args_hash=seen)

    effect.refresh_from_db()
    assert caught.value.details["args_hash"] == effect.args_hash
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert not Approval.objects.exists()


def test_an_approval_past_the_deadline_records_the_expiry_by_the_system(agent, operator):
    t0 = timezone.now()
    run = start(agent, now=t0).run
    effect = _awaiting(agent, run, approval_ttl=60, now=t0)

    with pytest.raises(NotAllowed):
        approve_effect(
            operator, effect.pk, args_hash=effect.args_hash, now=t0 + timedelta(seconds=61)
        )

    effect.refresh_from_db()
    assert effect.status == EffectStatus.EXPIRED
    # The refusal does not roll back the expiry: it is a fact, recorded by the system.
    event = AuditEvent.objects.get(effect=effect, verb="expired")
    assert (event.actor, event.actor_kind) == ("system", "system")
    assert not AuditEvent.objects.filter(effect=effect, verb="approved").exists()


@pytest.mark.parametrize("status", ["in_flight", "done", "rejected"])
def test_an_approval_outside_awaiting_is_not_allowed(agent, operator, status):
    run = start(agent).run
    if status == "rejected":
        effect = _awaiting(agent, run)
        reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="no")
    else:
        effect = send(agent, run).effect
        if status == "done":
            complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done")

    with pytest.raises(NotAllowed) as caught:
        approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    assert caught.value.details["status"] == status


def test_two_approvals_need_two_distinct_operators(agent, operator, second_operator):
    effect = _awaiting(agent, approvals_required=2)

    effect = approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert [a["by"] for a in effect.current_approvals] == ["olivia"]

    with pytest.raises(NotAllowed):
        approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    effect = approve_effect(second_operator, effect.pk, args_hash=effect.args_hash)
    assert effect.status == EffectStatus.APPROVED
    effect.refresh_from_db()
    assert [a["by"] for a in effect.current_approvals] == ["olivia", "oscar"]
    assert list(AuditEvent.objects.filter(effect=effect).values_list("verb", flat=True)) == [
        "approved",
        "approval_added",
        "recorded",
    ]


def test_approvals_of_an_older_version_stop_counting(agent, operator, second_operator):
    run = start(agent).run
    effect = _awaiting(agent, run, approvals_required=2, args={"v": 1})
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    send(agent, run, args={"v": 2})
    effect.refresh_from_db()

    effect = approve_effect(second_operator, effect.pk, args_hash=effect.args_hash)

    # Olivia approved v1, not v2: one approval of the current version is not enough.
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert [a["by"] for a in effect.current_approvals] == ["oscar"]


def test_an_operator_can_approve_again_when_the_arguments_come_back_to_a_version(
    agent, operator, second_operator
):
    run = start(agent).run
    effect = _awaiting(agent, run, approvals_required=2, args={"v": 1})
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    send(agent, run, args={"v": 2})
    send(agent, run, args={"v": 1})
    effect.refresh_from_db()
    assert effect.current_approvals == []

    # v3 has v1's content, but it is a new version: Olivia must be able to approve it.
    effect = approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    effect = approve_effect(second_operator, effect.pk, args_hash=effect.args_hash)

    assert effect.status == EffectStatus.APPROVED


def test_an_approval_with_edits_is_a_version_by_the_operator_and_resets_approvals(
    agent, operator, second_operator
):
    effect = _awaiting(agent, approvals_required=2, args={"subject": "Wintr sale"})
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    seen = effect.args_hash

    effect = approve_effect(
        second_operator,
        effect.pk,
        args_hash=seen,
        note="fixed the typo",
        edited_args={"subject": "Winter sale"},
    )

    # The edit restarts the count: only Oscar approved the edited version.
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    effect.refresh_from_db()
    assert effect.args == {"subject": "Winter sale"}
    assert [a["by"] for a in effect.current_approvals] == ["oscar"]
    version = EffectVersion.objects.get(effect=effect, number=2)
    assert (version.author, version.adopted) == ("operator:oscar", True)
    # The diff is kept: the audit log names both hashes.
    edit = AuditEvent.objects.get(effect=effect, verb="args_edited")
    assert edit.data["previous_args_hash"] == seen

    effect = approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    assert effect.status == EffectStatus.APPROVED


def test_the_agent_executes_the_args_the_operator_edited(agent, operator):
    run = start(agent).run
    effect = _awaiting(agent, run, args={"subject": "Wintr"})
    approve_effect(
        operator, effect.pk, args_hash=effect.args_hash, edited_args={"subject": "Winter"}
    )

    replay = send(agent, run, args={"subject": "Wintr"})

    assert replay.action == "execute"
    assert replay.effect.args == {"subject": "Winter"}


def test_a_rejection_is_not_final_unless_said_so(agent, operator):
    effect = _awaiting(agent)

    effect = reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="wrong segment")

    assert effect.status == EffectStatus.REJECTED
    effect.refresh_from_db()
    assert effect.decision["final"] is False
    assert AuditEvent.objects.get(effect=effect, verb="rejected").note == "wrong segment"


def test_an_approved_effect_can_still_be_rejected_before_it_is_claimed(agent, operator):
    effect = _awaiting(agent)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    effect = reject_effect(
        operator, effect.pk, args_hash=effect.args_hash, note="changed my mind", final=True
    )

    assert effect.status == EffectStatus.REJECTED
    assert effect.decision["final"] is True


def test_an_unknown_effect_can_be_rejected(agent, operator):
    effect = _unknown(agent)

    effect = reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="do not retry")

    assert effect.status == EffectStatus.REJECTED
    assert transitions(effect)[-1] == ("unknown", "rejected")


@pytest.mark.parametrize("status", ["in_flight", "done"])
def test_a_claimed_or_done_effect_cannot_be_rejected(agent, operator, status):
    run = start(agent).run
    effect = send(agent, run).effect
    if status == "done":
        complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done")

    with pytest.raises(NotAllowed):
        reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="no")

    effect.refresh_from_db()
    assert effect.status == status


@pytest.mark.parametrize("status", ["awaiting_approval", "approved", "failed", "unknown"])
def test_mark_done_settles_an_effect_with_the_note_and_result(agent, operator, status):
    if status == "unknown":
        effect = _unknown(agent)
    else:
        run = start(agent).run
    if status in ("awaiting_approval", "approved"):
        effect = _awaiting(agent, run)
        if status == "approved":
            approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    elif status == "failed":
        effect = send(agent, run).effect
        complete_effect(
            agent, effect.pk, run_id=run.pk, attempt=1, outcome="failed", error="smtp 421"
        )
    effect.refresh_from_db()
    assert effect.status == status

    effect = mark_effect_done(
        operator, effect.pk, args_hash=effect.args_hash, note="sent by hand", result={"n": 1}
    )

    assert effect.status == EffectStatus.DONE
    effect.refresh_from_db()
    assert effect.result == {"n": 1}
    assert effect.decision["note"] == "sent by hand"
    assert transitions(effect)[-1] == (status, "done")
    # Done is its outcome: no failure shown with it (the failure stays in the audit log).
    assert effect.error is None
    if status == "failed":
        assert AuditEvent.objects.filter(effect=effect, verb="completed", note="smtp 421").exists()


def test_an_effect_in_flight_cannot_be_marked_done(agent, operator):
    effect = send(agent, start(agent).run).effect

    with pytest.raises(NotAllowed):
        mark_effect_done(operator, effect.pk, args_hash=effect.args_hash, note="x")


def test_done_never_leaves_done(agent, operator):
    run = start(agent).run
    effect = send(agent, run).effect
    complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done")

    for decide in (reject_effect, release_effect, mark_effect_done):
        with pytest.raises(NotAllowed):
            decide(operator, effect.pk, args_hash=effect.args_hash, note="x")
    with pytest.raises(NotAllowed):
        approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    effect.refresh_from_db()
    assert effect.status == EffectStatus.DONE


def test_releasing_an_unknown_effect_makes_it_pending_again(agent, operator):
    effect = _unknown(agent)

    effect = release_effect(operator, effect.pk, args_hash=effect.args_hash, note="not sent")

    assert effect.status == EffectStatus.PENDING
    effect.refresh_from_db()
    assert effect.claimed_run is None
    assert AuditEvent.objects.get(effect=effect, verb="released").actor == "olivia"


def test_releasing_an_unknown_effect_that_needed_approval_makes_it_approved(agent, operator):
    run = start(agent).run
    effect = _awaiting(agent, run)
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    send(agent, run)
    start(agent, supersede=1)
    effect.refresh_from_db()

    effect = release_effect(operator, effect.pk, args_hash=effect.args_hash, note="not sent")

    assert effect.status == EffectStatus.APPROVED


def test_only_an_unknown_effect_can_be_released(agent, operator):
    effect = _awaiting(agent)

    with pytest.raises(NotAllowed):
        release_effect(operator, effect.pk, args_hash=effect.args_hash, note="x")


def test_allow_restart_needs_a_stopped_run(agent, operator):
    run = start(agent).run

    with pytest.raises(NotAllowed) as caught:
        allow_restart(operator, run.pk, note="go")

    assert caught.value.details == {"status": "running"}
    run.refresh_from_db()
    assert run.override_at is None


def test_allow_restart_leaves_an_override_and_marks_the_run_ready(agent, operator):
    run = start(agent).run
    finish_run(agent, run.pk, attempt=1, outcome="failed")

    run = allow_restart(operator, run.pk, note="looked at it")

    run.refresh_from_db()
    assert (run.restart_ready, run.override_by, run.override_note) == (
        True,
        operator,
        "looked at it",
    )
    assert AuditEvent.objects.get(run=run, verb="restart_allowed").actor == "olivia"


def test_a_viewer_may_not_allow_a_restart(agent, viewer):
    run = start(agent).run
    finish_run(agent, run.pk, attempt=1, outcome="failed")

    with pytest.raises(Forbidden):
        allow_restart(viewer, run.pk, note="go")

    run.refresh_from_db()
    assert (run.restart_ready, run.override_at) == (False, None)


def test_abandoning_a_run_is_final_and_keeps_its_effects_statuses(agent, operator):
    run = start(agent).run
    effect = _awaiting(agent, run)
    finish_run(agent, run.pk, attempt=1, outcome="failed")
    allow_restart(operator, run.pk, note="try once more")  # then thought better of it

    run = abandon_run(operator, run.pk, note="customer cancelled")

    assert run.status == RunStatus.ABANDONED
    run.refresh_from_db()
    # Nothing waits for a start any more: no override, not handed back.
    assert (run.restart_ready, restart_verdict(run).override) == (False, None)
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    with pytest.raises(RunFinished):
        start(agent)
    with pytest.raises(NotAllowed):
        abandon_run(operator, run.pk, note="again")
    assert AuditEvent.objects.get(run=run, verb="run_abandoned").note == "customer cancelled"
