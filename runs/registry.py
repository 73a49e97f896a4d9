"""The tool registry: what each agent's tools declared, and the declaration in force
(product.md, "Tool registry and policies"; api.md ``POST /api/v1/tools``).

A tool is (agent, name). Its first declaration registers it, from ``POST /tools`` or
from the first call of an undeclared tool. A later different declaration is a
*change*: kept in the tool's history and shown, and adopted only where it is
stricter (``adopted`` keeps the stricter of the two) until an admin confirms it.
The rule the declaration feeds is runs/policies.py's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, JSONField, OuterRef, Subquery
from django.db.models.functions import JSONObject
from django.utils import timezone

from runs.audit import Actor, new_event
from runs.canonical import args_hash
from runs.errors import ToolNotRegistered
from runs.lifecycle import insert_or_lock_winner, released_status, save_effect
from runs.models import (
    Agent,
    Call,
    CallKind,
    Effect,
    EffectStatus,
    Tool,
    ToolDeclaration,
    ToolMode,
    ToolPolicy,
    ToolState,
)
from runs.policies import (
    HOLD_TOOL_UNCONFIRMED,
    Effective,
    Gate,
    effective_rule,
    gate,
    matching_rule,
)

DECLARATION_FIELDS = (
    "kind",
    "key_source",
    "needs_approval",
    "approvals_required",
    "schema",
    "annotations",
)


def declaration(
    *,
    kind: str,
    key_source: str | None = None,
    needs_approval: bool = False,
    approvals_required: int = 1,
    schema: dict | None = None,
    annotations: dict | None = None,
) -> dict:
    """A declaration in its one form: every field, approvals 1 without approval."""
    return {
        "kind": str(kind),
        "key_source": key_source,
        "needs_approval": bool(needs_approval),
        "approvals_required": approvals_required if needs_approval else 1,
        "schema": schema,
        "annotations": annotations,
    }


def fingerprint(decl: dict) -> str:
    """SHA-256 of the declaration's canonical JSON (RFC 8785, as ``args_hash``)."""
    return args_hash(decl)


def stricter(adopted: dict, new: dict) -> dict:
    """``new`` where it is not looser than ``adopted``: the declaration a change brings
    into force before an admin confirms it. ``effect`` stays an effect, approval stays
    required, approvers never fewer; the rest (key source, schema, annotations) is
    descriptive and follows the latest declaration. Both are in ``declaration``'s
    form, where a declaration without approval has ``approvals_required`` 1."""
    needs = adopted["needs_approval"] or new["needs_approval"]
    approvals = max(adopted["approvals_required"], new["approvals_required"])
    kind = CallKind.EFFECT if CallKind.EFFECT in (adopted["kind"], new["kind"]) else CallKind.READ
    return {**new, "kind": str(kind), "needs_approval": needs, "approvals_required": approvals}


def _new_tool(agent: Agent, name: str, decl: dict, now: datetime) -> Tool:
    digest = fingerprint(decl)
    return Tool(
        agent=agent,
        name=name,
        declaration=decl,
        fingerprint=digest,
        adopted=decl,
        adopted_fingerprint=digest,
        state=ToolState.REGISTERED,
        created_at=now,
        updated_at=now,
    )


def _keep_in_history(tool: Tool, source: str, now: datetime) -> None:
    """The tool's current declaration as a row of its history, once per fingerprint."""
    ToolDeclaration.objects.bulk_create(
        [
            ToolDeclaration(
                tool=tool,
                fingerprint=tool.fingerprint,
                declaration=tool.declaration,
                source=source,
                first_seen_at=now,
            )
        ],
        ignore_conflicts=True,
    )


def _register(agent: Agent, name: str, decl: dict, source: str, now: datetime) -> tuple[Tool, bool]:
    """The agent's tool ``name``, locked, registered with ``decl`` unless it exists
    (concurrent first declarations make one row: the unique constraint decides)."""
    tool, created = insert_or_lock_winner(
        _new_tool(agent, name, decl, now), Tool.objects.filter(agent=agent, name=name)
    )
    if created:
        _keep_in_history(tool, source, now)
    return tool, created


def _apply_declaration(tool: Tool, decl: dict, now: datetime) -> None:
    """Record ``decl`` for a registered, locked tool.

    The same declaration again changes nothing. Another one is a change: kept in
    the history, shown as ``changed``, and adopted only where it is stricter. The
    declaration in force declared again (an agent back on its confirmed version)
    clears the change.
    """
    digest = fingerprint(decl)
    if digest == tool.fingerprint:
        return
    tool.declaration = decl
    tool.fingerprint = digest
    if digest == tool.adopted_fingerprint:
        tool.state = ToolState.CONFIRMED if tool.confirmed_at else ToolState.REGISTERED
    else:
        tool.adopted = stricter(tool.adopted, decl)
        tool.state = ToolState.CHANGED
    tool.updated_at = now
    tool.save(update_fields=["declaration", "fingerprint", "adopted", "state", "updated_at"])
    _keep_in_history(tool, "declared", now)


