"""The run's attempts and what every change of an effect shares, as plain functions.

Recording a call is in ``runs/calls.py``; the claim, the agent's report and the
reconcile lookup in ``runs/outcomes.py``. The rules below hold for all three.

Every rule of the journal is one transaction that takes the row locks it needs in one
order everywhere: the run first, then the effect. Nothing holds an effect lock and
then asks for a run lock, so concurrent starts, calls, decisions and sweeps cannot
deadlock. Each change writes an audit event (``runs.audit.record_event``) and bumps
the effect's ``revision`` (the poll's ETag).

Called by the agent API (``runs/api/views.py``), the console (``approvals/``) and the
sweep (``runs/sweep.py``).

The rules the API calls take ``savepoint`` as ``transaction.atomic`` does. Inside a
caller's transaction the default makes the rule a savepoint: a rule that fails rolls
back only its own writes, and the caller (the console, a test) carries on. The API
passes ``savepoint=False``: a ``POST``'s transaction is the rule's alone, and a
failure dooms it whole; the idempotency middleware rolls it back, then keeps a keyed
request's error answer in a short transaction of its own (runs/api/idempotency.py).
That is two statements fewer a request (``SAVEPOINT``, ``RELEASE SAVEPOINT``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Model, QuerySet
from django.utils import timezone

from runs.audit import SYSTEM, Actor, new_event, record_event, save_events
from runs.errors import (
    AlreadyRunning,
    AttemptSuperseded,
    InvalidRequest,
    NotFound,
    RestartBlocked,
    RunFinished,
)
from runs.models import (
    CLAIMABLE_STATUSES,
    Action,
    Agent,
    Attempt,
    AttemptStatus,
    Effect,
    EffectStatus,
    EffectVersion,
    OnExpiry,
    Run,
    RunStatus,
)
from runs.verdict import Verdict, keep_verdict_blocked, restart_verdict

# --- Results ----------------------------------------------------------------


@dataclass
class Started:
    run: Run
    attempt: Attempt
    verdict: Verdict
    created: bool


# --- Small shared pieces ----------------------------------------------------


def seconds(n: int) -> timedelta:
    return timedelta(seconds=n)


def default_approval_ttl() -> int:
    return settings.STARTSAFE["APPROVAL_TTL"]


def lock_run(agent: Agent, run_id: Any) -> Run:
    """The agent's run, locked; another agent's id is NotFound like a missing one."""
    try:
        return Run.objects.select_for_update().get(pk=run_id, agent=agent)
    except Run.DoesNotExist:
        raise NotFound("No such run for this agent.") from None


def lock_effect(agent: Agent, effect_id: Any) -> Effect:
    try:
        return Effect.objects.select_for_update().get(pk=effect_id, agent=agent)
    except Effect.DoesNotExist:
        raise NotFound("No such effect for this agent.") from None


def lock_run_and_effect(agent: Agent, run_id: Any, effect_id: Any) -> tuple[Run, Effect]:
    """The agent's run and effect, both locked, the run first (the order above)."""
    return lock_run(agent, run_id), lock_effect(agent, effect_id)


def insert_or_lock_winner(obj: Model, same_row: QuerySet) -> tuple[Model, bool]:
    """Insert ``obj`` unless a row with its unique fields exists (``same_row`` finds
    that row); the row that stands, locked, and whether it is ``obj``.

    Two requests racing to create one row: the loser's ``ON CONFLICT DO NOTHING``
    waits for the winner's commit and then does nothing (no error, so no savepoint
    is needed), and the locked read after it, a statement of its own, sees the
    winner's row. Annotations of ``same_row`` are copied onto ``obj`` when it won.

    ``ignore_conflicts`` skips a conflict on any unique constraint, so ``same_row``
    must find the row of the only one that can conflict (the primary key is a new
    UUID). On SQLite it is ``INSERT OR IGNORE``, which also skips a NOT NULL or
    CHECK violation: the read then finds nothing and raises ``DoesNotExist``.
    """
    type(obj).objects.bulk_create([obj], ignore_conflicts=True)
    row = same_row.select_for_update().get()
    if row.pk != obj.pk:
        return row, False
    for name in same_row.query.annotations:
        setattr(obj, name, getattr(row, name))
    return obj, True


