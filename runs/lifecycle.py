"""The effect lifecycle and the run's attempts, as plain functions.

Every function here is one transaction that takes the row locks it needs in one
order everywhere: the run first, then the effect. Nothing holds an effect lock and
then asks for a run lock, so concurrent starts, calls, decisions and sweeps cannot
deadlock. Each change writes an audit event (``runs.audit.record_event``) and bumps
the effect's ``revision`` (the poll's ETag).

Called by the agent API (``runs/api.py``), the console (``approvals/``) and the
sweep (``runs/sweep.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from runs.audit import SYSTEM, Actor, new_event, record_event, save_events
from runs.canonical import args_hash as compute_args_hash
from runs.errors import (
    AlreadyRunning,
    AttemptSuperseded,
    ClaimConflict,
    InvalidRequest,
    KeyConflict,
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
    AuditEvent,
    Call,
    CallKind,
    Effect,
    EffectStatus,
    EffectVersion,
    KeyTombstone,
    Run,
    RunStatus,
)
from runs.verdict import Verdict, restart_verdict

# --- Results ----------------------------------------------------------------


@dataclass
class Started:
    run: Run
    attempt: Attempt
    verdict: Verdict
    created: bool


@dataclass
class Recorded:
    call: Call
    action: str
    effect: Effect | None


# --- Small shared pieces ----------------------------------------------------


def _seconds(n: int) -> timedelta:
    return timedelta(seconds=n)


def default_approval_ttl() -> int:
    return settings.STARTSAFE["APPROVAL_TTL"]


def _lock_run(agent: Agent, run_id: Any) -> Run:
    """The agent's run, locked; another agent's id is NotFound like a missing one."""
    run = Run.objects.select_for_update().filter(pk=run_id, agent=agent).first()
    if run is None:
        raise NotFound("No such run for this agent.")
    return run


def _lock_effect(agent: Agent, effect_id: Any) -> Effect:
    effect = Effect.objects.select_for_update().filter(pk=effect_id, agent=agent).first()
    if effect is None:
        raise NotFound("No such effect for this agent.")
    return effect


def _lock_run_for_call(agent: Agent, run_id: Any, attempt: int) -> tuple[Run, int, int]:
    """The run locked, its running attempt ``attempt``'s id and that attempt's last seq.

    What ``_lock_run`` + ``_require_running_attempt`` + a MAX(seq) do, in one query:
    recording a call is the API's hot write path (docs/performance.md).
    """
    run = (
        Run.objects.select_for_update()
        .filter(pk=run_id, agent=agent)
        .annotate(
            attempt_id=Subquery(
                Attempt.objects.filter(run=OuterRef("pk"), number=attempt)
                .order_by()
                .values("pk")[:1]
            ),
            last_seq=Subquery(
                Call.objects.filter(run=OuterRef("pk"), attempt_number=attempt)
                .order_by("-seq")
                .values("seq")[:1]
            ),
        )
        .order_by()
        .first()
    )
    if run is None:
        raise NotFound("No such run for this agent.")
    _require_current_and_running(run, attempt)
    return run, run.attempt_id, run.last_seq or 0


def _require_not_finished(run: Run) -> None:
    if run.is_finished:
        raise RunFinished(
            f"The run is {run.status}: it takes no more starts or attempt requests.",
            {"status": run.status},
        )


def _require_current_and_running(run: Run, attempt: int) -> None:
    _require_not_finished(run)
    if run.status != RunStatus.RUNNING or run.current_attempt != attempt:
        raise AttemptSuperseded(
            f"Attempt {attempt} is not the run's current running attempt: stop.",
            {"attempt": run.current_attempt, "status": run.status},
        )


def _require_running_attempt(run: Run, attempt: int) -> Attempt:
    """The run's current attempt if it is ``attempt`` and still running."""
    _require_current_and_running(run, attempt)
    return Attempt.objects.get(run=run, number=attempt)


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


def _set_deadline(effect: Effect, now: datetime) -> None:
    effect.approval_expires_at = now + _seconds(effect.approval_ttl)


def _is_past_deadline(effect: Effect, now: datetime) -> bool:
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
    if not _is_past_deadline(effect, now):
        return False
    effect.decision = {
        "verb": "expired",
        "by": "system",
        "at": now.isoformat(),
        "note": "No decision before the deadline.",
        "args_hash": effect.args_hash,
        "final": False,
    }
    save_effect(effect, SYSTEM, "expired", now, status=EffectStatus.EXPIRED)
    return True