def declare_tools(agent: Agent, declarations: list[dict], *, now: datetime | None = None) -> list:
    """``POST /api/v1/tools``: register new tools, record changed declarations.

    ``declarations``: ``{"name", **declaration fields}``. In name order, so that
    two concurrent declarations of the same tools lock them in one order. Under the
    ``closed`` mode an unregistered tool is refused (409 ``tool_not_registered``)
    and nothing is registered: only an admin adds tools. Returns the tools with
    their policies, in the order asked.
    """
    now = now or timezone.now()
    names = [d["name"] for d in declarations]
    with transaction.atomic():
        if agent.tool_mode == ToolMode.CLOSED:
            known = set(
                Tool.objects.filter(agent=agent, name__in=names).values_list("name", flat=True)
            )
            missing = [n for n in names if n not in known]
            if missing:
                raise _not_registered(missing[0])
        # A name declared twice is declared twice, in the order sent (a stable sort).
        for asked in sorted(declarations, key=lambda d: d["name"]):
            decl = declaration(**{f: asked[f] for f in DECLARATION_FIELDS if f in asked})
            tool, created = _register(agent, asked["name"], decl, "declared", now)
            if not created:
                _apply_declaration(tool, decl, now)
    tools = {t.name: t for t in with_policy(Tool.objects.filter(agent=agent, name__in=names))}
    return [tools[name] for name in names]


def _not_registered(name: str) -> ToolNotRegistered:
    """Under ``closed`` mode only an admin adds tools (api.md: 409, ``details.tool``)."""
    return ToolNotRegistered(
        f"The tool {name!r} is not registered, and this agent takes no new tools.",
        {"tool": name},
    )


def with_policy(tools):
    """Tools with their policy in the same query (``tool.policy`` raises without one)."""
    return tools.select_related("policy")


def register_from_call(
    agent: Agent,
    name: str,
    *,
    kind: str,
    key_source: str | None,
    now: datetime,
) -> dict:
    """The first call of an undeclared tool registers it from the call itself; its
    rule (``rule_of``). Under ``closed`` it is refused instead.

    The call declares the tool's kind and key source. Its approval is not declared
    for the tool: a call's ``needs_approval`` is its effect's (api.md: the first call
    naming a key declares the effect), and agents ask for approval per effect (a big
    campaign, not a small one). Binding every later call to the first one's would
    make the rule depend on which call came first; approval for every call of a tool
    is declared (``POST /tools``) or set by an admin's policy.
    """
    if agent.tool_mode == ToolMode.CLOSED:
        raise _not_registered(name)
    decl = declaration(kind=kind, key_source=key_source)
    tool, _ = _register(agent, name, decl, "call", now)
    # A tool registered a moment ago has no policy: an admin sets it on a row that exists.
    return {"state": tool.state, "adopted": tool.adopted, "policy": None}


# --- The rule of a tool, joined into the call's first statement ----------------------

# What an admin sets in a policy (the admin's form and the console's edit these).
POLICY_FIELDS = (
    "kind",
    "needs_approval",
    "approvals_required",
    "approval_ttl",
    "on_expiry",
    "rules",
)
_POLICY_FIELDS = ("id", *POLICY_FIELDS)


def rule_subquery(tool: str) -> Subquery:
    """The tool's state, declaration in force and policy, as one JSON value, for a
    statement on a row with an ``agent_id`` (runs/calls.py joins it into the run's
    lock): the registry costs the call path no query of its own. Null when the agent
    has no such tool."""
    policy = JSONObject(**{field: F(f"policy__{field}") for field in _POLICY_FIELDS})
    rows = Tool.objects.filter(agent_id=OuterRef("agent_id"), name=tool).order_by()
    return Subquery(
        rows.values(rule=JSONObject(state="state", adopted="adopted", policy=policy))[:1],
        output_field=JSONField(),
    )


def rule_of(rule: dict) -> dict:
    """``rule_subquery``'s value with ``policy`` None when the tool has none.

    SQLite's ``json_object`` (the embedded default) embeds a JSON column as its
    text, where PostgreSQL's ``jsonb_build_object`` nests the value: decoded here."""
    adopted, policy = _nested(rule["adopted"]), rule.get("policy")
    if policy is not None:
        policy = None if policy.get("id") is None else {**policy, "rules": _nested(policy["rules"])}
    return {**rule, "adopted": adopted, "policy": policy}