def require_not_finished(run: Run) -> None:
    if run.is_finished:
        raise RunFinished(
            f"The run is {run.status}: it takes no more starts or attempt requests.",
            {"status": run.status},
        )


def require_current_and_running(run: Run, attempt: int) -> None:
    require_not_finished(run)
    if run.status != RunStatus.RUNNING or run.current_attempt != attempt:
        raise AttemptSuperseded(
            f"Attempt {attempt} is not the run's current running attempt: stop.",
            {"attempt": run.current_attempt, "status": run.status},
        )


def save_effect(
    effect: Effect,
    actor: Actor,
    verb: str,
    now: datetime,
    *,
    status: str | None = None,
    note: str = "",
    run: Run | None = None,
    attempt_number: int | None = None,
    data: dict | None = None,
) -> Effect:
    """Save every change of an effect with its revision bumped and an audit event."""
    old_status = effect.status
    if status is not None:
        effect.status = status
    effect.revision += 1
    effect.updated_at = now
    effect.save()
    record_event(
        actor,
        verb,
        at=now,
        run=run,
        effect=effect,
        attempt_number=attempt_number,
        old_status=old_status,
        new_status=effect.status,
        note=note,
        data=data,
    )
    return effect


def add_version(
    effect: Effect, actor: Actor, now: datetime, *, adopted: bool = True, call: Any = None
) -> EffectVersion:
    """Keep the effect's arguments as its version ``args_versions`` (the one place a
    version is made): the effect's current arguments, or with ``adopted=False`` a
    call's arguments kept as drift (the caller passes that call)."""
    args, digest = (effect.args, effect.args_hash) if adopted else (call.args, call.args_hash)
    return EffectVersion.objects.create(
        effect=effect,
        number=effect.args_versions,
        args=args,
        args_hash=digest,
        author=actor.author,
        call=call,
        adopted=adopted,
        at=now,
    )


def set_deadline(effect: Effect, now: datetime) -> None:
    effect.approval_expires_at = now + seconds(effect.approval_ttl)


def is_past_deadline(effect: Effect, now: datetime) -> bool:
    return (
        effect.status == EffectStatus.AWAITING_APPROVAL
        and effect.approval_expires_at is not None
        and effect.approval_expires_at <= now
    )


def expire_if_past_deadline(effect: Effect, now: datetime) -> bool:
    """Record an awaiting effect past its deadline as ``expired`` (by the system).

    The caller holds the effect's lock. Past its deadline an awaiting effect counts
    as expired for every action, whether or not the sweep got there first.
    """
    if not is_past_deadline(effect, now):
        return False
    if effect.on_expiry == OnExpiry.REJECT:
        # The tool's policy says nobody deciding is a refusal (runs/policies.py):
        # rejected by the system, and not final, so a revision asks again.
        note = "No decision before the deadline: the tool's policy rejects."
        effect.decide("rejected", "system", now, note)
        save_effect(effect, SYSTEM, "rejected", now, status=EffectStatus.REJECTED, note=note)
        return True
    effect.decide("expired", "system", now, "No decision before the deadline.")
    save_effect(effect, SYSTEM, "expired", now, status=EffectStatus.EXPIRED)
    return True


def set_claim(effect: Effect, run: Run, attempt: int, now: datetime) -> None:
    effect.claimed_run = run
    effect.claimed_attempt = attempt
    effect.claimed_at = now
    if effect.first_claimed_at is None:
        effect.first_claimed_at = now
        keep_verdict_blocked(run, effect)
    effect.timeout_at = now + seconds(effect.timeout) if effect.timeout else None
    # A retry starts clean; the earlier failure stays in the audit log.
    effect.error = None


def claim_for(effect: Effect, run: Run, attempt: int, actor: Actor, now: datetime) -> None:
    set_claim(effect, run, attempt, now)
    save_effect(
        effect,
        actor,
        "claimed",
        now,
        status=EffectStatus.IN_FLIGHT,
        run=run,
        attempt_number=attempt,
    )


