"""The restart verdict: is it safe to start this run again?

Computed from the run's journal and its restart policy (product.md, "The restart
verdict"). Blocking reasons are facts of the run's history, so no decision on an
effect removes them; only an operator's override lets the next start through.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Exists, F, OuterRef, Q

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
        # Its parts are flat dicts of plain values: copying them one level deep is
        # what dataclasses.asdict's recursion does, at a fraction of its cost (the
        # sweep writes a verdict into every stale run's audit event).
        return {
            "safe": self.safe,
            "policy": self.policy,
            "blocking": [dict(item) for item in self.blocking],
            "notes": [dict(item) for item in self.notes],
            "override": dict(self.override) if self.override is not None else None,
        }


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
    started_unkeyed = []
    if run.restart_policy == RestartPolicy.KEYED:
        started_unkeyed = Effect.objects.filter(
            run=run, key__isnull=True, first_claimed_at__isnull=False
        ).order_by("created_at")
    calls = []
    if run.restart_policy == RestartPolicy.BLUNT:
        calls = Call.objects.filter(run=run).order_by("attempt_number", "seq")
    referenced = (
        Effect.objects.filter(calls__run=run).distinct().order_by("created_at") if run.pk else []
    )
    return _verdict(run, list(started_unkeyed), list(calls), list(referenced))


def restart_verdicts(runs: list[Run]) -> dict:
    """``restart_verdict`` of many runs at once (the sweep's batches): three queries in
    all instead of three per run, with the same rules and the same order.

    The rows are read as named tuples with the attributes ``_verdict`` reads, not as
    models: a batch of 500 runs reads ~5,000 effects, and building model instances
    of them was most of the sweep's CPU (docs/performance.md)."""
    by_run: dict = {run.pk: ([], [], []) for run in runs}
    keyed = [run.pk for run in runs if run.restart_policy == RestartPolicy.KEYED]
    if keyed:
        started_unkeyed = (
            Effect.objects.filter(
                run_id__in=keyed, key__isnull=True, first_claimed_at__isnull=False
            )
            .order_by("created_at")
            .values_list("pk", "run_id", "tool", named=True)
        )
        for effect in started_unkeyed:
            by_run[effect.run_id][0].append(effect)
    blunt = [run.pk for run in runs if run.restart_policy == RestartPolicy.BLUNT]
    if blunt:
        calls = (
            Call.objects.filter(run_id__in=blunt)
            .order_by("attempt_number", "seq")
            .values_list("pk", "run_id", "effect_id", "tool", "attempt_number", "seq", named=True)
        )
        for call in calls:
            by_run[call.run_id][1].append(call)
    if by_run:
        # One row per (effect, run whose calls point to it), like the per-run distinct.
        referenced = (
            Effect.objects.filter(calls__run_id__in=list(by_run))
            .annotate(via_run=F("calls__run_id"))
            .order_by("created_at")
            .values_list("pk", "tool", "key", "status", "created_at", "via_run", named=True)
            .distinct()
        )
        for effect in referenced:
            by_run[effect.via_run][2].append(effect)
    return {run.pk: _verdict(run, *by_run[run.pk]) for run in runs}


def _verdict(run: Run, started_unkeyed: list, calls: list, referenced: list) -> Verdict:
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
    for call in calls:
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


def blocked_runs_filter() -> Q:
    """Runs whose history has a blocking reason (the rules of ``_verdict``), as one SQL
    condition. It tests every run's effects and calls: the console reads
    ``Run.verdict_blocked`` instead, which the rules keep; this is its definition
    (the tests hold the column to it)."""
    started_unkeyed = Effect.objects.filter(
        run=OuterRef("pk"), key__isnull=True, first_claimed_at__isnull=False
    )
    any_call = Call.objects.filter(run=OuterRef("pk"))
    return (
        Q(restart_policy=RestartPolicy.MANUAL)
        | (Q(restart_policy=RestartPolicy.KEYED) & Q(Exists(started_unkeyed)))
        | (Q(restart_policy=RestartPolicy.BLUNT) & Q(Exists(any_call)))
    )


def mark_verdict_blocked(run: Run) -> None:
    """Keep ``run.verdict_blocked`` as a blocking reason appears (the caller holds the
    run's lock): a blunt run's first call, a keyed run's first started unkeyed
    effect. A manual run is created blocked. One UPDATE, once per run."""
    if run.verdict_blocked:
        return
    run.verdict_blocked = True
    Run.objects.filter(pk=run.pk).update(verdict_blocked=True)
