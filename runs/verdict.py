"""The restart verdict: is it safe to start this run again?

Computed from the run's journal and its restart policy (product.md, "The restart
verdict"). Blocking reasons are facts of the run's history, so no decision on an
effect removes them; only an operator's override lets the next start through.

This module is the rule's one home, in the three forms its readers need:

- ``restart_verdicts(runs)`` / ``restart_verdict(run)``: the verdict itself, with its
  reasons and notes (one run is a batch of one: one code path, one set of queries);
- ``blocked_runs_filter()``: "has a blocking reason" as one SQL condition;
- ``keep_verdict_blocked``: the stored ``Run.verdict_blocked`` flag, set as a
  blocking reason enters the journal (the console filters on it).

tests/test_verdict_forms_agree.py holds the three to each other on generated journals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db.models import Exists, F, OuterRef, Q

from runs.models import Call, Effect, EffectStatus, RestartPolicy, Run

# An effect without a key that was claimed at least once: under the keyed policy it
# blocks, since nothing could deduplicate it on replay. As a condition on effects.
STARTED_UNKEYED = Q(key__isnull=True, first_claimed_at__isnull=False)

# What each status of an effect the run named means for a restart (a note, never a
# block): "<tool> (<key>) <phrase>."
_NOTE_REASONS = {
    EffectStatus.DONE: ("done", "is done: it will be skipped with its recorded result"),
    EffectStatus.AWAITING_APPROVAL: (
        "awaiting_approval",
        "is awaiting approval: the restarted run will wait again",
    ),
    EffectStatus.APPROVED: (
        "approved",
        "is approved: the restarted run will claim and execute it",
    ),
    EffectStatus.PENDING: ("pending", "is pending: the restarted run will claim and execute it"),
    EffectStatus.IN_FLIGHT: (
        "in_flight",
        "is in flight under another attempt: the run will wait",
    ),
    EffectStatus.UNKNOWN: (
        "unknown_outcome",
        "has an unknown outcome: the restarted run will be held at this call until it is settled",
    ),
    EffectStatus.REJECTED: ("rejected", "is rejected: it stays blocked"),
    EffectStatus.EXPIRED: ("expired", "is expired: it stays blocked unless revised"),
    EffectStatus.FAILED: ("failed", "is failed: it will be retried"),
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

    def for_queue(self) -> dict[str, list[str]]:
        """What the operators' queue shows of it, as lines: every blocking reason (a
        blunt run's recorded calls as one line with their count) and the notes a
        person must act on (unknown outcomes). The run page shows it all."""
        blocking = [b["message"] for b in self.blocking if b["reason"] != "recorded_call"]
        calls = sum(1 for b in self.blocking if b["reason"] == "recorded_call")
        if calls:
            blocking.append(f"{calls} call(s) recorded: the blunt policy blocks any recorded call.")
        notes = [n["message"] for n in self.notes if n["reason"] == "unknown_outcome"]
        return {"blocking": blocking, "notes": notes}


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
    """The verdict of one run: ``restart_verdicts`` of a batch of one (three queries
    at most, fewer by policy)."""
    if run.pk is None:
        return _verdict(run, [], [], [])
    return restart_verdicts([run])[run.pk]


def restart_verdicts(runs: list[Run]) -> dict:
    """The verdict of each run, by primary key, in three queries at most for any
    number of runs (the sweep's batches, the queue's rows, one run):

    1. Blocking reasons by policy: every unkeyed effect a keyed run started, every
       call a blunt run recorded (attempt by attempt, in order); a manual run's
       policy blocks by itself.
    2. Notes: every other effect the run's calls point to, by status.
    3. The operator's override, if one waits (read from the run).

    The rows are read as named tuples with the attributes ``_verdict`` reads, not as
    models: a batch of 500 runs reads ~5,000 effects, and building model instances
    of them was most of the sweep's CPU (docs/performance.md)."""
    by_run: dict = {run.pk: ([], [], []) for run in runs}
    keyed = [run.pk for run in runs if run.restart_policy == RestartPolicy.KEYED]
    if keyed:
        started_unkeyed = (
            Effect.objects.filter(STARTED_UNKEYED, run_id__in=keyed)
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
        # One row per (effect, run whose calls point to it): an effect shared by two
        # runs is a note of each, and named twice by one run it is one note.
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
        reason, phrase = _NOTE_REASONS[EffectStatus(effect.status)]
        notes.append(
            {
                "reason": reason,
                "effect_id": str(effect.pk),
                "tool": effect.tool,
                "message": f"{effect.tool} ({effect.key or 'unkeyed'}) {phrase}.",
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
    ``Run.verdict_blocked`` instead, which ``keep_verdict_blocked`` keeps; this is
    its definition (``mark_blocked_runs`` and migration 0009 fill the column by it)."""
    started_unkeyed = Effect.objects.filter(STARTED_UNKEYED, run=OuterRef("pk"))
    any_call = Call.objects.filter(run=OuterRef("pk"))
    return (
        Q(restart_policy=RestartPolicy.MANUAL)
        | (Q(restart_policy=RestartPolicy.KEYED) & Q(Exists(started_unkeyed)))
        | (Q(restart_policy=RestartPolicy.BLUNT) & Q(Exists(any_call)))
    )


def keep_verdict_blocked(run: Run, entry: Call | Effect | None = None) -> None:
    """Keep ``run.verdict_blocked`` (the stored form of "the verdict has a blocking
    reason") as the journal grows; the one place that sets it, called at the three
    moments a reason can appear:

    - the run is created (``entry`` None, the run not saved yet): a manual run is
      blocked from the start;
    - a call is recorded (the new ``Call``): a blunt run is blocked by any call;
    - an effect is claimed for the first time (the ``Effect``, its
      ``first_claimed_at`` set): a keyed run is blocked by a started unkeyed one.
      Only the run that recorded an unkeyed effect can claim it (a new one per
      call), so the claiming run is the effect's own.

    Never cleared: the reasons are facts of the history. One UPDATE, once per run;
    the caller holds the run's lock."""
    if run.verdict_blocked:
        return
    policy = run.restart_policy
    if policy == RestartPolicy.MANUAL:
        blocks = True
    elif policy == RestartPolicy.BLUNT:
        blocks = isinstance(entry, Call)
    else:
        blocks = (
            isinstance(entry, Effect) and entry.key is None and entry.first_claimed_at is not None
        )
    if not blocks:
        return
    run.verdict_blocked = True
    if not run._state.adding:
        Run.objects.filter(pk=run.pk).update(verdict_blocked=True)