def attempt_is_running(run_id: Any, number: int | None) -> bool:
    return Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, current_attempt=number).exists()


def make_unknown(effect: Effect, actor: Actor, now: datetime, *, why: str) -> None:
    """An in-flight effect whose attempt stopped (or timed out) may or may not have happened."""
    effect.timeout_at = None
    save_effect(
        effect,
        actor,
        "outcome_unknown",
        now,
        status=EffectStatus.UNKNOWN,
        note=why,
        attempt_number=effect.claimed_attempt,
    )


def action_for(effect: Effect, now: datetime) -> str:
    """What an agent must do about ``effect`` now, for the poll and claim answers.

    Pure: it reads the row and writes nothing, so the poll stays one query.
    """
    status = effect.status
    if status in CLAIMABLE_STATUSES:
        return Action.CLAIM
    if status == EffectStatus.AWAITING_APPROVAL:
        return Action.BLOCKED if is_past_deadline(effect, now) else Action.WAIT
    if status == EffectStatus.IN_FLIGHT:
        return Action.WAIT
    if status == EffectStatus.DONE:
        return Action.SKIP
    if status == EffectStatus.UNKNOWN:
        return Action.REVIEW
    return Action.BLOCKED  # rejected, expired


# --- Attempts ----------------------------------------------------------------


def stop_runs(
    runs: list[Run],
    attempt_status: str,
    run_status: str,
    actor: Actor,
    now: datetime,
    *,
    error: str | None = None,
    note: str | dict = "",
) -> None:
    """Stop running runs: each one's current attempt ends ``attempt_status``, the
    effects it holds in flight become ``unknown``, the run becomes ``run_status``.

    The one way a run stops, whoever stops it: the agent's finish (``finish_run``),
    a superseding start (``start_run``) and the sweep (one stale run, or a batch of
    hundreds). Set-based, so a batch costs the statements of one run: an UPDATE of
    the attempts, a locking read of the effects in flight (and their UPDATE, when
    there are any), an UPDATE of the runs and one INSERT of the audit events, in
    this order per run: the attempt's, each effect's, the run's.

    The caller holds the runs' locks and has checked that they are running (so their
    current attempts are: an attempt is only ever started with its run, and ended
    here); the effects are locked here (run, then effect). ``error`` is the agent's,
    kept on the attempt; ``note`` says why the run stopped, for all of them or by
    run id.
    """
    ids = [run.pk for run in runs]
    current = {run.pk: run.current_attempt for run in runs}
    ended = {"status": attempt_status, "ended_at": now}
    if error is not None:
        ended["error"] = error
    Attempt.objects.filter(run_id__in=ids, number=F("run__current_attempt")).update(**ended)
    held: dict = {}
    in_flight = Effect.objects.select_for_update().filter(
        status=EffectStatus.IN_FLIGHT, claimed_run_id__in=ids
    )
    for effect in in_flight.order_by("created_at"):
        if effect.claimed_attempt == current[effect.claimed_run_id]:
            held.setdefault(effect.claimed_run_id, []).append(effect)
    if held:
        Effect.objects.filter(pk__in=[e.pk for found in held.values() for e in found]).update(
            status=EffectStatus.UNKNOWN,
            timeout_at=None,
            revision=F("revision") + 1,
            updated_at=now,
        )
    # Not ready to restart until the verdict or an operator says so.
    Run.objects.filter(pk__in=ids).update(status=run_status, restart_ready=False, updated_at=now)

    events = []

    def event(verb: str, old: str, new: str, why: str, attempt: int, **about) -> None:
        fields = {"attempt_number": attempt, "old_status": old, "new_status": new, "note": why}
        events.append(new_event(actor, verb, at=now, **fields, **about))

    for run in runs:
        attempt = run.current_attempt
        verb = f"attempt_{attempt_status}"
        event(verb, AttemptStatus.RUNNING, attempt_status, error or "", attempt, run=run)
        for effect in held.get(run.pk, []):
            why = f"Attempt {attempt} ended {attempt_status} while it was in flight."
            unknown = (EffectStatus.IN_FLIGHT, EffectStatus.UNKNOWN)
            event("outcome_unknown", *unknown, why, attempt, effect=effect)
        why = note.get(run.pk, "") if isinstance(note, dict) else note
        event(f"run_{run_status}", run.status, run_status, why, attempt, run=run)
        run.status, run.restart_ready, run.updated_at = run_status, False, now
    save_events(events)


