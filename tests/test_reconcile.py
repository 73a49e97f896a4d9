"""Settling an unknown outcome by the tool's own lookup at the provider (rule 4)."""

from __future__ import annotations

import pytest
from lifecycle_helpers import send, start

from runs.errors import AttemptSuperseded, ClaimConflict, InvalidRequest
from runs.models import AuditEvent, EffectStatus
from runs.outcomes import reconcile_effect

pytestmark = pytest.mark.django_db


def _unknown(agent, **kwargs):
    """An effect left in flight by attempt 1, now unknown; attempt 2 recorded it again."""
    run = start(agent).run
    effect = send(agent, run, **kwargs).effect
    start(agent, supersede=1)
    replay = send(agent, run, attempt=2)
    assert replay.action == "review"
    return run, effect


def test_a_lookup_that_finds_the_effect_settles_it_done(agent):
    run, effect = _unknown(agent)

    effect, action = reconcile_effect(
        agent,
        effect.pk,
        run_id=run.pk,
        attempt=2,
        outcome="done",
        evidence="sent items: message <abc> at 10:02",
        result={"id": "abc"},
    )

    assert action == "skip"
    effect.refresh_from_db()
    assert (effect.status, effect.result) == (EffectStatus.DONE, {"id": "abc"})
    assert effect.decision["verb"] == "reconciled"
    # The evidence is what operators audit the agent's claim by.
    event = AuditEvent.objects.get(effect=effect, verb="reconciled_done")
    assert event.note == "sent items: message <abc> at 10:02"
    assert (event.old_status, event.new_status) == ("unknown", "done")


def test_a_lookup_that_finds_nothing_releases_it_to_pending(agent):
    run, effect = _unknown(agent)

    effect, action = reconcile_effect(
        agent, effect.pk, run_id=run.pk, attempt=2, outcome="not_done", evidence="not found"
    )

    assert action == "claim"
    effect.refresh_from_db()
    assert effect.status == EffectStatus.PENDING
    assert effect.claimed_run is None
    # Released, the next call executes it.
    assert send(agent, run, attempt=2).action == "execute"


def test_a_released_effect_that_needed_approval_goes_back_to_approved(agent, operator):
    from approvals.decisions import approve_effect

    run = start(agent).run
    effect = send(agent, run, needs_approval=True).effect
    approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    assert send(agent, run).action == "execute"
    start(agent, supersede=1)
    send(agent, run, attempt=2)

    effect, action = reconcile_effect(
        agent, effect.pk, run_id=run.pk, attempt=2, outcome="not_done", evidence="none"
    )

    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED
    assert action == "claim"


def test_only_an_unknown_effect_can_be_reconciled(agent):
    run = start(agent).run
    effect = send(agent, run).effect

    with pytest.raises(ClaimConflict) as caught:
        reconcile_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", evidence="x")

    assert caught.value.details == {"status": "in_flight"}


def test_a_reconcile_needs_evidence(agent):
    run, effect = _unknown(agent)

    with pytest.raises(InvalidRequest):
        reconcile_effect(agent, effect.pk, run_id=run.pk, attempt=2, outcome="done", evidence="")

    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


def test_a_run_that_never_recorded_the_effect_cannot_reconcile_it(agent):
    run, effect = _unknown(agent)
    stranger = start(agent, "stranger").run

    with pytest.raises(ClaimConflict):
        reconcile_effect(
            agent, effect.pk, run_id=stranger.pk, attempt=1, outcome="done", evidence="x"
        )

    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN


def test_a_stopped_attempt_cannot_reconcile(agent):
    run, effect = _unknown(agent)

    with pytest.raises(AttemptSuperseded):
        reconcile_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome="done", evidence="x")

    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN
    assert not AuditEvent.objects.filter(effect=effect, verb__startswith="reconciled").exists()
