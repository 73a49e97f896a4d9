"""Retention: delete old finished runs, keep a tombstone of every key they recorded.

product.md rule 8: keys do not expire. A run is deleted with its attempts, calls,
effects and versions, but each keyed effect it owned leaves a ``KeyTombstone``
(tool, arguments, status, result), so a message redelivered after pruning is still
deduplicated (``record_call`` restores the key from it: done → ``skip``).

What is pruned, and what never is:
- only *finished* runs (``completed`` or ``abandoned``: product.md's "finished";
  a ``failed`` run may still be restarted, so it is kept), whose last change
  (``updated_at``) is older than the cutoff;
- never an effect that another run still points to: a run whose effects are
  shared with a run that stays (not finished, or not old enough) stays too, until
  both can go together;
- never a run that still holds an effect in flight (it cannot be: finishing makes
  them unknown; kept rather than break the claim if a race ever left one);
- audit events are kept; their links to deleted rows become empty (SET_NULL).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from runs.models import (
    FINISHED_RUN_STATUSES,
    Call,
    Effect,
    EffectStatus,
    KeyTombstone,
    Run,
)


@dataclass
class PruneReport:
    cutoff: datetime
    dry_run: bool = False
    runs: int = 0
    tombstones: int = 0
    # Runs old enough and finished, kept because an effect of theirs is shared with
    # a run that stays (or they hold a claim).
    kept_shared: int = 0
    # Runs old enough but not finished: never touched.
    not_finished: int = 0
    deleted: Counter = field(default_factory=Counter)

    def lines(self) -> list[str]:
        verb = "would delete" if self.dry_run else "deleted"
        out = [
            f"cutoff {self.cutoff.isoformat()}: {verb} {self.runs} finished run(s), "
            f"{'would write' if self.dry_run else 'wrote'} {self.tombstones} key tombstone(s)"
        ]
        for label, count in sorted(self.deleted.items()):
            out.append(f"  {label}: {count}")
        out.append(f"kept {self.kept_shared} finished run(s) sharing effects with runs that stay")
        out.append(f"left {self.not_finished} older run(s) that are not finished untouched")
        return out


def _prunable(runs: set, agent_id) -> set:
    """Shrink ``runs`` until no effect to delete is shared with a run that stays.

    Removing a run can make another run's effect shared, so repeat to a fixpoint.
    """
    runs = set(runs)
    while runs:
        shared_owners = set(
            Call.objects.filter(effect__run_id__in=runs)
            .exclude(run_id__in=runs)
            .values_list("effect__run_id", flat=True)
        )
        # An effect owned by a staying run but claimed by one of these: deleting the
        # claimer would empty the claim of an in-flight effect.
        claimers = set(
            Effect.objects.filter(
                agent_id=agent_id, status=EffectStatus.IN_FLIGHT, claimed_run_id__in=runs
            ).values_list("claimed_run_id", flat=True)
        )
        holding = set(
            Effect.objects.filter(run_id__in=runs, status=EffectStatus.IN_FLIGHT).values_list(
                "run_id", flat=True
            )
        )
        drop = (shared_owners | claimers | holding) & runs
        if not drop:
            return runs
        runs -= drop
    return runs


def _tombstone(effect: Effect, run_keys: dict, now: datetime) -> None:
    KeyTombstone.objects.update_or_create(
        agent_id=effect.agent_id,
        key=effect.key,
        defaults={
            "tool": effect.tool,
            "key_source": effect.key_source,
            "status": effect.status,
            "result": effect.result,
            "args": effect.args,
            "args_hash": effect.args_hash,
            "effect_id": effect.pk,
            "run_key": run_keys[effect.run_id],
            "pruned_at": now,
        },
    )


def prune_finished_runs(
    older_than: timedelta, *, now: datetime | None = None, dry_run: bool = False
) -> PruneReport:
    """Delete finished runs whose last change is older than ``older_than``.

    1. Per agent (keys are per agent, so sharing never crosses agents), lock the
       candidate runs and their effects, so a concurrent call naming one of their
       keys waits and then finds the tombstone.
    2. Keep the runs whose effects are shared with runs that stay.
    3. Write a tombstone for each keyed effect, then delete the runs (their
       attempts, calls, effects, versions and approvals go with them).
    """
    now = now or timezone.now()
    cutoff = now - older_than
    report = PruneReport(cutoff=cutoff, dry_run=dry_run)
    old = Run.objects.filter(updated_at__lt=cutoff)
    report.not_finished = old.exclude(status__in=FINISHED_RUN_STATUSES).count()
    agent_ids = (
        old.filter(status__in=FINISHED_RUN_STATUSES)
        .order_by()
        .values_list("agent_id", flat=True)
        .distinct()
    )
    for agent_id in list(agent_ids):
        after = None
        while True:
            batch = _prune_batch(agent_id, cutoff, after, now, dry_run, report)
            if batch is None:
                break
            after = batch
    return report


# Runs per transaction. PostgreSQL takes at most 65,535 parameters a statement with
# server-side binding, and the delete's cascade names every call of the batch.
PRUNE_BATCH = 1000


def _prune_batch(agent_id, cutoff, after, now, dry_run, report):
    """Prune one batch of an agent's runs (by id, after ``after``); the batch's last
    id, or None when there is none left."""
    with transaction.atomic():
        candidates_qs = (
            Run.objects.select_for_update()
            .filter(agent_id=agent_id, status__in=FINISHED_RUN_STATUSES, updated_at__lt=cutoff)
            .order_by("pk")
        )
        if after is not None:
            candidates_qs = candidates_qs.filter(pk__gt=after)
        candidates = dict(candidates_qs.values_list("pk", "run_key")[:PRUNE_BATCH])
        if not candidates:
            return None
        last = max(candidates)
        # Lock the effects they own: a concurrent record_call of one of these keys
        # waits on the row, then (once it is gone) finds the tombstone.
        list(Effect.objects.select_for_update().filter(run_id__in=candidates))
        runs = _prunable(set(candidates), agent_id)
        report.kept_shared += len(candidates) - len(runs)
        if not runs:
            return last
        keyed = Effect.objects.filter(run_id__in=runs, key__isnull=False)
        report.runs += len(runs)
        if dry_run:
            report.tombstones += keyed.count()
            return last
        for effect in keyed:
            _tombstone(effect, candidates, now)
            report.tombstones += 1
        _, per_model = Run.objects.filter(pk__in=runs).delete()
        for label, count in per_model.items():
            report.deleted[label] += count
    return last
