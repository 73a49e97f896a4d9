"""Rows the console tests share: a run with an awaiting campaign, an unknown effect."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from runs.calls import record_call
from runs.lifecycle import finish_run, start_run
from runs.models import Effect

CAMPAIGN_ARGS = {"campaign_id": "2026-winter-eu", "subject": "Winter sale", "segment": "EU"}


def awaiting_campaign(agent, run_key: str = "ticket-1", *, approvals_required: int = 1, **kw):
    """A run whose campaign effect awaits approval; returns the effect."""
    started = start_run(agent, run_key, title=f"Campaign for {run_key}")
    recorded = record_call(
        agent,
        started.run.pk,
        attempt=1,
        tool=kw.pop("tool", "send_campaign"),
        kind="effect",
        args=kw.pop("args", dict(CAMPAIGN_ARGS, campaign_id=run_key)),
        key=f"campaign:{run_key}",
        key_source="intent",
        needs_approval=True,
        approvals_required=approvals_required,
        preview=f"Send 'Winter sale' for {run_key}",
        **kw,
    )
    return recorded.effect


def unknown_effect(agent, run_key: str = "job-9") -> Effect:
    """A keyed effect that was in flight when its run failed: its outcome is unknown."""
    started = start_run(agent, run_key, title="Reply and fail")
    recorded = record_call(
        agent,
        started.run.pk,
        attempt=1,
        tool="reply_email",
        kind="effect",
        args={"to": "jane@example.com", "body": "Hello"},
        key=f"outlook:message:{run_key}",
        key_source="provider",
    )
    finish_run(agent, started.run.pk, attempt=1, outcome="failed", error="process killed")
    recorded.effect.refresh_from_db()
    return recorded.effect


def failed_unkeyed_run(agent, run_key: str = "refund-1"):
    """A failed run that started an unkeyed effect: its verdict blocks."""
    started = start_run(agent, run_key, title="Refund")
    record_call(agent, started.run.pk, attempt=1, tool="issue_refund", kind="effect", args={"n": 1})
    finish_run(agent, started.run.pk, attempt=1, outcome="failed", error="boom")
    return started.run


def later(seconds: int):
    return timezone.now() + timedelta(seconds=seconds)
