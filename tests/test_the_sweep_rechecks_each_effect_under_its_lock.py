"""The sweep re-checks each effect under its row lock before it times it out or expires it.

The sweep lists the effects past their timeout or deadline, then settles each in a
transaction of its own (``time_out_effect``, ``expire_effect``), where it locks the
row and looks again: between the list and the lock the agent may have reported,
the effect may have been claimed again, or a person may have decided. tests/
test_sweep.py covers the listed rows; ``make mutate`` showed the re-check itself
untested (its conditions joined with ``and``, ``>=`` made ``>``, all passed).
Called directly, as the sweep calls them, on rows that changed in between.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lifecycle_helpers import send, start

from approvals.decisions import approve_effect
from runs.models import AuditEvent, Effect, EffectStatus
from runs.outcomes import complete_effect
from runs.sweep import SweepReport, expire_effect, time_out_effect

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def _in_flight(agent, timeout=30) -> Effect:
    run = start(agent, heartbeat_timeout=3600, now=T0).run
    effect = send(agent, run, timeout=timeout, now=T0).effect
    assert effect.status == EffectStatus.IN_FLIGHT
    return effect


def test_an_effect_past_its_timeout_becomes_unknown_and_says_why(agent):
    effect = _in_flight(agent)
    report = SweepReport()
    at = effect.timeout_at + timedelta(microseconds=1)

    assert time_out_effect(effect.pk, at, report) is True

    effect.refresh_from_db()
    assert effect.status == EffectStatus.UNKNOWN and effect.timeout_at is None
    assert report.timed_out == [str(effect.pk)]
    event = AuditEvent.objects.get(effect=effect, verb="outcome_unknown")
    assert (event.actor, event.at) == ("system", at)
    assert event.note == "Still in flight after its 30s timeout."


def test_an_effect_exactly_at_its_timeout_is_not_timed_out_yet(agent):
    effect = _in_flight(agent)
    report = SweepReport()

    assert time_out_effect(effect.pk, effect.timeout_at, report) is False

    effect.refresh_from_db()
    assert effect.status == EffectStatus.IN_FLIGHT and report == SweepReport()


def test_an_effect_whose_timeout_moved_on_before_the_lock_is_left_in_flight(agent):
    """Listed at T0 + 31 s, but by the time its row is locked it was claimed again."""
    effect = _in_flight(agent)
    Effect.objects.filter(pk=effect.pk).update(timeout_at=T0 + timedelta(seconds=61))

    assert time_out_effect(effect.pk, T0 + timedelta(seconds=31), SweepReport()) is False

    effect.refresh_from_db()
    assert effect.status == EffectStatus.IN_FLIGHT


def test_an_effect_reported_before_the_lock_is_left_as_reported(agent):
    effect = _in_flight(agent)
    complete_effect(
        agent,
        effect.pk,
        run_id=effect.run_id,
        attempt=1,
        outcome="done",
        result={"id": "sent-1"},
        now=T0 + timedelta(seconds=31),
    )
    events = AuditEvent.objects.count()

    assert time_out_effect(effect.pk, T0 + timedelta(seconds=32), SweepReport()) is False

    effect.refresh_from_db()
    assert effect.status == EffectStatus.DONE and AuditEvent.objects.count() == events


def test_an_effect_gone_before_the_lock_is_skipped(agent):
    missing = "01900000-0000-7000-8000-000000000000"
    report = SweepReport()

    assert time_out_effect(missing, T0, report) is False
    assert expire_effect(missing, T0, report) is False
    assert report == SweepReport()


def test_an_approval_past_its_deadline_expires_and_is_reported(agent):
    run = start(agent, heartbeat_timeout=3600, now=T0).run
    effect = send(agent, run, needs_approval=True, approval_ttl=60, now=T0).effect
    report = SweepReport()

    assert expire_effect(effect.pk, T0 + timedelta(seconds=61), report) is True

    effect.refresh_from_db()
    assert effect.status == EffectStatus.EXPIRED
    assert report.expired == [str(effect.pk)]


def test_an_approval_decided_before_the_lock_does_not_expire(agent, operator):
    run = start(agent, heartbeat_timeout=3600, now=T0).run
    effect = send(agent, run, needs_approval=True, approval_ttl=60, now=T0).effect
    approve_effect(operator, effect.pk, args_hash=effect.args_hash, now=T0)
    report = SweepReport()

    assert expire_effect(effect.pk, T0 + timedelta(seconds=61), report) is False

    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED and report == SweepReport()
