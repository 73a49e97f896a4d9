"""The sweep: find interrupted runs, settle what they left in flight, hand safe runs back.

Each unit of work is claimed under its own row lock and re-checked, so the sweep is
safe to run twice and by several workers at once; the queries are set-based and
their cost grows with the stale rows, not with all rows (partial indexes
``run_sweep_stale_idx``, ``effect_in_flight_timeout_idx``,
``effect_awaiting_deadline_idx``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals.models import record_task_run
from approvals.notifications import notify_needs_person
from runs.audit import SYSTEM, record_event
from runs.handoff import dispatch_due_handoffs, schedule_restart_handoff
from runs.lifecycle import expire_if_past_deadline, make_unknown, set_run_status, stop_attempt
from runs.models import Attempt, AttemptStatus, Effect, EffectStatus, RestartPolicy, Run, RunStatus
from runs.verdict import restart_verdict
from startsafe.logs import kv

logger = logging.getLogger("startsafe.sweep")

BATCH = 500
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


def interrupt_stale_run(run_id, now: datetime, report: SweepReport) -> bool:
    """Interrupt one stale run and decide its restart, in one transaction.

    1. Lock the run and re-check that it is still running and stale.
    2. Its attempt ends ``interrupted``; its in-flight effects become ``unknown``.
    3. The verdict: a safe run under an automatic policy, below the cap of
       automatic restarts, becomes ``restart_ready`` and is handed to its runtime;
       otherwise it waits in the operators' queue.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None or run.status != RunStatus.RUNNING or run.stale_at >= now:
            return False
        current = Attempt.objects.get(run=run, number=run.current_attempt)
        stop_attempt(run, current, AttemptStatus.INTERRUPTED, SYSTEM, now)
        set_run_status(
            run,
            RunStatus.INTERRUPTED,
            SYSTEM,
            now,
            note=f"No heartbeat since {run.heartbeat_at.isoformat()}.",
        )
        report.interrupted.append(str(run.pk))
        verdict = restart_verdict(run)
        cap = settings.STARTSAFE["AUTO_RESTART_CAP"]
        automatic = run.restart_policy != RestartPolicy.MANUAL
        if verdict.safe and automatic and run.auto_restarts < cap:
            run.restart_ready = True
            run.auto_restarts += 1
            run.save(update_fields=["restart_ready", "auto_restarts"])
            record_event(
                SYSTEM,
                "restart_ready",
                at=now,
                run=run,
                attempt_number=run.current_attempt,
                old_status=run.status,
                new_status=run.status,
                note="The verdict is safe: handed back to its runtime.",
                data={"verdict": verdict.as_dict(), "auto_restarts": run.auto_restarts},
            )
            schedule_restart_handoff(run, now)
            report.restart_ready.append(str(run.pk))
        else:
            why = (
                "automatic restarts capped"
                if verdict.safe and automatic
                else "verdict not safe"
                if automatic
                else "manual policy"
            )
            record_event(
                SYSTEM,
                "needs_person",
                at=now,
                run=run,
                attempt_number=run.current_attempt,
                old_status=run.status,
                new_status=run.status,
                note=why,
                data={"verdict": verdict.as_dict()},
            )
            # In the same transaction: operators hear of it exactly when it is true.
            notify_needs_person(run, now, why)
            report.needs_person.append(str(run.pk))
    return True


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
    _each(
        "run",
        list(stale.values_list("pk", flat=True)[:BATCH]),
        interrupt_stale_run,
        now,
        report,
        push_back=lambda pk: Run.objects.filter(pk=pk).update(stale_at=later),
    )
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