def _nested(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def policy_dict(policy: ToolPolicy | None) -> dict | None:
    if policy is None:
        return None
    return {field: getattr(policy, field) for field in POLICY_FIELDS}


def tool_policy(tool: Tool) -> ToolPolicy | None:
    try:
        return tool.policy
    except ToolPolicy.DoesNotExist:
        return None


def effective_of(tool: Tool) -> Effective:
    """The tool's effective rule, as ``GET /api/v1/tools`` shows it (without a call's
    arguments: argument rules apply per call)."""
    return effective_rule(
        tool.adopted,
        policy_dict(tool_policy(tool)),
        default_ttl=settings.STARTSAFE["APPROVAL_TTL"],
    )


def policy_of(tool: Tool) -> dict | None:
    """The policy as the Tool object shows it (api.md: an object or null)."""
    policy = tool_policy(tool)
    if policy is None:
        return None
    return {**policy_dict(policy), "updated_at": policy.updated_at.isoformat()}


# --- Trying a policy before it is saved -----------------------------------------------

TRIAL_CALLS = 100


@dataclass(frozen=True)
class Trial:
    """What a policy would have done to one past call: ``opening`` is ``gate``'s answer
    (None for a read, which is never gated), ``rule`` the argument rule that matched."""

    call: Call
    rule: dict | None
    opening: Gate | None


def try_policy(tool: Tool, policy: dict, *, limit: int = TRIAL_CALLS) -> list[Trial]:
    """What ``policy`` (``policy_dict``'s shape, not saved) would have done to the
    tool's last ``limit`` calls, newest first: each call's arguments through the rule
    record_call applies (``effective_rule``, ``matching_rule``, ``gate``) with the
    declaration in force and the kind the call was recorded with.

    Only the policy is tried: a key drift or an unconfirmed tool holds an effect
    whatever its policy, and is left out; so is the approval a call asked for itself
    (the journal keeps what its effect became, not what the call asked)."""
    calls = (
        Call.objects.filter(run__agent_id=tool.agent_id, tool=tool.name)
        .only("id", "run_id", "attempt_number", "seq", "kind", "args", "args_hash", "action")
        .order_by("-at", "-id")[:limit]
    )
    default_ttl = settings.STARTSAFE["APPROVAL_TTL"]
    trials = []
    for call in calls:
        effective = effective_rule(
            tool.adopted, policy, default_ttl=default_ttl, call={"kind": call.kind}
        )
        if effective.kind == CallKind.READ:
            trials.append(Trial(call, None, None))
            continue
        rule = matching_rule(policy.get("rules"), call.args)
        trials.append(Trial(call, rule, gate(effective, tool=tool.name, rule=rule)))
    return trials


# --- Admins ----------------------------------------------------------------------


def confirm_tool(user, tool_id: Any, *, now: datetime | None = None) -> Tool:
    """An admin confirms a tool's latest declaration: it comes into force as declared
    (looser parts included: a person accepted them), and the effects held until
    then (``tool_unconfirmed``) go on: awaiting approval if their rule asks for it,
    else claimable. Audited, the tool's event and each effect's."""
    now = now or timezone.now()
    actor = Actor.for_user(user)
    with transaction.atomic():
        tool = Tool.objects.select_for_update().get(pk=tool_id)
        old_state = tool.state
        tool.adopted = tool.declaration
        tool.adopted_fingerprint = tool.fingerprint
        tool.state = ToolState.CONFIRMED
        tool.confirmed_by = user
        tool.confirmed_at = now
        tool.updated_at = now
        tool.save()
        _tool_event(
            actor,
            "tool_confirmed",
            tool,
            now,
            old_status=old_state,
            new_status=tool.state,
            data={"fingerprint": tool.fingerprint},
        )
        held = Effect.objects.select_for_update().filter(
            agent_id=tool.agent_id,
            tool=tool.name,
            status=EffectStatus.AWAITING_APPROVAL,
            hold__reason=HOLD_TOOL_UNCONFIRMED,
        )
        for effect in held.order_by("created_at"):
            effect.hold = None
            status = (
                EffectStatus.AWAITING_APPROVAL if effect.needs_approval else released_status(effect)
            )
            if status != EffectStatus.AWAITING_APPROVAL:
                effect.approval_expires_at = None
            save_effect(
                effect,
                actor,
                "tool_confirmed",
                now,
                status=status,
                note=f"The tool {tool.name} was confirmed.",
            )
    return tool


def save_policy(user, policy: ToolPolicy, *, now: datetime | None = None) -> ToolPolicy:
    """An admin saves a tool's policy (the Django admin and the console's tool page):
    who and when on the row, and the change in the audit log, in one transaction."""
    now = now or timezone.now()
    created = policy._state.adding
    policy.updated_by = user
    policy.updated_at = now
    with transaction.atomic():
        policy.save()
        record_policy_change(user, policy, created=created, now=now)
    return policy


def record_policy_change(
    user, policy: ToolPolicy, *, created: bool, now: datetime | None = None
) -> None:
    """Every policy change is in the audit log (``save_policy`` calls this)."""
    _tool_event(
        Actor.for_user(user),
        "policy_created" if created else "policy_changed",
        policy.tool,
        now or timezone.now(),
        data={"policy": policy_dict(policy)},
    )


def _tool_event(
    actor: Actor, verb: str, tool: Tool, now: datetime, *, data: dict, **fields
) -> None:
    """An audit event about a tool: its agent's, naming the tool."""
    event = new_event(actor, verb, at=now, data={"tool": tool.name, **data}, **fields)
    event.agent_id = tool.agent_id
    event.save(force_insert=True)
