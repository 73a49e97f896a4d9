"""The restart verdict: is it safe to start this run again?

Computed from the run's journal and its restart policy (product.md, "The restart
verdict"). Blocking reasons are facts of the run's history, so no decision on an
effect removes them; only an operator's override lets the next start through.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from runs.models import Call, Effect, EffectStatus, RestartPolicy, Run

_NOTE_REASONS = {
    EffectStatus.DONE: ("done", "done: it will be skipped with its recorded result"),
    EffectStatus.AWAITING_APPROVAL: (
        "awaiting_approval",
        "awaiting approval: the restarted run will wait again",
    ),
    EffectStatus.APPROVED: ("approved", "approved: the restarted run will claim and execute it"),
    EffectStatus.PENDING: ("pending", "pending: the restarted run will claim and execute it"),
    EffectStatus.IN_FLIGHT: ("in_flight", "in flight under another attempt: the run will wait"),
    EffectStatus.UNKNOWN: (
        "unknown_outcome",
        "outcome unknown: the restarted run will be held at this call until it is settled",
    ),
    EffectStatus.REJECTED: ("rejected", "rejected: it stays blocked"),
    EffectStatus.EXPIRED: ("expired", "expired: it stays blocked unless revised"),
    EffectStatus.FAILED: ("failed", "failed: it will be retried"),
}


@dataclass
class Verdict:
    safe: bool
    policy: str
    blocking: list[dict] = field(default_factory=list)
    notes: list[dict] = field(default_factory=list)
    override: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def override_of(run: Run) -> dict | None:
    """The operator's waiting "allow restart", as the verdict shows it."""
    if run.override_at is None:
        return None
    return {
        "by": run.override_by.get_username() if run.override_by_id else None,
        "at": run.override_at.isoformat(),
        "note": run.override_note,
    }


def restart_verdict(run: Run) -> Verdict:
    """Compute the verdict for ``run`` from its journal (three queries at most).

    1. Blocking reasons by policy: every unkeyed effect the run started (keyed),
       every recorded call (blunt), or the policy itself (manual).
    2. Notes: every other effect the run's calls point to, by status.
    3. The operator's override, if one waits.
    """
    blocking: list[dict] = []
    blocked_effects: set = set()

    if run.restart_policy == RestartPolicy.MANUAL:
        blocking.append(
            {
                "reason": "manual_policy",
                "effect_id": None,
                "call_id": None,
                "tool": None,
                "message": "The run's restart policy is manual: a person always decides.",
            }
        )

    if run.restart_policy == RestartPolicy.KEYED:
        started_unkeyed = Effect.objects.filter(
            run=run, key__isnull=True, first_claimed_at__isnull=False
        ).order_by("created_at")
        for effect in started_unkeyed:
            blocked_effects.add(effect.pk)
            blocking.append(
                {
                    "reason": "unkeyed_effect",
                    "effect_id": str(effect.pk),
                    "call_id": None,
                    "tool": effect.tool,
                    "message": (
                        f"An unkeyed effect of {effect.tool} was started: "
                        "nothing could deduplicate it on replay."
                    ),
                }
            )

    if run.restart_policy == RestartPolicy.BLUNT:
        for call in Call.objects.filter(run=run).order_by("attempt_number", "seq"):
            blocking.append(
                {
                    "reason": "recorded_call",
                    "effect_id": str(call.effect_id) if call.effect_id else None,
                    "call_id": str(call.pk),
                    "tool": call.tool,
                    "message": (
                        f"A call to {call.tool} was recorded (attempt {call.attempt_number}, "
                        f"#{call.seq}): the blunt policy blocks any recorded call."
                    ),
                }
            )

    notes: list[dict] = []
    referenced = (
        Effect.objects.filter(calls__run=run).distinct().order_by("created_at") if run.pk else []
    )
    for effect in referenced:
        if effect.pk in blocked_effects:
            continue
        reason, message = _NOTE_REASONS[EffectStatus(effect.status)]
        notes.append(
            {
                "reason": reason,
                "effect_id": str(effect.pk),
                "tool": effect.tool,
                "message": f"{effect.tool} ({effect.key or 'unkeyed'}) is {message}.",
            }
        )

    return Verdict(
        safe=not blocking,
        policy=run.restart_policy,
        blocking=blocking,
        notes=notes,
        override=override_of(run),
    )
