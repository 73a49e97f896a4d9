"""The contract's objects (api.md "Objects") as plain dicts, built without extra queries.

Shared by the API and anything else that shows the journal as JSON.
"""

from __future__ import annotations

from datetime import datetime

from runs.models import Attempt, Call, Effect, Run


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def run_dict(run: Run) -> dict:
    return {
        "id": str(run.pk),
        "run_key": run.run_key,
        "title": run.title,
        "input": run.input,
        "status": run.status,
        "restart_policy": run.restart_policy,
        "heartbeat_timeout": run.heartbeat_timeout,
        "heartbeat_at": _time(run.heartbeat_at),
        "current_attempt": run.current_attempt,
        "restart_ready": run.restart_ready,
        "restart_url": run.restart_url,
        "created_at": _time(run.created_at),
        "updated_at": _time(run.updated_at),
    }


def attempt_dict(attempt: Attempt) -> dict:
    return {
        "number": attempt.number,
        "status": attempt.status,
        "started_at": _time(attempt.started_at),
        "ended_at": _time(attempt.ended_at),
        "started_by": attempt.started_by,
        "reason": attempt.reason,
        "agent_version": attempt.agent_version,
        "verdict_at_start": attempt.verdict_at_start,
        "error": attempt.error,
    }


def effect_dict(effect: Effect) -> dict:
    return {
        "id": str(effect.pk),
        "run_id": str(effect.run_id),
        "tool": effect.tool,
        "key": effect.key,
        "key_source": effect.key_source,
        "needs_approval": effect.needs_approval,
        "approvals_required": effect.approvals_required,
        "approvals": effect.current_approvals,
        "timeout": effect.timeout,
        "status": effect.status,
        "args": effect.args,
        "args_hash": effect.args_hash,
        "args_versions": effect.args_versions,
        "preview": effect.preview or None,
        "result": effect.result,
        "error": effect.error,
        "claimed_by": effect.claimed_by,
        "approval_expires_at": _time(effect.approval_expires_at),
        "decision": effect.decision,
        "revision": effect.revision,
        "created_at": _time(effect.created_at),
        "updated_at": _time(effect.updated_at),
    }


def call_dict(call: Call) -> dict:
    return {
        "id": str(call.pk),
        "attempt": call.attempt_number,
        "seq": call.seq,
        "tool": call.tool,
        "kind": call.kind,
        "args_hash": call.args_hash,
        "action": call.action,
        "effect_id": str(call.effect_id) if call.effect_id else None,
        "at": _time(call.at),
    }


def journal_of(run: Run) -> tuple[list[dict], list[dict]]:
    """The run's whole journal in order, and the effects it points to (two queries)."""
    calls = list(Call.objects.filter(run=run).order_by("attempt_number", "seq"))
    effect_ids = {call.effect_id for call in calls if call.effect_id}
    effects = Effect.objects.filter(pk__in=effect_ids).order_by("created_at") if effect_ids else []
    return [call_dict(c) for c in calls], [effect_dict(e) for e in effects]
