"""Small builders shared by the journal's rule tests (runs/lifecycle.py, approvals/decisions.py).

They only shorten the calls; every test still says which rows it makes.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from runs.calls import Recorded, record_call
from runs.lifecycle import Started, start_run
from runs.models import AuditEvent, Effect
from runs.outcomes import complete_effect


def start(agent, run_key: str = "job-1", **kwargs) -> Started:
    return start_run(agent, run_key, **kwargs)


def send(
    agent,
    run,
    *,
    attempt: int = 1,
    tool: str = "send_email",
    args: dict | None = None,
    key: str | None = "outlook:message:1",
    key_source: str | None = "provider",
    **kwargs,
) -> Recorded:
    """Record an effect call (keyed by default) for ``run``'s ``attempt``."""
    if key is None:
        key_source = None
    return record_call(
        agent,
        run.pk,
        attempt=attempt,
        tool=tool,
        kind="effect",
        args={"subject": "Hello"} if args is None else args,
        key=key,
        key_source=key_source,
        **kwargs,
    )


def read(agent, run, *, attempt: int = 1, tool: str = "search", args: dict | None = None):
    return record_call(
        agent, run.pk, attempt=attempt, tool=tool, kind="read", args=args or {"q": "x"}
    )


def verbs(effect: Effect) -> list[str]:
    """The audit verbs of an effect, oldest first."""
    return list(
        AuditEvent.objects.filter(effect=effect).order_by("id").values_list("verb", flat=True)
    )


def transitions(effect: Effect) -> list[tuple[str, str]]:
    """The (old, new) status pairs of an effect's audit events that changed its status."""
    rows = AuditEvent.objects.filter(effect=effect).order_by("id")
    return [(e.old_status, e.new_status) for e in rows if e.old_status != e.new_status]


def effect_in(agent, operator, status: str) -> Effect:
    """An effect brought to ``status`` through the journal's own rules (``operator``
    decides where a person must)."""
    from approvals.decisions import approve_effect, reject_effect, release_effect

    t0 = timezone.now()
    run = start_run(agent, f"run-{status}", heartbeat_timeout=86_400, now=t0).run
    approval = status in ("awaiting_approval", "approved", "rejected", "expired")

    def call(attempt: int = 1, now=t0):
        return record_call(
            agent, run.pk, attempt=attempt, tool="send", kind="effect", args={"s": status},
            key=f"send:{status}", key_source="intent", needs_approval=approval,
            approval_ttl=600, now=now,
        ).effect  # fmt: skip

    effect = call()
    if status == "approved":
        approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    if status == "rejected":
        reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="no")
    if status == "expired":
        call(now=t0 + timedelta(minutes=11))  # the replay records the expiry
    if status in ("done", "failed"):
        complete_effect(agent, effect.pk, run_id=run.pk, attempt=1, outcome=status)
    if status in ("unknown", "pending"):
        start_run(agent, run.run_key, supersede=1)
    if status == "pending":
        effect.refresh_from_db()
        release_effect(operator, effect.pk, args_hash=effect.args_hash, note="not sent")
    effect.refresh_from_db()
    assert effect.status == status
    return effect
