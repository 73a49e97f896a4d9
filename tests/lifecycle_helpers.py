"""Small builders shared by the journal's rule tests (runs/lifecycle.py, approvals/decisions.py).

They only shorten the calls; every test still says which rows it makes.
"""

from __future__ import annotations

from runs.calls import Recorded, record_call
from runs.lifecycle import Started, start_run
from runs.models import AuditEvent, Effect


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
