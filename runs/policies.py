"""The rule that applies to a tool's effect, as plain functions: the one place it lives
(product.md, "Tool registry and policies" and "Key-drift hold").

- ``effective_rule``: the stricter of the tool's declaration in force, its admin's
  policy and the call's own settings.
- ``matching_rule``: the policy's first argument rule whose condition holds.
- ``gate``: what a new effect starts as (blocked, held, approved by the policy,
  awaiting approval or claimable) and why.
- ``drift_origin``: the earlier effect a restarted attempt's new key may be drifting
  from (the one query here).

runs/calls.py applies them inside ``record_call``; runs/registry.py shows the
effective rule of each tool (``GET /api/v1/tools``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from runs.canonical import NotCanonicalizable, canonical_json
from runs.models import Call, CallKind, EffectStatus, OnExpiry, ToolMode, ToolState

HOLD_KEY_DRIFT = "key_drift"
HOLD_TOOL_UNCONFIRMED = "tool_unconfirmed"
HOLD_POLICY_RULE = "policy_rule"

# The operators of argument rules, as the design writes them, and the ASCII spellings
# an admin may type instead.
OPERATORS = ("=", "≠", "<", "≤", ">", "≥", "in", "contains", "matches")
OPERATOR_ALIASES = {"==": "=", "!=": "≠", "<=": "≤", ">=": "≥"}
ACTIONS = ("require", "block", "approve")


@dataclass(frozen=True)
class Effective:
    """The rule in force for a tool (api.md, Tool ``effective``)."""

    kind: str
    needs_approval: bool
    approvals_required: int
    approval_ttl: int
    on_expiry: str
    # Why approval is required beyond what the call asked ("" when it asked for it).
    why: str = ""

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "needs_approval": self.needs_approval,
            "approvals_required": self.approvals_required,
            "approval_ttl": self.approval_ttl,
            "on_expiry": self.on_expiry,
        }


def effective_rule(
    adopted: dict | None,
    policy: dict | None,
    *,
    default_ttl: int,
    call: dict | None = None,
) -> Effective:
    """The stricter of the declaration in force (``adopted``), the policy and the call.

    Stricter: ``effect`` over ``read``, approval over none, more approvers over fewer.
    The deadline and what its expiry does are the policy's when it sets them (an
    admin's choice, neither looser nor stricter), else the call's, else the default.
    ``call``: this call's own ``kind``, ``needs_approval``, ``approvals_required``,
    ``approval_ttl`` (None for the tool's rule alone).
    """
    sources = [("call", call), ("declaration", adopted), ("policy", policy)]
    kind = CallKind.READ
    asking = []  # (source, approvals) of each source that requires approval
    for name, source in sources:
        if not source:
            continue
        if source.get("kind") == CallKind.EFFECT:
            kind = CallKind.EFFECT
        if source.get("needs_approval"):
            asking.append((name, int(source.get("approvals_required") or 1)))
    needs = bool(asking)
    approvals = max((n for _, n in asking), default=1)
    # The effect says why when the call asked for less than what applies.
    asked_by_call = dict(asking).get("call", 0)
    why = ""
    if needs and approvals > asked_by_call:
        source = next(name for name, n in reversed(asking) if n == approvals)
        why = _why(source, approvals)
    ttl = (policy or {}).get("approval_ttl") or (call or {}).get("approval_ttl") or default_ttl
    on_expiry = (policy or {}).get("on_expiry") or OnExpiry.EXPIRE
    return Effective(str(kind), needs, approvals, ttl, on_expiry, why)


def _why(source: str, approvals: int) -> str:
    who = "the tool's policy" if source == "policy" else "the tool's registered declaration"
    count = "one approval" if approvals == 1 else f"{approvals} approvals"
    return f"{who[0].upper()}{who[1:]} requires {count}."


# --- Argument rules ---------------------------------------------------------------


class _Missing:
    pass


MISSING = _Missing()


def resolve_pointer(document: Any, pointer: str) -> Any:
    """The value at ``pointer`` (RFC 6901) in ``document``, or ``MISSING``."""
    if pointer == "":
        return document
    if not pointer.startswith("/"):
        return MISSING
    value = document
    for token in pointer[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict):
            if token not in value:
                return MISSING
            value = value[token]
        elif isinstance(value, list):
            if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
                return MISSING
            index = int(token)
            if index >= len(value):
                return MISSING
            value = value[index]
        else:
            return MISSING
    return value


def _same(a: Any, b: Any) -> bool:
    """JSON equality: 1 and 1.0 are equal, true and 1 are not (canonical JSON)."""
    try:
        return canonical_json(a) == canonical_json(b)
    except NotCanonicalizable:
        return False


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ordered(actual: Any, expected: Any) -> bool:
    """Whether the two compare by order: two numbers, or two strings."""
    return (_number(actual) and _number(expected)) or (
        isinstance(actual, str) and isinstance(expected, str)
    )


def condition_holds(actual: Any, op: str, expected: Any) -> bool:
    """Whether ``actual <op> expected``. A value the pointer does not find matches
    nothing (``≠`` included): a rule is about values that are there."""
    if actual is MISSING:
        return False
    op = OPERATOR_ALIASES.get(op, op)
    if op == "=":
        return _same(actual, expected)
    if op == "≠":
        return not _same(actual, expected)
    if op in ("<", "≤", ">", "≥"):
        if not _ordered(actual, expected):
            return False
        return {
            "<": actual < expected,
            "≤": actual <= expected,
            ">": actual > expected,
            "≥": actual >= expected,
        }[op]
    if op == "in":
        return isinstance(expected, list) and any(_same(actual, item) for item in expected)
    if op == "contains":
        if isinstance(actual, str):
            return isinstance(expected, str) and expected in actual
        if isinstance(actual, list):
            return any(_same(item, expected) for item in actual)
        if isinstance(actual, dict):
            return isinstance(expected, str) and expected in actual
        return False
    if op == "matches":
        return (
            isinstance(actual, str)
            and isinstance(expected, str)
            and re.search(expected, actual) is not None
        )
    return False


def matching_rule(rules: list[dict] | None, args: dict) -> dict | None:
    """The first rule whose condition holds for ``args``: the first match wins."""
    for rule in rules or ():
        if condition_holds(resolve_pointer(args, rule["pointer"]), rule["op"], rule.get("value")):
            return rule
    return None


def rule_errors(rules: Any) -> list[str]:
    """What is wrong with a policy's rules (empty when they are well formed)."""
    if not isinstance(rules, list):
        return ["rules must be a list of rules"]
    errors = []
    seen = set()
    for n, rule in enumerate(rules, 1):
        if not isinstance(rule, dict):
            errors.append(f"rule {n}: must be an object")
            continue
        rule_id = rule.get("id")
        if not isinstance(rule_id, str) or not re.fullmatch(r"[A-Za-z0-9_.\-]{1,50}", rule_id):
            errors.append(f"rule {n}: id must be 1–50 letters, digits, '_', '.', '-'")
        elif rule_id in seen:
            errors.append(f"rule {n}: id {rule_id!r} is used twice")
        seen.add(rule_id)
        pointer = rule.get("pointer")
        if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
            errors.append(f"rule {n}: pointer must be a JSON Pointer ('' or starting with '/')")
        op = OPERATOR_ALIASES.get(rule.get("op"), rule.get("op"))
        if op not in OPERATORS:
            errors.append(f"rule {n}: op must be one of {' '.join(OPERATORS)}")
        elif op == "in" and not isinstance(rule.get("value"), list):
            errors.append(f"rule {n}: 'in' needs a list value")
        elif op == "matches":
            try:
                re.compile(rule.get("value"))
            except (TypeError, re.error):
                errors.append(f"rule {n}: 'matches' needs a valid regular expression")
        if rule.get("action") not in ACTIONS:
            errors.append(f"rule {n}: action must be one of {', '.join(ACTIONS)}")
        elif rule["action"] == "require" and rule.get("approvals", 1) not in (1, 2, 3):
            errors.append(f"rule {n}: approvals must be 1, 2 or 3")
    return errors


# --- What a new effect starts as --------------------------------------------------


@dataclass(frozen=True)
class Gate:
    """What a new effect starts as, and why."""

    # awaiting_approval, approved (by the policy), rejected (blocked), or pending
    status: str
    needs_approval: bool
    approvals_required: int
    hold: dict | None = None
    # "policy:<rule id>" when an argument rule approved or blocked it.
    decided_by: str | None = None
    note: str = ""


def hold(reason: str, message: str, effect_id: Any = None) -> dict:
    """The Effect's ``hold`` object (api.md, "Additions in v1")."""
    return {
        "reason": reason,
        "message": message,
        "effect_id": str(effect_id) if effect_id is not None else None,
    }


def policy_hold(tool: str, rule: dict) -> dict:
    """The hold of an effect a ``block`` rule refused."""
    return hold(HOLD_POLICY_RULE, f"Blocked by the policy of {tool}, rule {rule['id']}.")


def tool_unconfirmed(mode: str, state: str | None) -> bool:
    """Under ``confirm`` mode, a tool not confirmed in its current declaration."""
    return mode == ToolMode.CONFIRM and state != ToolState.CONFIRMED


def gate(
    effective: Effective,
    *,
    tool: str,
    rule: dict | None = None,
    drift_from: Any = None,
    unconfirmed: bool = False,
) -> Gate:
    """What a new effect starts as. In this order, the first that applies:

    1. A ``block`` rule: rejected (finally) by ``policy:<rule id>``.
    2. A key drift (``drift_from``, the earlier effect): held for a person.
    3. An unconfirmed tool under ``confirm`` mode: held until an admin confirms it.
    4. An ``approve`` rule: approved by ``policy:<rule id>`` (the one exception to
       "the stricter rule applies": an admin decided it in advance).
    5. A ``require`` rule, or the effective rule's approval: awaiting approval (held
       with ``policy_rule`` when the call itself asked for less).
    6. Otherwise claimable (``pending``).

    A held effect keeps the approval its rule asks for: once the hold is lifted (the
    tool confirmed) or decided (a person approves the drifted key), that applies.
    """
    needs, approvals = effective.needs_approval, effective.approvals_required
    action = rule["action"] if rule else None
    by = f"policy:{rule['id']}" if rule else None
    if action == "block":
        held = policy_hold(tool, rule)
        return Gate(EffectStatus.REJECTED, needs, approvals, held, by, held["message"])
    if action == "require":
        required = int(rule.get("approvals", 1))
        approvals = max(approvals, required) if needs else required
        needs = True
    if drift_from is not None:
        message = (
            f"A new key for {tool} in a restarted attempt, while an earlier attempt's effect "
            "of the tool under another key was done or left unknown: is it the same thing?"
        )
        return Gate(
            EffectStatus.AWAITING_APPROVAL,
            needs,
            approvals,
            hold(HOLD_KEY_DRIFT, message, drift_from),
        )
    if unconfirmed:
        message = f"The tool {tool} is new or changed: it waits until an admin confirms it."
        return Gate(
            EffectStatus.AWAITING_APPROVAL, needs, approvals, hold(HOLD_TOOL_UNCONFIRMED, message)
        )
    if action == "approve":
        return Gate(
            EffectStatus.APPROVED,
            True,
            1,
            None,
            by,
            f"Approved automatically by the policy of {tool}, rule {rule['id']}.",
        )
    if action == "require":
        message = (
            f"The policy of {tool}, rule {rule['id']}, requires "
            f"{'one approval' if approvals == 1 else f'{approvals} approvals'}."
        )
        return Gate(
            EffectStatus.AWAITING_APPROVAL, True, approvals, hold(HOLD_POLICY_RULE, message)
        )
    if needs:
        held = hold(HOLD_POLICY_RULE, effective.why) if effective.why else None
        return Gate(EffectStatus.AWAITING_APPROVAL, True, approvals, held)
    return Gate(EffectStatus.PENDING, False, 1)


# --- Key drift --------------------------------------------------------------------


def drift_origin(run: Any, attempt: int, attempt_id: Any, tool: str) -> Any:
    """The earlier effect a restarted attempt's new key of ``tool`` may be drifting
    from, or None (product.md, "Key-drift hold").

    An effect of the same tool under another key, done or left unknown by an earlier
    attempt of the same run, that this attempt has not named (no call of its own
    points to it). The earliest such one, in journal order. Only a restarted
    attempt's new key asks (attempt 1 has nothing earlier): one query then. The key
    made a new effect, so no effect of the run has it: "another key" needs no
    condition of its own.
    """
    if attempt <= 1:
        return None
    named = Call.objects.filter(attempt_id=attempt_id, effect_id__isnull=False).values("effect_id")
    return (
        Call.objects.filter(
            run=run,
            attempt_number__lt=attempt,
            tool=tool,
            effect__key__isnull=False,
            effect__status__in=(EffectStatus.DONE, EffectStatus.UNKNOWN),
        )
        .exclude(effect_id__in=named)
        .order_by("attempt_number", "seq")
        .values_list("effect_id", flat=True)
        .first()
    )
