"""The sweep: find interrupted runs, settle what they left in flight, hand safe runs back.

Each unit of work is claimed under its own row lock and re-checked, so the sweep is
safe to run twice and by several workers at once; the queries are set-based and
their cost grows with the stale rows, not with all rows (partial indexes
``run_sweep_stale_idx``, ``effect_in_flight_timeout_idx``,
``effect_awaiting_deadline_idx``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs.audit import SYSTEM, record_event
from runs.handoff import schedule_restart_handoff
from runs.lifecycle import expire_if_past_deadline, make_unknown, set_run_status, stop_attempt
from runs.models import Attempt, AttemptStatus, Effect, EffectStatus, RestartPolicy, Run, RunStatus
from runs.verdict import restart_verdict

logger = logging.getLogger("startsafe.sweep")

BATCH = 500


@dataclass
class SweepReport:
    interrupted: list[str] = field(default_factory=list)
    restart_ready: list[str] = field(default_factory=list)
    needs_person: list[str] = field(default_factory=list)
    timed_out: list[str] = field(default_factory=list)
    expired: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{len(self.interrupted)} run(s) interrupted "
            f"({len(self.restart_ready)} handed back, {len(self.needs_person)} need a person), "
            f"{len(self.timed_out)} effect(s) timed out to unknown, "
            f"{len(self.expired)} approval(s) expired"
        )


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
            schedule_restart_handoff(run)
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
            report.needs_person.append(str(run.pk))
    logger.info("run %s interrupted", run_id)
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


def sweep(now: datetime | None = None) -> SweepReport:
    """One sweep: stale runs, timed-out effects, expired approvals."""
    now = now or timezone.now()
    report = SweepReport()
    stale = Run.objects.filter(status=RunStatus.RUNNING, stale_at__lt=now).order_by("stale_at")
    for run_id in stale.values_list("pk", flat=True)[:BATCH]:
        interrupt_stale_run(run_id, now, report)
    timed_out = Effect.objects.filter(status=EffectStatus.IN_FLIGHT, timeout_at__lt=now)
    for effect_id in timed_out.values_list("pk", flat=True)[:BATCH]:
        time_out_effect(effect_id, now, report)
    past_deadline = Effect.objects.filter(
        status=EffectStatus.AWAITING_APPROVAL, approval_expires_at__lte=now
    )
    for effect_id in past_deadline.values_list("pk", flat=True)[:BATCH]:
        expire_effect(effect_id, now, report)
    return report
