"""The demo data of ``make run`` shows every state an operator meets."""

from __future__ import annotations

import pytest

from runs.demo import seed_demo_runs
from runs.models import Effect, EffectStatus, EffectVersion, Run

pytestmark = pytest.mark.django_db


def test_the_demo_shows_every_state(agent, client, operator):
    assert "ticket-4812" in seed_demo_runs(agent)
    statuses = set(Effect.objects.values_list("status", flat=True))
    assert {EffectStatus.AWAITING_APPROVAL, EffectStatus.UNKNOWN, EffectStatus.DONE} <= statuses
    two = Effect.objects.get(key="campaign:2026-02-newsletter")
    assert two.approvals_required == 2 and len(two.current_approvals) == 1
    assert Run.objects.get(run_key="refund-9120").status == "interrupted"
    assert Run.objects.get(run_key="import-7731").attempts.count() == 3
    revised = Effect.objects.get(key="voucher:ticket-4901")
    assert revised.status == EffectStatus.AWAITING_APPROVAL
    assert EffectVersion.objects.filter(effect=revised).count() == 2
    assert seed_demo_runs(agent) == "already seeded"
    client.force_login(operator)
    for path in ["/", "/runs/", *[f"/runs/{r.pk}/" for r in Run.objects.all()]]:
        assert client.get(path).status_code == 200
    for effect in Effect.objects.all():
        assert client.get(f"/effects/{effect.pk}/").status_code == 200
