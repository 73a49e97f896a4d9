"""The sweep: find interrupted runs, settle what they left in flight, hand safe runs back.

Each unit of work is claimed under its row locks and re-checked, so the sweep is
safe to run twice and by several workers at once; the queries are set-based and
their cost grows with the stale rows, not with all rows (partial indexes
``run_sweep_stale_idx``, ``effect_in_flight_timeout_idx``,
``effect_awaiting_deadline_idx``). Stale runs are interrupted in batches of
``BATCH`` (``interrupt_stale_runs``: a fixed number of statements per batch, about
1.5 ms per run at 100,000 running runs, docs/performance.md); a batch that fails
is redone one run at a time by the same code (``interrupt_stale_run``), where a
broken row is isolated and pushed back.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runs.audit import SYSTEM, new_event, save_events
from runs.handoff import dispatch_due_handoffs, schedule_restart_handoff
from runs.lifecycle import expire_if_past_deadline, make_unknown, stop_runs
from runs.models import (
    AttemptStatus,
    Effect,
    EffectStatus,
    RestartPolicy,
    Run,
    RunStatus,
    record_task_run,
)
from runs.signals import runs_need_person
from runs.verdict import restart_verdicts
from startsafe.logs import kv

logger = logging.getLogger("startsafe.sweep")

BATCH = 500
# Stale runs interrupted per sweep at most (batches of BATCH): a backlog after an
# outage drains in a few sweeps without one sweep holding the worker for minutes.
MAX_RUN_BATCHES = 20
# How far a row that raised is pushed back, so one broken row cannot take every
# sweep down with it (it is logged each time and retried later).
BROKEN_ROW_DELAY = timedelta(minutes=5)


@dataclass
class SweepReport:
    interrupted: list[str] = field(default_factory=list)
    restart_ready: list[str] = field(default_factory=list)
    needs_person: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)
    handoffs_dispatched: int = 0
    errors: list[str] = field(default_factory=list)
    duration: float = 0.0

    def summary(self) -> str:
        return (
            f"{len(self.interrupted)} run(s) interrupted "
            f"({len(self.restart_ready)} handed back, {len(self.needs_person)} need a person), "
            f"{len(self.timed_out)} effect(s) timed out to unknown, "
            f"{len(self.expired)} approval(s) expired, "
            f"{self.handoffs_dispatched} hand-off(s) queued, {len(self.errors)} error(s)"
        )

    def log_fields(self) -> dict:
        return {
            "interrupted": len(self.interrupted),
            "restart_ready": len(self.restart_ready),
            "needs_person": len(self.needs_person),
            "timed_out": len(self.timed_out),
            "expired": len(self.expired),
            "handoffs_dispatched": self.handoffs_dispatched,
            "errors": len(self.errors),
            "duration": f"{self.duration:.4f}",
        }


def interrupt_stale_runs(run_ids: list, now: datetime, report: SweepReport) -> None:
    """Interrupt a batch of stale runs and decide their restarts (``_interrupt``): one
    transaction and a fixed number of statements for the batch (docs/performance.md)."""
    _interrupt(run_ids, now, report)


def interrupt_stale_run(run_id, now: datetime, report: SweepReport) -> bool:
    """``interrupt_stale_runs`` for one run: the sweep's fallback when a batch
    raised, where a broken row fails alone and is pushed back. True if it was
    interrupted."""
    return _interrupt([run_id], now, report) > 0


def _interrupt(run_ids: list, now: datetime, report: SweepReport) -> int:
    """The sweep's one way to interrupt stale runs; how many it interrupted.

    1. Lock the runs still running and stale; ``SKIP LOCKED`` leaves a run an agent
       is heartbeating right now to the next sweep instead of waiting on it.
    2. Stop them as every run stops (``lifecycle.stop_runs``): their attempts end
       ``interrupted``, the effects those hold in flight become ``unknown``.
    3. Their verdicts (``restart_verdicts``, three queries for all): a safe run
       under an automatic policy, below the cap of automatic restarts, becomes
       ``restart_ready`` and is handed to its runtime; the others wait in the
       operators' queue (``_why_needs_person``), and operators are told.
    If anything raises, the transaction rolls back as a whole.
    """
    with transaction.atomic():
        runs = list(
            Run.objects.select_for_update(skip_locked=True)
            .filter(pk__in=run_ids, status=RunStatus.RUNNING, stale_at__lt=now)
            .order_by("stale_at")
        )
        if not runs:
            return 0
        stop_runs(
            runs,
            AttemptStatus.INTERRUPTED,
            RunStatus.INTERRUPTED,
            SYSTEM,
            now,
            note={run.pk: f"No heartbeat since {run.heartbeat_at.isoformat()}." for run in runs},
        )

        verdicts = restart_verdicts(runs)
        events, ready, waiting = [], [], []
        for run in runs:
            verdict = verdicts[run.pk]
            why = _why_needs_person(run, verdict.safe)
            if why is None:
                run.auto_restarts += 1
                ready.append(run)
                verb, note = "restart_ready", "The verdict is safe: handed back to its runtime."
                data = {"verdict": verdict.as_dict(), "auto_restarts": run.auto_restarts}
            else:
                waiting.append((run, why))
                verb, note, data = "needs_person", why, {"verdict": verdict.as_dict()}
            # A decision about the run, not a change of its status.
            fields = {
                "note": note,
                "data": data,
                "old_status": run.status,
                "new_status": run.status,
            }
            attempt = run.current_attempt
            events.append(
                new_event(SYSTEM, verb, at=now, run=run, attempt_number=attempt, **fields)
            )
        if ready:
            Run.objects.filter(pk__in=[run.pk for run in ready]).update(
                restart_ready=True, auto_restarts=F("auto_restarts") + 1
            )
        for run in ready:
            schedule_restart_handoff(run, now)  # only runs with a restart_url: real work
        # In the same transaction: operators hear of it exactly when it is true.
        runs_need_person.send(Run, runs=waiting, now=now)
        save_events(events)
    report.interrupted.extend(str(run.pk) for run in runs)
    report.restart_ready.extend(str(run.pk) for run in ready)
    report.needs_person.extend(str(run.pk) for run, _ in waiting)
    return len(runs)


def _why_needs_person(run: Run, safe: bool) -> str | None:
    """None when the run is handed back automatically, else why a person must decide."""
    automatic = run.restart_policy != RestartPolicy.MANUAL
    if safe and automatic and run.auto_restarts < settings.STARTSAFE["AUTO_RESTART_CAP"]:
        return None
    if safe and automatic:
        return "automatic restarts capped"
    return "verdict not safe" if automatic else "manual policy"


def time_out_effect(effect_id, now: datetime, report: SweepReport) -> bool:
    with transaction.atomic():
        effect = Effect.objects.select_for_update().filter(pk=effect_id).first()
        if (
            effect is None
            or effect.status != EffectStatus.IN_FLIGHT
            or effect.timeout_at is None
            or effect.timeout_at >= now
        ):
            return False
        make_unknown(
            effect, SYSTEM, now, why=f"Still in flight after its {effect.timeout}s timeout."
        )
    report.timed_out.append(str(effect_id))
    return True


def expire_effect(effect_id, now: datetime, report: SweepReport) -> bool:
    with transaction.atomic():
        effect = Effect.objects.select_for_update().filter(pk=effect_id).first()
        if effect is None or not expire_if_past_deadline(effect, now):
            return False
    report.expired.append(str(effect_id))
    return True


def _each(kind: str, ids, unit, now: datetime, report: SweepReport, push_back=None) -> None:
    """Run ``unit`` on each id; a row that raises is logged, pushed back, and skipped."""
    for pk in ids:
        try:
            unit(pk, now, report)
        except Exception as exc:
            report.errors.append(f"{kind} {pk}: {type(exc).__name__}: {exc}")
            logger.exception(kv("sweep_row_failed", kind=kind, id=pk, error=type(exc).__name__))
            if push_back is not None:
                try:
                    push_back(pk)
                except Exception:
                    logger.exception(kv("sweep_push_back_failed", kind=kind, id=pk))


def sweep(now: datetime | None = None) -> SweepReport:
    """One sweep: stale runs, timed-out effects, expired approvals, due hand-offs.

    1. Running runs past ``stale_at`` are interrupted (and handed back or queued).
    2. In-flight effects past ``timeout_at`` become ``unknown``.
    3. Awaiting effects past their deadline expire.
    4. Hand-offs due (back-off over, or a crashed try's lease passed) are queued.
    Each unit is its own transaction; a broken row is logged and pushed back by
    ``BROKEN_ROW_DELAY`` where its date is only the sweep's (``stale_at``,
    ``timeout_at``); an approval deadline is never moved, the row is only skipped.
    """
    now = now or timezone.now()
    started = time.monotonic()
    report = SweepReport()
    later = now + BROKEN_ROW_DELAY

    stale = Run.objects.filter(status=RunStatus.RUNNING, stale_at__lt=now).order_by("stale_at")
    for _ in range(MAX_RUN_BATCHES):
        # The partial index run_sweep_stale_idx: this reads the stale runs only.
        ids = list(stale.values_list("pk", flat=True)[:BATCH])
        if not ids:
            break
        done = len(report.interrupted)
        try:
            interrupt_stale_runs(ids, now, report)
        except Exception as exc:
            logger.warning(kv("sweep_batch_failed", runs=len(ids), error=type(exc).__name__))
            _each(
                "run",
                ids,
                interrupt_stale_run,
                now,
                report,
                push_back=lambda pk: Run.objects.filter(pk=pk).update(stale_at=later),
            )
        if len(ids) < BATCH or len(report.interrupted) == done:
            break  # the last batch, or one whose runs were all locked or broken
    timed_out = Effect.objects.filter(status=EffectStatus.IN_FLIGHT, timeout_at__lt=now).order_by(
        "timeout_at"
    )
    _each(
        "timeout",
        list(timed_out.values_list("pk", flat=True)[:BATCH]),
        time_out_effect,
        now,
        report,
        push_back=lambda pk: Effect.objects.filter(pk=pk).update(timeout_at=later),
    )
    past_deadline = Effect.objects.filter(
        status=EffectStatus.AWAITING_APPROVAL, approval_expires_at__lte=now
    ).order_by("approval_expires_at")
    _each(
        "expiry",
        list(past_deadline.values_list("pk", flat=True)[:BATCH]),
        expire_effect,
        now,
        report,
    )
    try:
        report.handoffs_dispatched = dispatch_due_handoffs(now)
    except Exception as exc:
        report.errors.append(f"dispatch: {type(exc).__name__}: {exc}")
        logger.exception(kv("sweep_dispatch_failed", error=type(exc).__name__))

    report.duration = time.monotonic() - started
    # An idle sweep every few seconds would drown the log: it says so only at DEBUG.
    fields = report.log_fields()
    busy = any(value for name, value in fields.items() if name != "duration")
    logger.log(logging.INFO if busy else logging.DEBUG, kv("sweep", **fields))
    record_task_run(
        "sweep",
        now,
        report.duration,
        error="; ".join(report.errors)[:2000],
        interrupted=len(report.interrupted),
        expired=len(report.expired),
        row_errors=len(report.errors),
    )
    return report