def set_run_status(run: Run, status: str, actor: Actor, now: datetime, *, note: str = "") -> None:
    old = run.status
    run.status = status
    run.updated_at = now
    run.save()
    if old != status:
        record_event(
            actor,
            f"run_{status}",
            at=now,
            run=run,
            attempt_number=run.current_attempt,
            old_status=old,
            new_status=status,
            note=note,
        )


def _new_attempt(
    run: Run,
    *,
    started_by: str,
    reason: str,
    agent_version: str | None,
    verdict: Verdict | None,
    actor: Actor,
    now: datetime,
) -> Attempt:
    number = run.current_attempt + 1
    attempt = Attempt.objects.create(
        run=run,
        number=number,
        status=AttemptStatus.RUNNING,
        started_at=now,
        started_by=started_by,
        reason=reason,
        agent_version=agent_version,
        verdict_at_start=verdict.as_dict() if verdict is not None else None,
    )
    run.current_attempt = number
    run.heartbeat_at = now
    run.stale_at = now + seconds(run.heartbeat_timeout)
    run.restart_ready = False
    run.override_by = None
    run.override_at = None
    run.override_note = ""
    old = run.status
    run.status = RunStatus.RUNNING
    run.updated_at = now
    run.save()
    record_event(
        actor,
        "attempt_started",
        at=now,
        run=run,
        attempt_number=number,
        old_status=old if number > 1 else "",
        new_status=RunStatus.RUNNING,
        note=reason,
        data={"started_by": started_by, "agent_version": agent_version},
    )
    return attempt


def start_run(
    agent: Agent,
    run_key: str,
    *,
    title: str = "",
    input: dict | None = None,
    restart_policy: str = "keyed",
    heartbeat_timeout: int = 60,
    restart_url: str | None = None,
    supersede: int | None = None,
    agent_version: str | None = None,
    now: datetime | None = None,
    savepoint: bool = True,
) -> Started:
    """Start a run, or start it again (api.md, ``POST /runs``).

    1. Lock the agent's run by ``run_key``; a new key creates the run and attempt 1
       (a concurrent first start that loses the insert sees the winner's run).
    2. A finished run is ``run_finished``; a ``supersede`` that is not the current
       attempt is ``already_running``.
    3. A running run without ``supersede`` is ``already_running``; with it, its
       attempt ends ``superseded`` and its in-flight effects become ``unknown``.
    4. The verdict (or a waiting override) decides whether attempt n+1 starts. A
       refusal commits what step 3 did, then raises ``restart_blocked``.

    ``savepoint``: see the module's docstring.
    """
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic(savepoint=savepoint):
        same_run = Run.objects.filter(agent=agent, run_key=run_key)
        run = same_run.select_for_update().first()
        if run is None:
            new = Run(
                agent=agent,
                run_key=run_key,
                title=title or "",
                input=input or {},
                restart_policy=restart_policy,
                heartbeat_timeout=heartbeat_timeout,
                restart_url=restart_url or None,
                heartbeat_at=now,
                stale_at=now + seconds(heartbeat_timeout),
                current_attempt=0,
                created_at=now,
                updated_at=now,
            )
            keep_verdict_blocked(new)  # a manual run is blocked from the start
            run, created = insert_or_lock_winner(new, same_run)
            if created:
                attempt = _new_attempt(
                    run,
                    started_by="agent",
                    reason="first start",
                    agent_version=agent_version,
                    verdict=None,
                    actor=actor,
                    now=now,
                )
                return Started(run, attempt, restart_verdict(run), created=True)
            # Another first start of this run_key won the insert. To this request
            # the key was new, so its supersede is ignored (api.md): it gets
            # already_running, and never supersedes the winner's first attempt.
            supersede = None
        outcome = _restart_locked(run, supersede, agent_version, actor, now)
    if isinstance(outcome, Verdict):
        raise RestartBlocked(
            "The restart is not safe: " + " ".join(b["message"] for b in outcome.blocking),
            {"verdict": outcome.as_dict()},
        )
    return outcome


