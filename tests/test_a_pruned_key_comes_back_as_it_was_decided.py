"""A pruned key redelivered comes back from its tombstone as it was decided (rule 8).

tests/test_prune.py checks the answer a redelivery gets (``blocked`` for a refusal,
``skip`` for a done key); ``make mutate`` showed that what the restored effect says
about its decision was never looked at: a refusal restored with another verb, no
decision, a rejection taken as not final, an expired effect that no longer needs an
approval all passed. Here the restored effect is read whole.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import send, start

from approvals.decisions import reject_effect
from runs.lifecycle import finish_run
from runs.models import AuditEvent, EffectStatus, EffectVersion, KeyTombstone
from runs.prune import prune_finished_runs
from runs.sweep import sweep

pytestmark = pytest.mark.django_db

LONG_AGO = timezone.now() - timedelta(days=60)
KEY = "outlook:message:<a1@example.com>"
ARGS = {"subject": "Re: hello"}


def _refused(agent, operator, how: str):
    run = start(agent, "t", heartbeat_timeout=3600, now=LONG_AGO).run
    effect = send(
        agent, run, key=KEY, args=ARGS, needs_approval=True, approval_ttl=60, now=LONG_AGO
    ).effect
    if how == "rejected":
        reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="no", now=LONG_AGO)
    else:
        sweep(now=LONG_AGO + timedelta(seconds=61))
    effect.refresh_from_db()
    assert effect.status == how
    finish_run(agent, run.pk, attempt=1, outcome="completed", now=LONG_AGO)
    prune_finished_runs(timedelta(days=30))
    return KeyTombstone.objects.get(key=KEY)


@pytest.mark.parametrize("how", ["rejected", "expired"])
def test_a_pruned_refusal_comes_back_refused_by_the_system_with_its_hash(agent, operator, how):
    tombstone = _refused(agent, operator, how)

    recorded = send(agent, start(agent, "t2").run, key=KEY, args=ARGS, needs_approval=True)

    effect = recorded.effect
    assert recorded.action == "blocked"
    assert effect.status == how
    assert effect.decision == {
        "verb": how,
        "by": "system",
        "at": tombstone.pruned_at.isoformat(),
        "note": "Restored from the key's tombstone after its run was pruned.",
        "args_hash": tombstone.args_hash,
        # A rejection is never performed without a person; whether an expiry was
        # final is not kept, so a revision may still ask again.
        "final": how == "rejected",
    }
    # An expired effect asked for an approval, a rejected one may not have: only
    # the expired one is restored as needing one (a revision asks again).
    assert effect.needs_approval is (how == "expired")
    assert effect.args == ARGS and effect.args_versions == 1
    version = EffectVersion.objects.get(effect=effect)
    assert (version.number, version.args, version.author) == (1, ARGS, "system")
    restored = AuditEvent.objects.get(effect=effect, verb="restored")
    assert (restored.actor, restored.new_status) == ("system", how)


def test_a_tombstone_without_arguments_restores_an_effect_with_none(agent):
    """Tombstones written before they kept the arguments (``args`` is nullable)."""
    KeyTombstone.objects.create(
        agent=agent,
        key=KEY,
        tool="send_email",
        key_source="provider",
        status=EffectStatus.DONE,
        result={"id": "sent-1"},
        args=None,
        args_hash="0" * 64,
        effect_id="01900000-0000-7000-8000-000000000000",
        run_key="t",
        pruned_at=LONG_AGO,
    )

    recorded = send(agent, start(agent, "t2").run, key=KEY, args=ARGS)

    assert recorded.action == "skip"
    assert recorded.effect.args == {} and recorded.effect.result == {"id": "sent-1"}
