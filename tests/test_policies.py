"""Tool policies (runs/policies.py): the argument rules' operators and order, the
effective rule, and how ``record_call`` applies them (product.md, "Tool registry
and policies")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import read, send, start, verbs

from approvals.decisions import approve_effect
from runs.lifecycle import expire_if_past_deadline
from runs.models import AuditEvent, EffectStatus, Tool, ToolPolicy
from runs.policies import (
    MISSING,
    condition_holds,
    effective_rule,
    matching_rule,
    resolve_pointer,
    rule_errors,
)
from runs.registry import declare_tools

# --- The plain functions ------------------------------------------------------------


@pytest.mark.parametrize(
    "actual, op, expected, holds",
    [
        (50, "=", 50.0, True),
        (True, "=", 1, False),  # JSON equality: a boolean is not a number
        ("EU", "=", "EU", True),
        ({"a": [1]}, "=", {"a": [1]}, True),
        ("EU", "≠", "US", True),
        ("EU", "!=", "EU", False),
        (49, "<", 50, True),
        (50, "<", 50, False),
        (50, "≤", 50, True),
        (51, "<=", 50, False),
        (51, ">", 50, True),
        (50, ">", 50, False),
        (50, "≥", 50, True),
        (49, ">=", 50, False),
        ("b", ">", "a", True),  # strings compare as strings
        ("60", ">", 50, False),  # a string is not a number: no order, no match
        (True, "<", 2, False),
        ("EU", "in", ["EU", "UK"], True),
        ("US", "in", ["EU", "UK"], False),
        ("winter sale", "contains", "sale", True),
        ("winter", "contains", "sale", False),
        (["a", "vip"], "contains", "vip", True),
        (["a"], "contains", "vip", False),
        ("ceo@example.com", "matches", r"^ceo@", True),
        ("cfo@example.com", "matches", r"^ceo@", False),
        (5, "matches", r"5", False),
        (MISSING, "≠", "anything", False),  # a missing value matches no rule
    ],
)
def test_each_operator(actual, op, expected, holds):
    assert condition_holds(actual, op, expected) is holds


def test_a_json_pointer_finds_nested_values_and_escapes():
    doc = {"a/b": {"m~n": [10, {"x": 1}]}, "list": [0, 1]}
    assert resolve_pointer(doc, "/a~1b/m~0n/1/x") == 1
    assert resolve_pointer(doc, "/list/1") == 1
    assert resolve_pointer(doc, "") is doc
    for missing in ("/nope", "/list/2", "/list/01", "/list/x", "/a~1b/m~0n/0/x", "nope"):
        assert resolve_pointer(doc, missing) is MISSING


RULES = [
    {
        "id": "big",
        "pointer": "/amount",
        "op": ">",
        "value": 1000,
        "action": "require",
        "approvals": 2,
    },
    {"id": "blocked-segment", "pointer": "/segment", "op": "=", "value": "all", "action": "block"},
    {"id": "small", "pointer": "/amount", "op": "≤", "value": 50, "action": "approve"},
]


def test_the_first_matching_rule_wins():
    assert matching_rule(RULES, {"amount": 5000, "segment": "all"})["id"] == "big"
    assert matching_rule(RULES, {"amount": 10, "segment": "all"})["id"] == "blocked-segment"
    assert matching_rule(RULES, {"amount": 10})["id"] == "small"
    assert matching_rule(RULES, {"amount": 500}) is None
    assert matching_rule(list(reversed(RULES)), {"amount": 10, "segment": "all"})["id"] == "small"


def test_the_effective_rule_is_the_stricter_of_declaration_policy_and_call():
    declared = {"kind": "read", "needs_approval": False, "approvals_required": 1}
    policy = {"kind": "effect", "needs_approval": True, "approvals_required": 2}
    rule = effective_rule(declared, policy, default_ttl=600, call={"needs_approval": True})
    assert (rule.kind, rule.needs_approval, rule.approvals_required) == ("effect", True, 2)
    assert rule.why == "The tool's policy requires 2 approvals."
    # The call asks for more: it gets it, and nothing needs explaining.
    asks_three = {"needs_approval": True, "approvals_required": 3}
    assert (
        effective_rule(declared, policy, default_ttl=600, call=asks_three).approvals_required == 3
    )
    assert effective_rule(declared, policy, default_ttl=600, call=asks_three).why == ""
    # Nothing asks: no approval; the deadline and its expiry are the policy's when set.
    loose = effective_rule(declared, {"approval_ttl": 120, "on_expiry": "reject"}, default_ttl=600)
    assert (loose.kind, loose.needs_approval, loose.approval_ttl, loose.on_expiry) == (
        "read",
        False,
        120,
        "reject",
    )
    assert effective_rule(None, None, default_ttl=600, call={"approval_ttl": 90}).approval_ttl == 90


def test_malformed_rules_are_named():
    assert rule_errors(RULES) == []
    errors = rule_errors(
        [
            {"id": "x", "pointer": "amount", "op": "≈", "action": "allow"},
            {"id": "x", "pointer": "/a", "op": "in", "value": 3, "action": "block"},
            {"id": "y", "pointer": "/a", "op": "matches", "value": "(", "action": "block"},
            {
                "id": "z",
                "pointer": "/a",
                "op": "=",
                "value": 1,
                "action": "require",
                "approvals": 4,
            },
        ]
    )
    assert errors == [
        "rule 1: pointer must be a JSON Pointer ('' or starting with '/')",
        "rule 1: op must be one of = ≠ < ≤ > ≥ in contains matches",
        "rule 1: action must be one of require, block, approve",
        "rule 2: id 'x' is used twice",
        "rule 2: 'in' needs a list value",
        "rule 3: 'matches' needs a valid regular expression",
        "rule 4: approvals must be 1, 2 or 3",
    ]


# --- Applied by record_call ----------------------------------------------------------


def _policy(agent, **fields) -> ToolPolicy:
    declare_tools(agent, [{"name": "send_campaign", "kind": "effect"}])
    return ToolPolicy.objects.create(
        tool=Tool.objects.get(agent=agent, name="send_campaign"),
        updated_at=timezone.now(),
        **fields,
    )


def _campaign(agent, run, amount=100, key="c-1", **kwargs):
    return send(
        agent,
        run,
        tool="send_campaign",
        key=key,
        key_source="intent",
        args={"amount": amount},
        **kwargs,
    )


@pytest.mark.django_db
def test_a_policy_that_requires_approval_holds_an_effect_whose_agent_declared_none(agent):
    _policy(agent, needs_approval=True, approvals_required=2)

    recorded = _campaign(agent, start(agent).run)

    assert recorded.action == "wait"
    effect = recorded.effect
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert (effect.needs_approval, effect.approvals_required) == (True, 2)
    assert effect.hold == {
        "reason": "policy_rule",
        "message": "The tool's policy requires 2 approvals.",
        "effect_id": None,
    }
    assert effect.claimed_run_id is None


@pytest.mark.django_db
def test_a_policy_makes_a_read_tool_an_effect(agent):
    declare_tools(agent, [{"name": "export_csv", "kind": "read"}])
    ToolPolicy.objects.create(
        tool=Tool.objects.get(agent=agent, name="export_csv"),
        kind="effect",
        needs_approval=True,
        updated_at=timezone.now(),
    )

    recorded = read(agent, start(agent).run, tool="export_csv")

    assert recorded.call.kind == "effect"
    assert recorded.action == "wait"
    assert recorded.effect.status == EffectStatus.AWAITING_APPROVAL


@pytest.mark.django_db
def test_automatic_approval_is_audited_as_a_decision_and_executes(agent):
    _policy(agent, rules=RULES)

    recorded = _campaign(agent, start(agent).run, amount=20)

    effect = recorded.effect
    assert recorded.action == "execute"
    assert effect.status == EffectStatus.IN_FLIGHT
    assert effect.decision["verb"] == "approved"
    assert effect.decision["by"] == "policy:small"
    assert effect.decision["args_hash"] == effect.args_hash
    assert [a["by"] for a in effect.current_approvals] == ["policy:small"]
    assert verbs(effect) == ["recorded", "approved", "claimed"]
    approved = AuditEvent.objects.get(effect=effect, verb="approved")
    assert (approved.actor, approved.actor_kind) == ("policy:small", "policy")
    assert (approved.old_status, approved.new_status) == ("awaiting_approval", "approved")
    effect.refresh_from_db()
    assert effect.revision == 3  # recorded, approved, claimed


@pytest.mark.django_db
def test_automatic_approval_overrides_the_declared_approval(agent):
    _policy(agent, needs_approval=True, approvals_required=3, rules=RULES)

    assert _campaign(agent, start(agent).run, amount=20, needs_approval=True).action == "execute"


@pytest.mark.django_db
def test_a_require_rule_asks_for_its_approvers(agent):
    _policy(agent, rules=RULES)

    recorded = _campaign(agent, start(agent).run, amount=5000)

    assert recorded.action == "wait"
    assert (recorded.effect.needs_approval, recorded.effect.approvals_required) == (True, 2)
    assert recorded.effect.hold["reason"] == "policy_rule"
    assert "rule big" in recorded.effect.hold["message"]


@pytest.mark.django_db
def test_a_block_rule_refuses_the_effect_for_good(agent):
    _policy(agent, rules=RULES)
    run = start(agent).run

    recorded = send(
        agent,
        run,
        tool="send_campaign",
        key="c-1",
        key_source="intent",
        args={"amount": 10, "segment": "all"},
    )

    effect = recorded.effect
    assert recorded.action == "blocked"
    assert effect.status == EffectStatus.REJECTED
    assert effect.decision["by"] == "policy:blocked-segment"
    assert effect.decision["final"] is True
    assert verbs(effect) == ["recorded", "rejected"]
    # Final: other arguments are kept as drift and change nothing.
    again = send(
        agent, run, tool="send_campaign", key="c-1", key_source="intent", args={"amount": 10}
    )
    assert again.action == "blocked"


@pytest.mark.django_db
def test_a_revision_never_gets_less_approval_than_its_arguments_rule(agent, operator):
    _policy(agent, needs_approval=True, rules=RULES)
    run = start(agent).run
    first = _campaign(agent, run, amount=500)
    assert first.effect.approvals_required == 1

    revised = _campaign(agent, run, amount=5000)  # awaiting: the new arguments are adopted

    revised.effect.refresh_from_db()
    assert revised.effect.approvals_required == 2
    effect = approve_effect(operator, first.effect.pk, args_hash=revised.effect.args_hash)
    assert effect.status == EffectStatus.AWAITING_APPROVAL  # one of two


@pytest.mark.django_db
def test_on_expiry_reject_rejects_an_undecided_effect(agent):
    _policy(agent, needs_approval=True, approval_ttl=60, on_expiry="reject")
    effect = _campaign(agent, start(agent).run).effect
    assert effect.approval_ttl == 60 and effect.on_expiry == "reject"

    assert expire_if_past_deadline(effect, timezone.now() + timedelta(seconds=61))

    assert effect.status == EffectStatus.REJECTED
    assert (effect.decision["verb"], effect.decision["by"]) == ("rejected", "system")


@pytest.mark.django_db
def test_without_a_policy_expiry_expires(agent):
    effect = _campaign(agent, start(agent).run, needs_approval=True, approval_ttl=60).effect
    assert effect.on_expiry == "expire"
    expire_if_past_deadline(effect, timezone.now() + timedelta(seconds=61))
    assert effect.status == EffectStatus.EXPIRED


@pytest.mark.django_db
def test_a_revision_into_a_blocked_value_is_rejected_by_the_policy(agent):
    _policy(agent, needs_approval=True, rules=RULES)
    run = start(agent).run
    first = _campaign(agent, run, amount=500)

    revised = send(
        agent,
        run,
        tool="send_campaign",
        key="c-1",
        key_source="intent",
        args={"amount": 500, "segment": "all"},
    )

    assert revised.action == "blocked"
    effect = revised.effect
    assert effect.pk == first.effect.pk
    assert (effect.status, effect.decision["by"], effect.decision["final"]) == (
        "rejected",
        "policy:blocked-segment",
        True,
    )
    assert verbs(effect)[-2:] == ["args_revised", "rejected"]
    rejected = AuditEvent.objects.get(effect=effect, verb="rejected")
    assert (rejected.actor, rejected.old_status) == ("policy:blocked-segment", "awaiting_approval")
