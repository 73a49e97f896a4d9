"""Recording a tool call before it is made: the effect by key, its argument
versions, and the answer (api.md, ``POST /runs/{id}/calls``).

Like every rule of the journal (``runs/lifecycle.py``), one transaction that locks
the run first, then the effect.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef, Subquery
from django.utils import timezone

from runs.audit import SYSTEM, Actor, new_event, record_event, save_events
from runs.canonical import args_hash as compute_args_hash
from runs.errors import (
    InvalidRequest,
    KeyConflict,
    NotFound,
)
from runs.lifecycle import (
    add_version,
    attempt_is_running,
    claim_for,
    default_approval_ttl,
    expire_if_past_deadline,
    insert_or_lock_winner,
    make_unknown,
    require_current_and_running,
    save_effect,
    set_claim,
    set_deadline,
)
from runs.models import (
    CLAIMABLE_STATUSES,
    Action,
    Agent,
    Attempt,
    Call,
    CallKind,
    Effect,
    EffectStatus,
    KeyTombstone,
    Run,
)
from runs.policies import (
    Gate,
    drift_origin,
    effective_rule,
    gate,
    matching_rule,
    policy_hold,
    tool_unconfirmed,
)
from runs.registry import register_from_call, rule_of, rule_subquery
from runs.verdict import keep_verdict_blocked

# --- Calls --------------------------------------------------------------------


@dataclass
class Recorded:
    call: Call
    action: str
    effect: Effect | None


def _lock_run_for_call(
    agent: Agent, run_id: Any, attempt: int, tool: str
) -> tuple[Run, Any, dict | None]:
    """The run locked, the id of its running attempt ``attempt``, and the tool's rule
    in the registry (``registry.rule_subquery``; None for a tool not registered).

    The attempt's id and the tool's rule come with the lock (no query of their own
    on the API's hot write path): the attempt existed before this request could name
    its number, and the registry is read as it is when the run's lock is granted.
    """
    # order_by(): (run, number) is unique, and Attempt's default ordering would join
    # the run again and sort, for one row.
    same = Attempt.objects.filter(run_id=OuterRef("pk"), number=attempt).order_by()
    attempt_id = same.values("pk")[:1]
    locked = Run.objects.select_for_update(of=("self",)).annotate(
        attempt_id=Subquery(attempt_id), tool_rule=rule_subquery(tool)
    )
    try:
        run = locked.get(pk=run_id, agent=agent)
    except Run.DoesNotExist:
        raise NotFound("No such run for this agent.") from None
    require_current_and_running(run, attempt)
    return run, run.attempt_id, run.tool_rule


def _last_seq(attempt_id: Any):
    """The attempt's last call number, as a subquery.

    Read after the run's lock, by a statement that starts after it: a statement
    that waited for the lock still reads other tables as they were when it began
    (READ COMMITTED), so it would miss the call the lock's holder just committed.
    Every call takes the run's lock, so none commits after this statement began."""
    return Call.objects.filter(attempt_id=attempt_id).order_by("-seq").values("seq")[:1]


def _next_seq(attempt_id: Any) -> int:
    last = _last_seq(attempt_id).first()
    return (last["seq"] if last else 0) + 1


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
    savepoint: bool = True,
) -> Recorded:
    """Record a tool call before it is made, and answer what to do (api.md, ``/calls``).

    1. Lock the run; the attempt must be its current running one. The tool's rule
       in the registry comes with the lock; a tool not registered is registered
       from this call (refused under the agent's ``closed`` mode).
    2. The effective rule (runs/policies.py): the stricter of the call, the tool's
       declaration in force and its policy. A read of a tool that is an effect is
       recorded as an effect; a read is journaled and executes.
    3. An effect finds its effect by key (creating it, race-safely, if the key is
       new), or creates an unkeyed one. A new effect opens as ``policies.gate``
       says (blocked, held, approved by the policy, awaiting, or claimed); a
       restarted attempt's new key is checked for drift (``drift_origin``).
    4. Other arguments become a version; what it does depends on the status (and
       never gets fewer approvers than the arguments' rule asks).
    5. The status gives the action; a claimable effect is claimed here.

    ``savepoint``: see runs/lifecycle.py's docstring.
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
    with transaction.atomic(savepoint=savepoint):
        run, attempt_id, rule = _lock_run_for_call(agent, run_id, attempt, tool)
        if rule is None:
            rule = register_from_call(
                agent,
                tool,
                kind=kind,
                key_source=key_source,
                now=now,
            )
        else:
            rule = rule_of(rule)
        call_asks = {
            "kind": kind,
            "needs_approval": needs_approval,
            "approvals_required": approvals_required,
            "approval_ttl": approval_ttl,
        }
        policy = rule["policy"]
        effective = effective_rule(
            rule["adopted"], policy, default_ttl=default_approval_ttl(), call=call_asks
        )
        # A read of a tool registered (or made by its policy) an effect is one.
        kind = effective.kind
        call = Call(
            run=run,
            attempt_id=attempt_id,
            attempt_number=attempt,
            tool=tool,
            kind=kind,
            args=args,
            args_hash=digest,
            at=now,
        )
        keep_verdict_blocked(run, call)
        if kind == CallKind.READ:
            call.seq = _next_seq(attempt_id)
            call.action = Action.EXECUTE
            call.save(force_insert=True)
            return Recorded(call, Action.EXECUTE, None)

        declared = {
            "approval_ttl": effective.approval_ttl,
            "on_expiry": effective.on_expiry,
            "timeout": timeout,
            "preview": preview or "",
        }
        args_rule = matching_rule(policy["rules"] if policy else None, args)
        gated = {
            "tool": tool,
            "rule": args_rule,
            "unconfirmed": tool_unconfirmed(agent.tool_mode, rule["state"]),
        }
        opening = gate(effective, **gated)
        effect, created, last_seq = _find_or_create_effect(
            agent,
            attempt_id,
            key,
            tool,
            run,
            now,
            lambda: _new_effect(
                agent, run, attempt, tool, key, key_source, args, digest, declared, opening, now
            ),
        )
        call.seq = _next_seq(attempt_id) if last_seq is None else last_seq + 1
        if created:
            version_adopted = True
            if key is not None and effect.key == key:
                origin = drift_origin(run, attempt, attempt_id, tool)
                if origin is not None:
                    opening = gate(effective, drift_from=origin, **gated)
                    _open(effect, opening, run, attempt, now)
                    effect.save()
            action = _record_creation(effect, opening, run, attempt, actor, now)
        else:
            if effect.tool != tool:
                raise KeyConflict(
                    f"The key {key!r} belongs to the tool {effect.tool!r}.", {"tool": effect.tool}
                )
            version_adopted = _apply_call_to_existing(
                effect, run, attempt, args, digest, actor, now, args_rule
            )
            action = _act_on_status(effect, run, attempt, actor, now)
        call.effect = effect
        call.action = action
        call.prevented_duplicate = prevents_duplicate(created, action)
        call.save(force_insert=True)
        # A new effect's arguments are its version 1 (adopted); a replay with other
        # arguments is a version too, adopted or kept as drift.
        if version_adopted is not None:
            add_version(effect, actor, now, adopted=version_adopted, call=call)
    return Recorded(call, action, effect)


def prevents_duplicate(created: bool, action: str) -> bool:
    """A call that a key kept from doing its effect again: it found an effect an
    earlier call recorded (only a key finds one: an unkeyed call always creates its
    effect) and was answered ``skip`` (the effect ran) or ``wait`` (in flight for
    another attempt, or awaiting approval). The call that records an effect waits for
    its approval too, and is no duplicate. Stored on the call
    (``Call.prevented_duplicate``) for the tools and insights pages."""
    return not created and action in (Action.SKIP, Action.WAIT)


def _record_creation(
    effect: Effect, opening: Gate, run: Run, attempt: int, actor: Actor, now: datetime
) -> str:
    """The audit trail of a new effect: recorded, decided by its policy's rule if it
    was, then claimed if it was.

    A new effect that is claimable at once is inserted already claimed by the
    recording attempt (``_open``): the same rows as an insert then a claim, one
    UPDATE fewer on the API's hot write path; the events go in one statement. A
    policy's automatic approval or block is audited as a person's decision is
    (``approved``, ``rejected``), by ``policy:<rule id>``.
    """
    claimed = effect.status == EffectStatus.IN_FLIGHT
    decided = opening.decided_by is not None
    common = {"at": now, "run": run, "effect": effect, "attempt_number": attempt}
    data = {"key": effect.key, "tool": effect.tool, "args_hash": effect.args_hash}
    if effect.hold:
        data["hold"] = effect.hold
    status = EffectStatus.AWAITING_APPROVAL if decided else effect.status
    if claimed and not decided:
        status = EffectStatus.PENDING
    events = [new_event(actor, "recorded", new_status=status, data=data, **common)]
    if decided:
        verb = "approved" if opening.status == EffectStatus.APPROVED else "rejected"
        events.append(
            new_event(
                Actor(kind="policy", label=opening.decided_by),
                verb,
                old_status=status,
                new_status=opening.status,
                note=opening.note,
                data={"final": True} if verb == "rejected" else None,
                **common,
            )
        )
        status = opening.status
    if claimed:
        events.append(
            new_event(
                actor,
                "claimed",
                old_status=status,
                new_status=EffectStatus.IN_FLIGHT,
                **common,
            )
        )
    save_events(events)  # before anything _act_on_status writes, in the audit log's order
    if claimed:
        return Action.EXECUTE
    return _act_on_status(effect, run, attempt, actor, now)


def _find_or_create_effect(
    agent: Agent,
    attempt_id: Any,
    key: str | None,
    tool: str,
    run: Run,
    now: datetime,
    new_effect: Callable[[], Effect],
) -> tuple[Effect, bool, int | None]:
    """The effect a call names (the existing one for its key, locked, or a new one),
    whether it is new, and for a key the attempt's last seq (0 for none), which
    the locked read brings along (``_last_seq``: one query fewer). ``new_effect``
    makes the call's new effect, unsaved (``_new_effect``).

    A key is inserted, or its effect read under lock (``insert_or_lock_winner``);
    the same read says whether the key has a tombstone. A new key with a tombstone
    (its run pruned, product.md rule 8: keys do not expire) is not new: the insert
    is undone and the tombstone brought back. The read is a statement after the
    insert, so it also sees the tombstone of a prune that deleted the key's old
    effect while the insert waited on it.
    """
    effect = new_effect()
    if key is None:
        effect.save(force_insert=True)
        return effect, True, None
    tombstones = KeyTombstone.objects.filter(agent_id=OuterRef("agent_id"), key=OuterRef("key"))
    same_key = Effect.objects.filter(agent=agent, key=key).annotate(
        tombstoned=Exists(tombstones), last_seq=Subquery(_last_seq(attempt_id))
    )
    found, created = insert_or_lock_winner(effect, same_key)
    last_seq = found.last_seq or 0
    if not (created and found.tombstoned):
        return found, created, last_seq
    found.delete()
    tombstone = KeyTombstone.objects.get(agent=agent, key=key)
    if tombstone.tool != tool:
        raise KeyConflict(
            f"The key {key!r} belongs to the tool {tombstone.tool!r}.", {"tool": tombstone.tool}
        )
    restored = _restore_from_tombstone(tombstone, run, now)
    if restored is not None:
        return restored, False, last_seq
    # A tombstone of a key that never ran: the call declares a fresh effect.
    return (*insert_or_lock_winner(new_effect(), same_key), last_seq)


def _new_effect(
    agent: Agent,
    run: Run,
    attempt: int,
    tool: str,
    key: str | None,
    key_source: str | None,
    args: dict,
    digest: str,
    declared: dict,
    opening: Gate,
    now: datetime,
) -> Effect:
    """A new effect of this call, not saved yet, as its rule opens it (``_open``)."""
    effect = Effect(
        agent=agent,
        run=run,
        tool=tool,
        key=key,
        key_source=key_source,
        args=args,
        args_hash=digest,
        args_versions=1,
        created_at=now,
        updated_at=now,
        **declared,
    )
    _open(effect, opening, run, attempt, now)
    return effect


def _open(effect: Effect, opening: Gate, run: Run, attempt: int, now: datetime) -> None:
    """Give a new effect the state its rule opens it in (runs/policies.py ``gate``):
    awaiting approval (held or not), rejected by a block rule, or claimable, which
    is inserted claimed by the recording attempt (approved first by an automatic
    approval), with the revision an insert and each change would have given it."""
    effect.status = opening.status
    effect.needs_approval = opening.needs_approval
    effect.approvals_required = opening.approvals_required
    effect.hold = opening.hold
    effect.revision = 1
    effect.decision = None
    effect.current_approvals = []
    effect.approval_expires_at = None
    effect.claimed_run = None
    effect.claimed_attempt = effect.claimed_at = effect.first_claimed_at = None
    effect.timeout_at = None
    if opening.status == EffectStatus.AWAITING_APPROVAL:
        set_deadline(effect, now)
        return
    if opening.status == EffectStatus.REJECTED:
        effect.decide("rejected", opening.decided_by, now, opening.note, final=True)
        effect.revision += 1
        return
    if opening.status == EffectStatus.APPROVED:
        effect.decide("approved", opening.decided_by, now, opening.note)
        effect.current_approvals = [
            {
                "by": opening.decided_by,
                "at": now.isoformat(),
                "note": opening.note,
                "args_hash": effect.args_hash,
            }
        ]
        effect.revision += 1
    set_claim(effect, run, attempt, now)
    effect.status = EffectStatus.IN_FLIGHT
    effect.revision += 1


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
        created_at=now,
        updated_at=now,
    )
    if status in (EffectStatus.REJECTED, EffectStatus.EXPIRED):
        # A pruned refusal stays a refusal: whether it was final is not kept, so it
        # is taken as final for a rejection (never performed without a person).
        effect.decide(
            "rejected" if status == EffectStatus.REJECTED else "expired",
            "system",
            tombstone.pruned_at,
            "Restored from the key's tombstone after its run was pruned.",
            final=status == EffectStatus.REJECTED,
        )
    same_key = Effect.objects.filter(agent_id=tombstone.agent_id, key=tombstone.key)
    effect, created = insert_or_lock_winner(effect, same_key)
    if not created:
        return effect  # another redelivery restored it first
    add_version(effect, SYSTEM, now)
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
    effect: Effect,
    run: Run,
    attempt: int,
    args: dict,
    digest: str,
    actor: Actor,
    now: datetime,
    args_rule: dict | None = None,
) -> bool | None:
    """Apply a replayed call to an existing effect (the caller holds its lock).

    Returns None when the arguments are the current ones, True when the new
    version was adopted, False when it was kept as drift (frozen content).
    ``args_rule``: the tool's argument rule the new arguments match; an adopted
    version never gets less approval than it asks (``_tighten``).
    """
    expire_if_past_deadline(effect, now)
    if effect.status == EffectStatus.IN_FLIGHT and not _holder_is_running(effect, run, attempt):
        make_unknown(effect, SYSTEM, now, why="The attempt that claimed it has stopped.")
    if digest == effect.args_hash:
        return None

    status = effect.status
    final_rejection = status == EffectStatus.REJECTED and bool((effect.decision or {}).get("final"))
    effect.args_versions += 1
    if status in (EffectStatus.PENDING, EffectStatus.AWAITING_APPROVAL, EffectStatus.FAILED):
        new_status = status  # awaiting approval below, if the effect needs it
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
    blocked = _tighten(effect, args_rule)
    if effect.needs_approval and new_status in (EffectStatus.PENDING, EffectStatus.FAILED):
        new_status = EffectStatus.AWAITING_APPROVAL
    if new_status == EffectStatus.AWAITING_APPROVAL and status != EffectStatus.AWAITING_APPROVAL:
        set_deadline(effect, now)
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
    if blocked:
        # The policy's block, audited as a person's rejection is (final).
        by = f"policy:{args_rule['id']}"
        effect.hold = policy_hold(effect.tool, args_rule)
        effect.decide("rejected", by, now, effect.hold["message"], final=True)
        save_effect(
            effect,
            Actor(kind="policy", label=by),
            "rejected",
            now,
            status=EffectStatus.REJECTED,
            note=effect.hold["message"],
            run=run,
            attempt_number=attempt,
            data={"final": True},
        )
    return True


def _tighten(effect: Effect, args_rule: dict | None) -> bool:
    """The new arguments of an effect under the argument rule they match: more
    approvers for a ``require`` rule, never fewer; True for a ``block`` rule (the
    caller rejects it, finally, by ``policy:<rule id>``). An ``approve`` rule
    decides nothing here: a revision waits for a person as it did."""
    if args_rule is None:
        return False
    if args_rule["action"] == "block":
        return True
    if args_rule["action"] == "require":
        required = int(args_rule.get("approvals", 1))
        if not effect.needs_approval or effect.approvals_required < required:
            effect.needs_approval = True
            effect.approvals_required = required
    return False


def _holder_is_running(effect: Effect, run: Run, attempt: int) -> bool:
    """Whether the attempt that claimed ``effect`` still runs. ``run`` is locked and
    running ``attempt`` (``_lock_run_for_call``), so a claim of this run needs no query."""
    if effect.claimed_run_id == run.pk:
        return effect.claimed_attempt == attempt
    return attempt_is_running(effect.claimed_run_id, effect.claimed_attempt)


def _act_on_status(effect: Effect, run: Run, attempt: int, actor: Actor, now: datetime) -> str:
    """The action a recorded call answers; a claimable effect is claimed by it."""
    if effect.status in CLAIMABLE_STATUSES:
        claim_for(effect, run, attempt, actor, now)
        return Action.EXECUTE
    return {
        EffectStatus.AWAITING_APPROVAL: Action.WAIT,
        EffectStatus.IN_FLIGHT: Action.WAIT,
        EffectStatus.DONE: Action.SKIP,
        EffectStatus.UNKNOWN: Action.REVIEW,
        EffectStatus.REJECTED: Action.BLOCKED,
        EffectStatus.EXPIRED: Action.BLOCKED,
    }[EffectStatus(effect.status)]