def _restart_locked(
    run: Run, supersede: int | None, agent_version: str | None, actor: Actor, now: datetime
) -> Started | Verdict:
    require_not_finished(run)
    if supersede is not None and supersede != run.current_attempt:
        raise AlreadyRunning(
            f"supersede={supersede} is not the run's current attempt {run.current_attempt}.",
            {"attempt": run.current_attempt, "heartbeat_at": run.heartbeat_at.isoformat()},
        )
    superseded = False
    if run.status == RunStatus.RUNNING:
        if supersede is None:
            raise AlreadyRunning(
                f"Attempt {run.current_attempt} of this run is running; "
                "send supersede with its number to replace it.",
                {"attempt": run.current_attempt, "heartbeat_at": run.heartbeat_at.isoformat()},
            )
        stop_runs(
            [run],
            AttemptStatus.SUPERSEDED,
            RunStatus.INTERRUPTED,
            actor,
            now,
            note="superseded by a new start",
        )
        superseded = True

    verdict = restart_verdict(run)
    if not verdict.safe and not run.has_override:
        return verdict
    previous = run.current_attempt
    if run.has_override:
        username = run.override_by.get_username() if run.override_by_id else "unknown"
        started_by = f"operator:{username}"
        reason = f"allowed by {username}: {run.override_note}"
    elif run.restart_ready:
        started_by = "auto"
        reason = "handed back to its runtime: the verdict was safe"
    else:
        started_by = "agent"
        reason = (
            f"superseded attempt {previous}"
            if superseded
            else f"restart after attempt {previous} ended {run.status}"
        )
    attempt = _new_attempt(
        run,
        started_by=started_by,
        reason=reason,
        agent_version=agent_version,
        verdict=verdict,
        actor=actor,
        now=now,
    )
    # The override was consumed by this attempt; the answer shows the verdict now.
    return Started(run, attempt, restart_verdict(run), created=False)


def heartbeat(agent: Agent, run_id: Any, *, attempt: int, now: datetime | None = None) -> Run:
    """Keep a running attempt alive. A compare-and-set update: no lock, no audit row."""
    now = now or timezone.now()
    run = Run.objects.filter(pk=run_id, agent=agent).first()
    if run is None:
        raise NotFound("No such run for this agent.")
    stale_at = now + seconds(run.heartbeat_timeout)
    updated = Run.objects.filter(
        pk=run.pk, status=RunStatus.RUNNING, current_attempt=attempt
    ).update(heartbeat_at=now, stale_at=stale_at)
    if not updated:
        run.refresh_from_db()
        require_current_and_running(run, attempt)  # raises the right error
    run.heartbeat_at = now
    run.stale_at = stale_at
    return run


def finish_run(
    agent: Agent,
    run_id: Any,
    *,
    attempt: int,
    outcome: str,
    error: str | None = None,
    now: datetime | None = None,
    savepoint: bool = True,
) -> Run:
    """End the current attempt and the run as ``completed`` or ``failed``.
    ``savepoint``: see the module's docstring."""
    if outcome not in (RunStatus.COMPLETED, RunStatus.FAILED):
        raise InvalidRequest(
            "outcome must be completed or failed.", {"fields": {"outcome": outcome}}
        )
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic(savepoint=savepoint):
        run = lock_run(agent, run_id)
        require_current_and_running(run, attempt)
        stop_runs([run], outcome, outcome, actor, now, error=error, note=error or "")
    return run


def released_status(effect: Effect) -> str:
    """Where a released effect goes: approved if it needed approval, else pending."""
    return EffectStatus.APPROVED if effect.needs_approval else EffectStatus.PENDING


def clear_claim(effect: Effect) -> None:
    """Forget the claim of an effect that is released to be claimed again."""
    effect.claimed_run = None
    effect.claimed_attempt = None
    effect.claimed_at = None
    effect.timeout_at = None
