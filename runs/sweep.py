"""The sweep: find interrupted runs, settle what they left in flight, hand safe runs back.

Each unit of work is claimed under its row locks and re-checked, so the sweep is
safe to run twice and by several workers at once; the queries are set-based and
their cost grows with the stale rows, not with all rows (partial indexes
``run_sweep_stale_idx``, ``effect_in_flight_timeout_idx``,
``effect_awaiting_deadline_idx``). Stale runs are interrupted in batches of
``BATCH`` (``interrupt_stale_runs``: a fixed number of statements per batch, about
1.5 ms per run at 100,000 running runs, docs/performance.md); a batch that fails
is redone one run at a time (``interrupt_stale_run``), where a broken row is
isolated and pushed back.
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

from runs.audit import SYSTEM, new_event, record_event, save_events
from runs.handoff import dispatch_due_handoffs, schedule_restart_handoff
from runs.lifecycle import expire_if_past_deadline, make_unknown, set_run_status, stop_attempt
from runs.models import (
    Attempt,
    AttemptStatus,
    AuditEvent,
    Effect,
    EffectStatus,
    RestartPolicy,
    Run,
    RunStatus,
    record_task_run,
)
from runs.signals import runs_need_person
from runs.verdict import restart_verdict, restart_verdicts
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
            runs_need_person.send(Run, runs=[(run, why)], now=now)
            report.needs_person.append(str(run.pk))
    return True


def _why_needs_person(run: Run, safe: bool) -> str | None:
    """None when the run is handed back automatically, else why a person must decide."""
    automatic = run.restart_policy != RestartPolicy.MANUAL
    if safe and automatic and run.auto_restarts < settings.STARTSAFE["AUTO_RESTART_CAP"]:
        return None
    if safe and automatic:
        return "automatic restarts capped"
    return "verdict not safe" if automatic else "manual policy"


def interrupt_stale_runs(run_ids: list, now: datetime, report: SweepReport) -> None:
    """``interrupt_stale_run`` for a batch of runs, set-based, in one transaction.

    The same changes and the same audit trail, in a fixed number of statements
    per batch instead of a dozen per run (docs/performance.md, the sweep):
    1. Lock the runs still running and stale; ``SKIP LOCKED`` leaves a run an
       agent is heartbeating right now to the next sweep instead of waiting on it.
    2. One UPDATE each: their current attempts end ``interrupted``, the effects
       those attempts hold in flight become ``unknown``, the runs ``interrupted``.
    3. The verdicts of all of them (three queries, ``restart_verdicts``); safe
       automatic runs below the cap are handed back, the others are queued for a
       person (one INSERT of notifications).
    4. The audit events in one INSERT, in the order the per-run path writes them;
       ``post_save`` is sent for each, as ``create()`` would, so they are logged.
    If anything raises, the transaction rolls back and the sweep falls back to one
    run at a time, where a broken row is isolated and pushed back.
    """
    events: list[AuditEvent] = []

    def event(verb: str, run: Run | None, **fields) -> None:
        events.append(new_event(SYSTEM, verb, at=now, run=run, **fields))

    with transaction.atomic():
        runs = list(
            Run.objects.select_for_update(skip_locked=True)
            .filter(pk__in=run_ids, status=RunStatus.RUNNING, stale_at__lt=now)
            .order_by("stale_at")
        )
        if not runs:
            return
        ids = [run.pk for run in runs]
        current = {run.pk: run.current_attempt for run in runs}
        attempts = {
            attempt.run_id: attempt
            for attempt in Attempt.objects.filter(run_id__in=ids)
            if attempt.number == current[attempt.run_id]
        }
        Attempt.objects.filter(pk__in=[a.pk for a in attempts.values()]).update(
            status=AttemptStatus.INTERRUPTED, ended_at=now
        )
        held = list(
            Effect.objects.select_for_update()
            .filter(status=EffectStatus.IN_FLIGHT, claimed_run_id__in=ids)
            .order_by("created_at")
        )
        held = [e for e in held if e.claimed_attempt == current[e.claimed_run_id]]
        Effect.objects.filter(pk__in=[e.pk for e in held]).update(
            status=EffectStatus.UNKNOWN,
            timeout_at=None,
            revision=F("revision") + 1,
            updated_at=now,
        )
        held_by: dict = {}
        for effect in held:
            held_by.setdefault(effect.claimed_run_id, []).append(effect)
        Run.objects.filter(pk__in=ids).update(status=RunStatus.INTERRUPTED, updated_at=now)
        for run in runs:
            attempt = attempts.get(run.pk)
            if attempt is not None:
                event(
                    "attempt_interrupted",
                    run,
                    attempt_number=attempt.number,
                    old_status=attempt.status,
                    new_status=AttemptStatus.INTERRUPTED,
                )
            for effect in held_by.get(run.pk, []):
                event(
                    "outcome_unknown",
                    None,
                    effect=effect,
                    attempt_number=effect.claimed_attempt,
                    old_status=EffectStatus.IN_FLIGHT,
                    new_status=EffectStatus.UNKNOWN,
                    note=(
                        f"Attempt {effect.claimed_attempt} ended interrupted "
                        "while it was in flight."
                    ),
                )
            event(
                "run_interrupted",
                run,
                attempt_number=run.current_attempt,
                old_status=RunStatus.RUNNING,
                new_status=RunStatus.INTERRUPTED,
                note=f"No heartbeat since {run.heartbeat_at.isoformat()}.",
            )
            run.status = RunStatus.INTERRUPTED
            run.updated_at = now

        verdicts = restart_verdicts(runs)
        ready, waiting = [], []
        for run in runs:
            verdict = verdicts[run.pk]
            why = _why_needs_person(run, verdict.safe)
            common = {
                "attempt_number": run.current_attempt,
                "old_status": run.status,
                "new_status": run.status,
            }
            if why is None:
                run.restart_ready = True
                run.auto_restarts += 1
                ready.append(run)
                event(
                    "restart_ready",
                    run,
                    note="The verdict is safe: handed back to its runtime.",
                    data={"verdict": verdict.as_dict(), "auto_restarts": run.auto_restarts},
                    **common,
                )
            else:
                waiting.append((run, why))
                event("needs_person", run, note=why, data={"verdict": verdict.as_dict()}, **common)
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
