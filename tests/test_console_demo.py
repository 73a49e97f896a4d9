"""The demo data of ``make run`` shows every state an operator meets."""

from __future__ import annotations

import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from approvals.demo import seed_demo_runs
from runs.models import TOKEN_PREFIX, Effect, EffectStatus, EffectVersion, Run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import support_agent  # noqa: E402
from fake_llm import ticket_for  # noqa: E402

pytestmark = pytest.mark.django_db


def test_the_demo_shows_every_state(agent, client, operator):
    assert "ticket-5310" in seed_demo_runs(agent)
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


def _seed_demo_token() -> str:
    out = StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue().strip().splitlines()[-1]


def test_the_demo_token_stays_the_same_across_seedings(client):
    """make run seeds on every start: the token it printed last time keeps working."""
    first = _seed_demo_token()
    second = _seed_demo_token()

    assert first == second and first.startswith(TOKEN_PREFIX)
    for token in (first, second):
        answer = client.get("/api/v1/effects", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200, answer.content


def test_the_demo_token_follows_the_secret_key(settings):
    """Derived from SECRET_KEY, it is as secret as the key, and each clone has its own."""
    first = _seed_demo_token()
    settings.SECRET_KEY = "another-clone-" + "k" * 50

    assert _seed_demo_token() != first


def test_the_demo_has_names_of_its_own(agent):
    """The README's example (ticket-4812, campaign:2026-winter-eu) never meets the demo:
    no look-alike campaign in the queue, no 'already running' for the newcomer."""
    example = ticket_for(support_agent.parse(["--token", "t"]).ticket)
    example_names = {example.ticket_id, f"campaign:{example.campaign_id}", example.campaign_id}

    seed_demo_runs(agent)

    demo_names = set(Run.objects.values_list("run_key", flat=True))
    demo_names |= set(Effect.objects.exclude(key=None).values_list("key", flat=True))
    demo_names |= {str(e.args.get("campaign_id")) for e in Effect.objects.all()}
    assert example.ticket_id == "ticket-4812"  # the example's defaults, as the README shows
    assert not demo_names & example_names
