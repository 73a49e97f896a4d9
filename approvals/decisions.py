"""People's decisions on effects and runs (product.md, "Which action is allowed").

Each decision names the ``args_hash`` the operator was shown; one made for a hash
that is no longer current is refused (``StaleArgs``), so what runs is exactly what
a person saw. Checks go in the console's order: permission, then state, then hash.
An awaiting effect past its deadline counts as expired for every action: it is
recorded ``expired`` (by the system) and the decision is refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from approvals.models import Approval
from runs.audit import Actor, record_event
from runs.canonical import args_hash as compute_args_hash
from runs.errors import Forbidden, InvalidRequest, NotAllowed, NotFound, StaleArgs
from runs.lifecycle import (
    add_version,
    clear_claim,
    expire_if_past_deadline,
    is_past_deadline,
    released_status,
    save_effect,
    set_run_status,
)
from runs.models import Effect, EffectStatus, Run, RunStatus
from runs.policies import HOLD_TOOL_UNCONFIRMED

DECIDE_PERMISSION = "approvals.decide"

# Which effect action is allowed from which status: product.md's table, written only
# here. The rules below check it under the effect's lock (a 409 otherwise);
# ``allowed_actions`` answers from it which buttons the console shows.
EFFECT_ACTION_STATUSES = {
    "approve": (EffectStatus.AWAITING_APPROVAL,),
    "reject": (EffectStatus.AWAITING_APPROVAL, EffectStatus.APPROVED, EffectStatus.UNKNOWN),
    "mark_done": (
        EffectStatus.AWAITING_APPROVAL,
        EffectStatus.APPROVED,
        EffectStatus.FAILED,
        EffectStatus.UNKNOWN,
    ),
    "release": (EffectStatus.UNKNOWN,),
}
# Allow restart and abandon: a run that stopped without finishing.
RUN_ACTION_STATUSES = (RunStatus.INTERRUPTED, RunStatus.FAILED)


def can_decide(user) -> bool:
    return bool(user and user.is_active and user.has_perm(DECIDE_PERMISSION))


def has_approved(effect: Effect, label: str) -> bool:
    """Whether the operator ``label`` approved the effect's current version (one
    approval per operator per version: the two-person rule)."""
    return any(a["by"] == label for a in effect.current_approvals or [])


def allowed_actions(effect: Effect, user, now: datetime) -> frozenset[str]:
    """The actions ``user`` may take on ``effect`` at ``now``.

    ``approve``, ``reject``, ``mark_done`` and ``release`` as product.md's table
    allows them, and ``edit`` (approve with edits) wherever approving is allowed by
    the status: an operator who approved this version may not approve it again, but
    may edit it into a new one, which needs their approval again. Nothing for a user
    without the operator role, nor for an awaiting effect past its deadline (it
    counts as expired for every action). The console shows a button for each, and
    the editor refuses (409) without ``edit``.
    """
    if not can_decide(user) or is_past_deadline(effect, now):
        return frozenset()
    allowed = {
        action for action, statuses in EFFECT_ACTION_STATUSES.items() if effect.status in statuses
    }
    if waits_for_admin(effect):
        allowed.discard("approve")
    if "approve" in allowed:
        allowed.add("edit")
        if has_approved(effect, Actor.for_user(user).label):
            allowed.discard("approve")
    return frozenset(allowed)


def waits_for_admin(effect: Effect) -> bool:
    """Held until an admin confirms its tool (``confirm`` mode): no approval lets it
    through before that, or the confirmation would mean nothing. Reject and mark done
    still may."""
    return (effect.hold or {}).get("reason") == HOLD_TOOL_UNCONFIRMED


def allowed_run_actions(run: Run, user) -> frozenset[str]:
    """``allow_restart`` and ``abandon`` for an operator while the run is stopped."""
    if can_decide(user) and run.status in RUN_ACTION_STATUSES:
        return frozenset(("allow_restart", "abandon"))
    return frozenset()


def _require_decider(user) -> Actor:
    if not can_decide(user):
        raise Forbidden("You may not decide: this needs the operator role.")
    return Actor.for_user(user)


def _require_note(note: str) -> str:
    note = (note or "").strip()
    if not note:
        raise InvalidRequest(
            "A note is required for this decision.", {"fields": {"note": "required"}}
        )
    return note


def _lock_effect(effect_id: Any) -> Effect:
    effect = Effect.objects.select_for_update().filter(pk=effect_id).first()
    if effect is None:
        raise NotFound("No such effect.")
    return effect


def _decide_effect(effect_id: Any, user, args_hash: str, action: str, now: datetime, decide):
    """Lock the effect, check expiry, status and hash, then apply ``decide``.

    1. Permission first (403), then the effect (404).
    2. An awaiting effect past its deadline is recorded expired; that change is
       committed, then the decision is refused (409).
    3. A status the table does not allow is 409; a stale hash is 409.
    """
    # A malformed request is 400 before anything else (product.md: checked first).
    if not args_hash:
        raise InvalidRequest("args_hash is required.", {"fields": {"args_hash": "required"}})
    actor = _require_decider(user)
    refusal = None
    with transaction.atomic():
        effect = _lock_effect(effect_id)
        if expire_if_past_deadline(effect, now):
            refusal = NotAllowed(
                "The approval deadline passed: the effect expired.", {"status": effect.status}
            )
        elif effect.status not in EFFECT_ACTION_STATUSES[action]:
            raise NotAllowed(
                f"This action is not allowed while the effect is {effect.status}.",
                {"status": effect.status},
            )
        elif args_hash != effect.args_hash:
            raise StaleArgs(
                "The arguments changed since you saw them: review the new content.",
                {"status": effect.status, "args_hash": effect.args_hash},
            )
        else:
            decide(effect, actor)
    if refusal is not None:
        raise refusal
    return effect


def approve_effect(
    user,
    effect_id: Any,
    *,
    args_hash: str,
    note: str = "",
    edited_args: dict | None = None,
    now: datetime | None = None,
) -> Effect:
    """Approve the version the operator saw, optionally after editing it.

    An edit is a new version authored by the operator; older approvals stop
    counting. The effect becomes ``approved`` once ``approvals_required`` distinct
    operators approved the current version.
    """
    now = now or timezone.now()
    note = (note or "").strip()
    # Invalid edited arguments are a 400, checked before permission and state.
    if edited_args is not None and not isinstance(edited_args, dict):
        raise InvalidRequest(
            "The edited arguments must be a JSON object.", {"fields": {"args": "object"}}
        )

    def decide(effect: Effect, actor: Actor) -> None:
        if waits_for_admin(effect):
            raise NotAllowed(
                "The tool is new or changed: an admin must confirm it first.",
                {"status": effect.status, "hold": effect.hold},
            )
        if edited_args is not None:
            edited_hash = compute_args_hash(edited_args)
            if edited_hash != effect.args_hash:
                effect.args = edited_args
                effect.args_hash = edited_hash
                effect.args_versions += 1
                effect.current_approvals = []
                add_version(effect, actor, now)
                save_effect(
                    effect,
                    actor,
                    "args_edited",
                    now,
                    note=note,
                    data={"args_hash": edited_hash, "previous_args_hash": args_hash},
                )
        # The effect's lock serialises approvals, so current_approvals is the truth
        # about the current version; it is what guards one approval per operator.
        if has_approved(effect, actor.label):
            raise NotAllowed("You already approved this version.", {"status": effect.status})
        try:
            with transaction.atomic():
                Approval.objects.create(
                    effect=effect, user=user, args_hash=effect.args_hash, note=note, at=now
                )
        except IntegrityError:
            # This operator approved the same content in an earlier version (v1, then
            # v2, then v1 again). That approval stopped counting when v2 came, so the
            # new version needs theirs again: refresh the row instead of refusing.
            Approval.objects.filter(effect=effect, user=user, args_hash=effect.args_hash).update(
                note=note, at=now
            )
        effect.current_approvals = [
            *effect.current_approvals,
            {"by": actor.label, "at": now.isoformat(), "note": note, "args_hash": effect.args_hash},
        ]
        if len(effect.current_approvals) >= effect.approvals_required:
            effect.decide("approved", actor.label, now, note)
            save_effect(effect, actor, "approved", now, status=EffectStatus.APPROVED, note=note)
        else:
            save_effect(
                effect,
                actor,
                "approval_added",
                now,
                note=note,
                data={
                    "approvals": len(effect.current_approvals),
                    "required": effect.approvals_required,
                },
            )

    return _decide_effect(effect_id, user, args_hash, "approve", now, decide)


def reject_effect(
    user,
    effect_id: Any,
    *,
    args_hash: str,
    note: str,
    final: bool = False,
    now: datetime | None = None,
) -> Effect:
    """Reject: it never executes. Unless ``final``, a revision asks again."""
    now = now or timezone.now()
    note = _require_note(note)

    def decide(effect: Effect, actor: Actor) -> None:
        effect.decide("rejected", actor.label, now, note, final=final)
        save_effect(
            effect,
            actor,
            "rejected",
            now,
            status=EffectStatus.REJECTED,
            note=note,
            data={"final": final},
        )

    return _decide_effect(effect_id, user, args_hash, "reject", now, decide)


def mark_effect_done(
    user,
    effect_id: Any,
    *,
    args_hash: str,
    note: str,
    result: Any = None,
    now: datetime | None = None,
) -> Effect:
    """It happened (or a person did it): ``done``, with the note (and result) as outcome."""
    now = now or timezone.now()
    note = _require_note(note)

    def decide(effect: Effect, actor: Actor) -> None:
        effect.decide("marked_done", actor.label, now, note)
        if result is not None:
            effect.result = result
        # Done is the outcome now; the failure a failed effect had stays in its
        # audit trail (as a retry's claim clears it too).
        effect.error = None
        effect.timeout_at = None
        save_effect(
            effect,
            actor,
            "marked_done",
            now,
            status=EffectStatus.DONE,
            note=note,
            data={"result": result},
        )

    return _decide_effect(effect_id, user, args_hash, "mark_done", now, decide)


def release_effect(
    user, effect_id: Any, *, args_hash: str, note: str, now: datetime | None = None
) -> Effect:
    """It did not happen: an unknown effect may be claimed again."""
    now = now or timezone.now()
    note = _require_note(note)

    def decide(effect: Effect, actor: Actor) -> None:
        effect.decide("released", actor.label, now, note)
        clear_claim(effect)
        save_effect(effect, actor, "released", now, status=released_status(effect), note=note)

    return _decide_effect(effect_id, user, args_hash, "release", now, decide)


def _decide_run(run_id: Any, user, decide) -> Run:
    actor = _require_decider(user)
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(pk=run_id).first()
        if run is None:
            raise NotFound("No such run.")
        if run.status not in RUN_ACTION_STATUSES:
            raise NotAllowed(
                f"This action is not allowed while the run is {run.status}.",
                {"status": run.status},
            )
        decide(run, actor)
    return run


def allow_restart(user, run_id: Any, *, note: str, now: datetime | None = None) -> Run:
    """An override the next start consumes, whatever the verdict; the run is handed back."""
    now = now or timezone.now()
    note = _require_note(note)

    def decide(run: Run, actor: Actor) -> None:
        run.override_by = user
        run.override_at = now
        run.override_note = note
        run.restart_ready = True
        run.updated_at = now
        run.save()
        record_event(
            actor,
            "restart_allowed",
            at=now,
            run=run,
            attempt_number=run.current_attempt,
            old_status=run.status,
            new_status=run.status,
            note=note,
        )
        from runs.handoff import schedule_restart_handoff

        schedule_restart_handoff(run)

    return _decide_run(run_id, user, decide)


def abandon_run(user, run_id: Any, *, note: str, now: datetime | None = None) -> Run:
    """The run is given up for good; its effects keep their statuses."""
    now = now or timezone.now()
    note = _require_note(note)

    def decide(run: Run, actor: Actor) -> None:
        run.restart_ready = False
        run.override_by = None
        run.override_at = None
        run.override_note = ""
        set_run_status(run, RunStatus.ABANDONED, actor, now, note=note)

    return _decide_run(run_id, user, decide)