def _set_claim(effect: Effect, run: Run, attempt: int, now: datetime) -> None:
    effect.claimed_run = run
    effect.claimed_attempt = attempt
    effect.claimed_at = now
    if effect.first_claimed_at is None:
        effect.first_claimed_at = now
    effect.timeout_at = now + _seconds(effect.timeout) if effect.timeout else None
    # A retry starts clean; the earlier failure stays in the audit log.
    effect.error = None


def _claim(effect: Effect, run: Run, attempt: int, actor: Actor, now: datetime) -> None:
    _set_claim(effect, run, attempt, now)
    save_effect(
        effect,
        actor,
        "claimed",
        now,
        status=EffectStatus.IN_FLIGHT,
        run=run,
        attempt_number=attempt,
    )


def _attempt_is_running(run_id: Any, number: int | None) -> bool:
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
        return Action.BLOCKED if _is_past_deadline(effect, now) else Action.WAIT
    if status == EffectStatus.IN_FLIGHT:
        return Action.WAIT
    if status == EffectStatus.DONE:
        return Action.SKIP
    if status == EffectStatus.UNKNOWN:
        return Action.REVIEW
    return Action.BLOCKED  # rejected, expired


# --- Attempts ----------------------------------------------------------------


def stop_attempt(
    run: Run,
    attempt: Attempt,
    status: str,
    actor: Actor,
    now: datetime,
    *,
    error: str | None = None,
) -> None:
    """End ``attempt``; the effects it holds in flight become ``unknown``.

    The caller holds the run's lock; the effects are locked here (run, then effect).
    """
    old = attempt.status
    attempt.status = status
    attempt.ended_at = now
    if error is not None:
        attempt.error = error
    attempt.save(update_fields=["status", "ended_at", "error"])
    record_event(
        actor,
        f"attempt_{status}",
        at=now,
        run=run,
        attempt_number=attempt.number,
        old_status=old,
        new_status=status,
        note=error or "",
    )
    held = Effect.objects.select_for_update().filter(
        status=EffectStatus.IN_FLIGHT, claimed_run=run, claimed_attempt=attempt.number
    )
    for effect in held.order_by("created_at"):
        make_unknown(
            effect,
            actor,
            now,
            why=f"Attempt {attempt.number} ended {status} while it was in flight.",
        )


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
    run.stale_at = now + _seconds(run.heartbeat_timeout)
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
    """
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(agent=agent, run_key=run_key).first()
        if run is None:
            try:
                with transaction.atomic():
                    run = Run.objects.create(
                        agent=agent,
                        run_key=run_key,
                        title=title or "",
                        input=input or {},
                        restart_policy=restart_policy,
                        heartbeat_timeout=heartbeat_timeout,
                        restart_url=restart_url or None,
                        heartbeat_at=now,
                        stale_at=now + _seconds(heartbeat_timeout),
                        current_attempt=0,
                        created_at=now,
                        updated_at=now,
                    )
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
            except IntegrityError:
                # Another first start of this run_key won the insert. To this request
                # the key was new, so its supersede is ignored (api.md): it gets
                # already_running, and never supersedes the winner's first attempt.
                run = Run.objects.select_for_update().get(agent=agent, run_key=run_key)
                supersede = None
        outcome = _restart_locked(run, supersede, agent_version, actor, now)
    if isinstance(outcome, Verdict):
        raise RestartBlocked(
            "The restart is not safe: " + "; ".join(b["message"] for b in outcome.blocking),
            {"verdict": outcome.as_dict()},
        )
    return outcome


def _restart_locked(
    run: Run, supersede: int | None, agent_version: str | None, actor: Actor, now: datetime
) -> Started | Verdict:
    _require_not_finished(run)
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
        current = Attempt.objects.get(run=run, number=run.current_attempt)
        stop_attempt(run, current, AttemptStatus.SUPERSEDED, actor, now)
        set_run_status(run, RunStatus.INTERRUPTED, actor, now, note="superseded by a new start")
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
    stale_at = now + _seconds(run.heartbeat_timeout)
    updated = Run.objects.filter(
        pk=run.pk, status=RunStatus.RUNNING, current_attempt=attempt
    ).update(heartbeat_at=now, stale_at=stale_at)
    if not updated:
        run.refresh_from_db()
        _require_running_attempt(run, attempt)  # raises the right error
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
) -> Run:
    """End the current attempt and the run as ``completed`` or ``failed``."""
    if outcome not in (RunStatus.COMPLETED, RunStatus.FAILED):
        raise InvalidRequest(
            "outcome must be completed or failed.", {"fields": {"outcome": outcome}}
        )
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic():
        run = _lock_run(agent, run_id)
        current = _require_running_attempt(run, attempt)
        stop_attempt(run, current, outcome, actor, now, error=error)
        run.restart_ready = False
        set_run_status(run, outcome, actor, now, note=error or "")
    return run


# --- Calls --------------------------------------------------------------------


def record_call(
    agent: Agent,
    run_id: Any,
    *,
    attempt: int,
    tool: str,
    kind: str,
    args: dict,
    key: str | None = None,
    key_source: str | None = None,
    needs_approval: bool = False,
    approvals_required: int = 1,
    preview: str = "",
    approval_ttl: int | None = None,
    timeout: int | None = None,
    now: datetime | None = None,
) -> Recorded:
    """Record a tool call before it is made, and answer what to do (api.md, ``/calls``).

    1. Lock the run; the attempt must be its current running one.
    2. A read is journaled and executes.
    3. An effect finds its effect by key (creating it, race-safely, if the key is
       new), or creates an unkeyed one.
    4. Other arguments become a version; what it does depends on the status.
    5. The status gives the action; a claimable effect is claimed here.
    """
    if kind == CallKind.READ and key is not None:
        raise InvalidRequest(
            "A read may not carry a key.", {"fields": {"key": "not allowed on a read"}}
        )
    if key is not None and not key_source:
        raise InvalidRequest(
            "key_source is required with key.", {"fields": {"key_source": "required"}}
        )
    if key is None and key_source:
        raise InvalidRequest("key_source needs a key.", {"fields": {"key_source": "only with key"}})
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    digest = compute_args_hash(args)
    with transaction.atomic():
        run, attempt_id, last_seq = _lock_run_for_call(agent, run_id, attempt)
        call = Call(
            run=run,
            attempt_id=attempt_id,
            attempt_number=attempt,
            seq=last_seq + 1,
            tool=tool,
            kind=kind,
            args=args,
            args_hash=digest,
            at=now,
        )
        if kind == CallKind.READ:
            call.action = Action.EXECUTE
            call.save()
            return Recorded(call, Action.EXECUTE, None)

        declared = {
            "needs_approval": needs_approval,
            "approvals_required": approvals_required if needs_approval else 1,
            "approval_ttl": approval_ttl or default_approval_ttl(),
            "timeout": timeout,
            "preview": preview or "",
        }
        effect, created = _find_or_create_effect(
            agent, run, attempt, tool, key, key_source, args, digest, declared, now
        )
        if created:
            version_adopted = True
            action = _record_creation(effect, run, attempt, actor, now)
        else:
            if effect.tool != tool:
                raise KeyConflict(
                    f"The key {key!r} belongs to the tool {effect.tool!r}.", {"tool": effect.tool}
                )
            version_adopted = _apply_call_to_existing(
                effect, run, attempt, args, digest, actor, now
            )
            action = _act_on_status(effect, run, attempt, actor, now)
        call.effect = effect
        call.action = action
        call.save()
        if created:
            EffectVersion.objects.create(
                effect=effect,
                number=1,
                args=args,
                args_hash=digest,
                author=actor.author,
                call=call,
                adopted=True,
                at=now,
            )
        elif version_adopted is not None:
            EffectVersion.objects.create(
                effect=effect,
                number=effect.args_versions,
                args=args,
                args_hash=digest,
                author=actor.author,
                call=call,
                adopted=version_adopted,
                at=now,
            )
    return Recorded(call, action, effect)


def _record_creation(effect: Effect, run: Run, attempt: int, actor: Actor, now: datetime) -> str:
    """The audit trail of a new effect, in one insert: recorded, then claimed if it was.

    A new effect that needs no approval is inserted already claimed by the recording
    attempt (``_find_or_create_effect``): the same rows as an insert then a claim,
    one UPDATE fewer on the API's hot write path.
    """
    claimed = effect.status == EffectStatus.IN_FLIGHT
    common = {"at": now, "run": run, "effect": effect, "attempt_number": attempt}
    events = [
        new_event(
            actor,
            "recorded",
            new_status=EffectStatus.PENDING if claimed else effect.status,
            data={"key": effect.key, "tool": effect.tool, "args_hash": effect.args_hash},
            **common,
        )
    ]
    if claimed:
        events.append(
            new_event(
                actor,
                "claimed",
                old_status=EffectStatus.PENDING,
                new_status=EffectStatus.IN_FLIGHT,
                **common,
            )
        )
    save_events(events)
    return Action.EXECUTE if claimed else _act_on_status(effect, run, attempt, actor, now)


def _find_or_create_effect(
    agent: Agent,
    run: Run,
    attempt: int,
    tool: str,
    key: str | None,
    key_source: str | None,
    args: dict,
    digest: str,
    declared: dict,
    now: datetime,
) -> tuple[Effect, bool]:
    """The effect a call names: the existing one for its key (locked), or a new one.

    Two calls racing to create one key: one insert wins; the loser's insert waits
    for the winner's commit, fails on the unique constraint inside a savepoint, and
    reads the winner's row under lock instead of failing.
    """
    if key is not None:
        existing = Effect.objects.select_for_update().filter(agent=agent, key=key).first()
        if existing is not None:
            return existing, False
        tombstone = KeyTombstone.objects.filter(agent=agent, key=key).first()
        if tombstone is not None:
            if tombstone.tool != tool:
                raise KeyConflict(
                    f"The key {key!r} belongs to the tool {tombstone.tool!r}.",
                    {"tool": tombstone.tool},
                )
            restored = _restore_from_tombstone(tombstone, run, now)
            if restored is not None:
                return restored, False
    needs_approval = declared["needs_approval"]
    effect = Effect(
        agent=agent,
        run=run,
        tool=tool,
        key=key,
        key_source=key_source,
        args=args,
        args_hash=digest,
        args_versions=1,
        status=EffectStatus.AWAITING_APPROVAL if needs_approval else EffectStatus.PENDING,
        created_at=now,
        updated_at=now,
        **declared,
    )
    if needs_approval:
        _set_deadline(effect, now)
    else:
        # Claimable at once: inserted claimed (``_record_creation`` writes both
        # events), with the revision an insert and a claim would have given it.
        _set_claim(effect, run, attempt, now)
        effect.status = EffectStatus.IN_FLIGHT
        effect.revision += 1
    try:
        with transaction.atomic():
            effect.save(force_insert=True)
    except IntegrityError:
        if key is None:
            raise
        return Effect.objects.select_for_update().get(agent=agent, key=key), False
    return effect, True


# What a pruned key comes back as (product.md rule 8: keys do not expire). An
# outcome that happened, may have happened, or was refused comes back as it was,
# so the redelivered call gets the answer the live key gave: done → skip, unknown
# → review, rejected or expired → blocked. A key that never ran (pending,
# approved, failed, awaiting approval) is absent here: nothing was done, so the
# redelivered call declares a fresh effect, exactly like a new key.
RESTORED_STATUSES = {
    EffectStatus.DONE: EffectStatus.DONE,
    EffectStatus.UNKNOWN: EffectStatus.UNKNOWN,
    # In flight under a finished run: its attempt stopped, so it may have happened.
    EffectStatus.IN_FLIGHT: EffectStatus.UNKNOWN,
    EffectStatus.REJECTED: EffectStatus.REJECTED,
    EffectStatus.EXPIRED: EffectStatus.EXPIRED,
}


def _restore_from_tombstone(tombstone: KeyTombstone, run: Run, now: datetime) -> Effect | None:
    """Bring a pruned key back as an effect of ``run``, with its recorded outcome.

    1. A key that never ran gives None: the caller creates a fresh effect.
    2. Otherwise the effect is inserted with the tombstone's tool, arguments and
       result (a race with another redelivery is lost gracefully, as for new keys).
    3. Its first version and a ``restored`` audit event say where it came from; the
       caller then treats the redelivered call as a replay of an existing key.
    """
    status = RESTORED_STATUSES.get(tombstone.status)
    if status is None:
        return None
    decision = None
    if status in (EffectStatus.REJECTED, EffectStatus.EXPIRED):
        # A pruned refusal stays a refusal: whether it was final is not kept, so it
        # is taken as final for a rejection (never performed without a person).
        decision = {
            "verb": "rejected" if status == EffectStatus.REJECTED else "expired",
            "by": "system",
            "at": tombstone.pruned_at.isoformat(),
            "note": "Restored from the key's tombstone after its run was pruned.",
            "args_hash": tombstone.args_hash,
            "final": status == EffectStatus.REJECTED,
        }
    args = tombstone.args if tombstone.args is not None else {}
    effect = Effect(
        agent_id=tombstone.agent_id,
        run=run,
        tool=tombstone.tool,
        key=tombstone.key,
        key_source=tombstone.key_source,
        needs_approval=status == EffectStatus.EXPIRED,
        approval_ttl=default_approval_ttl(),
        status=status,
        args=args,
        args_hash=tombstone.args_hash,
        args_versions=1,
        result=tombstone.result,
        decision=decision,
        created_at=now,
        updated_at=now,
    )
    try:
        with transaction.atomic():
            effect.save(force_insert=True)
    except IntegrityError:
        return Effect.objects.select_for_update().get(
            agent_id=tombstone.agent_id, key=tombstone.key
        )
    EffectVersion.objects.create(
        effect=effect,
        number=1,
        args=args,
        args_hash=tombstone.args_hash,
        author="system",
        adopted=True,
        at=now,
    )
    record_event(
        SYSTEM,
        "restored",
        at=now,
        run=run,
        effect=effect,
        new_status=status,
        note="The key's run was pruned; its tombstone keeps the outcome.",
        data={
            "key": tombstone.key,
            "tool": tombstone.tool,
            "pruned_effect_id": str(tombstone.effect_id),
            "pruned_run_key": tombstone.run_key,
            "pruned_at": tombstone.pruned_at.isoformat(),
        },
    )
    return effect


def _apply_call_to_existing(
    effect: Effect, run: Run, attempt: int, args: dict, digest: str, actor: Actor, now: datetime
) -> bool | None:
    """Apply a replayed call to an existing effect (the caller holds its lock).

    Returns None when the arguments are the current ones, True when the new
    version was adopted, False when it was kept as drift (frozen content).
    """
    expire_if_past_deadline(effect, now)
    if effect.status == EffectStatus.IN_FLIGHT and not _attempt_is_running(
        effect.claimed_run_id, effect.claimed_attempt
    ):
        make_unknown(effect, SYSTEM, now, why="The attempt that claimed it has stopped.")
    if digest == effect.args_hash:
        return None

    status = effect.status
    final_rejection = status == EffectStatus.REJECTED and bool((effect.decision or {}).get("final"))
    effect.args_versions += 1
    if status in (EffectStatus.PENDING, EffectStatus.AWAITING_APPROVAL):
        new_status = status
    elif status == EffectStatus.FAILED:
        new_status = EffectStatus.AWAITING_APPROVAL if effect.needs_approval else status
    elif status in (EffectStatus.REJECTED, EffectStatus.EXPIRED) and not final_rejection:
        new_status = EffectStatus.AWAITING_APPROVAL
    else:
        # Frozen: approved, in flight, done, unknown, or finally rejected. The
        # version is kept and shown as drift; what ran or was approved never changes.
        save_effect(
            effect,
            actor,
            "args_drift",
            now,
            run=run,
            attempt_number=attempt,
            data={"args_hash": digest, "current_args_hash": effect.args_hash},
        )
        return False

    effect.args = args
    effect.args_hash = digest
    # Approvals name the version they approved; the new one starts with none.
    effect.current_approvals = []
    if new_status == EffectStatus.AWAITING_APPROVAL and status != EffectStatus.AWAITING_APPROVAL:
        _set_deadline(effect, now)
    save_effect(
        effect,
        actor,
        "args_revised",
        now,
        status=new_status,
        run=run,
        attempt_number=attempt,
        data={"args_hash": digest},
    )
    return True


def _act_on_status(effect: Effect, run: Run, attempt: int, actor: Actor, now: datetime) -> str:
    """The action a recorded call answers; a claimable effect is claimed by it."""
    if effect.status in CLAIMABLE_STATUSES:
        _claim(effect, run, attempt, actor, now)
        return Action.EXECUTE
    return {
        EffectStatus.AWAITING_APPROVAL: Action.WAIT,
        EffectStatus.IN_FLIGHT: Action.WAIT,
        EffectStatus.DONE: Action.SKIP,
        EffectStatus.UNKNOWN: Action.REVIEW,
        EffectStatus.REJECTED: Action.BLOCKED,
        EffectStatus.EXPIRED: Action.BLOCKED,
    }[EffectStatus(effect.status)]


# --- Claim, complete, reconcile -----------------------------------------------------


def _require_recorded_by(effect: Effect, run: Run) -> None:
    if not Call.objects.filter(run=run, effect=effect).exists():
        raise ClaimConflict(
            "This run never recorded a call to the effect.", {"status": effect.status}
        )


def claim_effect(
    agent: Agent, effect_id: Any, *, run_id: Any, attempt: int, now: datetime | None = None
) -> tuple[Effect, str]:
    """Claim a released effect for a running attempt that recorded a call to it."""
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic():
        run = _lock_run(agent, run_id)
        _require_running_attempt(run, attempt)
        effect = _lock_effect(agent, effect_id)
        _require_recorded_by(effect, run)
        expire_if_past_deadline(effect, now)
        if effect.status in CLAIMABLE_STATUSES:
            _claim(effect, run, attempt, actor, now)
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
) -> Effect:
    """Report what happened, from the attempt that holds the claim.

    Accepted after that attempt stopped (the effect is ``unknown``): the truth is
    recorded, never thrown away. A report that cannot apply is kept in the audit log
    as ``late_report`` (operators see it) and answered ``claim_conflict``.
    """
    if outcome not in ("done", "failed"):
        raise InvalidRequest("outcome must be done or failed.", {"fields": {"outcome": outcome}})
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic():
        run = _lock_run(agent, run_id)
        effect = _lock_effect(agent, effect_id)
        holder = effect.claimed_run_id == run.pk and effect.claimed_attempt == attempt
        report = {"outcome": outcome, "result": result, "error": error, "attempt": attempt}
        if holder and effect.status == EffectStatus.DONE and outcome == "done":
            # A repeated report keeps the first result. When a person or a lookup
            # settled it first, the holder's own report is still the truth someone
            # may need: keep it in the audit log (once, retries are not news).
            settled_by_other = (effect.decision or {}).get("verb") in ("marked_done", "reconciled")
            already_kept = AuditEvent.objects.filter(
                effect=effect, verb="late_report", data=report
            ).exists()
            if settled_by_other and not already_kept:
                record_event(
                    actor,
                    "late_report",
                    at=now,
                    run=run,
                    effect=effect,
                    attempt_number=attempt,
                    old_status=effect.status,
                    new_status=effect.status,
                    data=report,
                )
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
        record_event(
            actor,
            "late_report",
            at=now,
            run=run,
            effect=effect,
            attempt_number=attempt,
            old_status=effect.status,
            new_status=effect.status,
            note=error or "",
            data=report,
        )
    raise conflict


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
) -> tuple[Effect, str]:
    """Settle an ``unknown`` effect by the tool's own lookup at the provider."""
    if outcome not in ("done", "not_done"):
        raise InvalidRequest("outcome must be done or not_done.", {"fields": {"outcome": outcome}})
    if not evidence:
        raise InvalidRequest("evidence is required.", {"fields": {"evidence": "required"}})
    now = now or timezone.now()
    actor = Actor.for_agent(agent)
    with transaction.atomic():
        run = _lock_run(agent, run_id)
        _require_running_attempt(run, attempt)
        effect = _lock_effect(agent, effect_id)
        _require_recorded_by(effect, run)
        if effect.status != EffectStatus.UNKNOWN:
            raise ClaimConflict(
                "Only an effect whose outcome is unknown can be reconciled.",
                {"status": effect.status},
            )
        effect.decision = {
            "verb": "reconciled",
            "by": agent.label,
            "at": now.isoformat(),
            "note": evidence,
            "args_hash": effect.args_hash,
            "final": False,
        }
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


def released_status(effect: Effect) -> str:
    """Where a released effect goes: approved if it needed approval, else pending."""
    return EffectStatus.APPROVED if effect.needs_approval else EffectStatus.PENDING


def clear_claim(effect: Effect) -> None:
    """Forget the claim of an effect that is released to be claimed again."""
    effect.claimed_run = None
    effect.claimed_attempt = None
    effect.claimed_at = None
    effect.timeout_at = None
