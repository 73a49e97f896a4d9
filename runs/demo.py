"""Demo data for ``make run``: runs in the states an operator meets."""

from __future__ import annotations

from runs.lifecycle import record_call, start_run
from runs.models import Agent, Run


def seed_demo_runs(agent: Agent) -> str:
    """Create the demo runs once; later calls leave them as they are."""
    if Run.objects.filter(agent=agent).exists():
        return "already seeded"
    started = start_run(
        agent, "ticket-4812", title="Answer ticket 4812 and send the winter campaign"
    )
    attempt = started.attempt.number
    run_id = started.run.pk
    record_call(
        agent,
        run_id,
        attempt=attempt,
        tool="lookup_customer",
        kind="read",
        args={"customer_id": "c-1042"},
    )
    record_call(
        agent,
        run_id,
        attempt=attempt,
        tool="send_campaign",
        kind="effect",
        args={"campaign_id": "2026-winter-eu", "subject": "Winter sale", "segment": "EU"},
        key="campaign:2026-winter-eu",
        key_source="intent",
        needs_approval=True,
        preview="Send 'Winter sale' to 12,408 recipients of segment EU",
    )
    return "ticket-4812 (a campaign awaiting approval)"
