"""What happened to an effect: the claim, the agent's report, and the tool's own
lookup (api.md, ``/effects/{id}/claim``, ``/complete``, ``/reconcile``).

Like every rule of the journal (``runs/lifecycle.py``), one transaction that locks
the run first, then the effect.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from runs.audit import Actor, record_event
from runs.errors import (
    ClaimConflict,
    InvalidRequest,
    RunFinished,
)
from runs.lifecycle import (
    action_for,
    claim_for,
    clear_claim,
    expire_if_past_deadline,
    lock_effect,
    lock_run,
    lock_run_and_effect,
    released_status,
    require_current_and_running,
    save_effect,
)
from runs.models import (
    CLAIMABLE_STATUSES,
    Action,
    Agent,
    AuditEvent,
    Call,
    Effect,
    EffectStatus,
    Run,
)

# --- Claim, complete, reconcile -----------------------------------------------------


def _require_recorded_by(effect: Effect, run: Run) -> None:
    if not Call.objects.filter(run=run, effect=effect).exists():
        raise ClaimConflict(
            "This run never recorded a call to the effect.", {"status": effect.status}
        )


def _lock_for_the_attempt(agent: Agent, run_id: Any, attempt: int, effect_id: Any):
    """The run and the effect, locked (run first), for a running attempt of a run that
    recorded a call to the effect: what a claim and a reconcile both require."""
    run = lock_run(agent, run_id)
    require_current_and_running(run, attempt)  # the run's lock says it: no query
    effect = lock_effect(agent, effect_id)
    _require_recorded_by(effect, run)
    return run, effect


def claim_effect(
    agent: Agent,
    effect_id: Any,
    *,
    run_id: Any,
    attempt: int,
    now: datetime | None = None,
    savepoint: bool = True,
) -> tuple[Effect, str]:
    """Claim a released effect for a running attempt that recorded a call to it.
    ``savepoint``: see runs/lifecycle.py's docstring."""
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic(savepoint=savepoint):
        run, effect = _lock_for_the_attempt(agent, run_id, attempt, effect_id)
        expire_if_past_deadline(effect, now)
        if effect.status in CLAIMABLE_STATUSES:
            claim_for(effect, run, attempt, actor, now)
            return effect, Action.EXECUTE
        return effect, action_for(effect, now)


def complete_effect(
    agent: Agent,
    effect_id: Any,
    *,
    run_id: Any,
    attempt: int,
    outcome: str,
    result: dict | None = None,
    error: str | None = None,
    now: datetime | None = None,
    savepoint: bool = True,
) -> Effect:
    """Report what happened, from the attempt that holds the claim.

    Accepted after that attempt stopped (the effect is ``unknown``): the truth is
    recorded, never thrown away. A report that cannot apply is kept in the audit log
    as ``late_report`` (operators see it) and answered ``claim_conflict``: the
    error is raised after the transaction's block, so the report stays.
    ``savepoint``: see runs/lifecycle.py's docstring.
    """
    if outcome not in ("done", "failed"):
        raise InvalidRequest("outcome must be done or failed.", {"fields": {"outcome": outcome}})
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic(savepoint=savepoint):
        run, effect = lock_run_and_effect(agent, run_id, effect_id)
        holder = effect.claimed_run_id == run.pk and effect.claimed_attempt == attempt
        report = {"outcome": outcome, "result": result, "error": error, "attempt": attempt}
        if holder and effect.status == EffectStatus.DONE and outcome == "done":
            # A repeated report keeps the first result. When a person or a lookup
            # settled it, the holder's own report is still the truth someone may
            # need: keep it in the audit log (once, retries are not news). Who made
            # it done is read from the log, not from ``decision``: a lookup's not_done
            # before this claim leaves its decision there, and the holder's retried
            # report would show operators a "late report" of its own. A report that
            # made it done was the holder's: done is final, and keeps its claim.
            made_done_or_kept = AuditEvent.objects.filter(
                Q(verb__in=("completed", "completed_late"), new_status=EffectStatus.DONE)
                | Q(verb="late_report", data=report),
                effect=effect,
            ).exists()
            if not made_done_or_kept:
                _keep_late_report(effect, run, attempt, actor, now, report)
            return effect
        conflict = None
        if run.is_finished:
            conflict = RunFinished(
                f"The run is {run.status}; the report is kept in the audit log.",
                {"status": effect.status},
            )
        elif not holder or effect.status not in (EffectStatus.IN_FLIGHT, EffectStatus.UNKNOWN):
            conflict = ClaimConflict(
                "This attempt does not hold the effect now; the report is kept for operators.",
                {"status": effect.status},
            )
        if conflict is None:
            late = effect.status == EffectStatus.UNKNOWN
            effect.timeout_at = None
            if outcome == "done":
                effect.result = result
                effect.error = None
            else:
                effect.error = error or "failed"
            save_effect(
                effect,
                actor,
                "completed_late" if late else "completed",
                now,
                status=EffectStatus.DONE if outcome == "done" else EffectStatus.FAILED,
                run=run,
                attempt_number=attempt,
                note=error or "",
                data=report,
            )
            return effect
        _keep_late_report(effect, run, attempt, actor, now, report)
    raise conflict


def _keep_late_report(
    effect: Effect, run: Run, attempt: int, actor: Actor, now: datetime, report: dict
) -> None:
    """Keep a report that changes nothing in the audit log, for operators."""
    record_event(
        actor,
        "late_report",
        at=now,
        run=run,
        effect=effect,
        attempt_number=attempt,
        old_status=effect.status,
        new_status=effect.status,
        note=report["error"] or "",
        data=report,
    )


def reconcile_effect(
    agent: Agent,
    effect_id: Any,
    *,
    run_id: Any,
    attempt: int,
    outcome: str,
    evidence: str,
    result: dict | None = None,
    now: datetime | None = None,
    savepoint: bool = True,
) -> tuple[Effect, str]:
    """Settle an ``unknown`` effect by the tool's own lookup at the provider.
    ``savepoint``: see runs/lifecycle.py's docstring."""
    if outcome not in ("done", "not_done"):
        raise InvalidRequest("outcome must be done or not_done.", {"fields": {"outcome": outcome}})
    if not evidence:
        raise InvalidRequest("evidence is required.", {"fields": {"evidence": "required"}})
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic(savepoint=savepoint):
        run, effect = _lock_for_the_attempt(agent, run_id, attempt, effect_id)
        if effect.status != EffectStatus.UNKNOWN:
            raise ClaimConflict(
                "Only an effect whose outcome is unknown can be reconciled.",
                {"status": effect.status},
            )
        effect.decide("reconciled", agent.label, now, evidence)
        if outcome == "done":
            effect.result = result
            new_status = EffectStatus.DONE
        else:
            new_status = released_status(effect)
            clear_claim(effect)
        save_effect(
            effect,
            actor,
            f"reconciled_{outcome}",
            now,
            status=new_status,
            run=run,
            attempt_number=attempt,
            note=evidence,
            data={"outcome": outcome, "result": result},
        )
    return effect, action_for(effect, now)
