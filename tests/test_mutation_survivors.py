"""Tests that kill one surviving mutant each, where no test module of the rule fits.

``make mutate`` (docs/guarantees.md, "Mutation testing") runs the tests listed in
[tool.mutmut]; a test added here needs no change to that list, so
``make mutate MUTATE_RESUME=1`` re-tests the survivors against it without starting
afresh. The answers of a claim and a heartbeat say what the journal holds after them:
a claim of an effect still awaiting approval, within its
deadline, was never asked for (the answer's ``action_for`` then compares the
deadline with no time at all); a heartbeat's returned run was never read (its
``heartbeat_at`` could be anything).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from lifecycle_helpers import send, start

from runs.lifecycle import heartbeat
from runs.models import EffectStatus, Run
from runs.outcomes import claim_effect

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def test_a_claim_of_an_effect_awaiting_approval_within_its_deadline_is_told_to_wait(agent):
    run = start(agent, now=T0).run
    effect = send(agent, run, needs_approval=True, approval_ttl=60, now=T0).effect

    effect, action = claim_effect(
        agent, effect.pk, run_id=run.pk, attempt=1, now=T0 + timedelta(seconds=59)
    )

    assert action == "wait"
    assert effect.status == EffectStatus.AWAITING_APPROVAL


def test_a_heartbeat_answers_the_run_as_it_now_stands(agent):
    run = start(agent, heartbeat_timeout=30, now=T0).run
    now = T0 + timedelta(seconds=20)

    answered = heartbeat(agent, run.pk, attempt=1, now=now)

    stored = Run.objects.get(pk=run.pk)
    assert (answered.heartbeat_at, answered.stale_at) == (now, now + timedelta(seconds=30))
    assert (stored.heartbeat_at, stored.stale_at) == (answered.heartbeat_at, answered.stale_at)
