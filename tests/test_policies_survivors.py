"""What the mutation run (make mutate) found untested in runs/policies.py: the
plain functions' edges. Each test fails with the mutant it names applied."""

from __future__ import annotations

import pytest

from runs.policies import (
    MISSING,
    condition_holds,
    effective_rule,
    policy_hold,
    resolve_pointer,
    rule_errors,
)

GOOD = {"id": "ok", "pointer": "/a", "op": "=", "value": 1, "action": "block"}


def test_rules_that_are_not_a_list_say_so():
    assert rule_errors({"id": "x"}) == ["rules must be a list of rules"]


def test_a_rule_that_is_not_an_object_is_named_and_the_next_still_checked():
    # `continue`, not `break`: the rule after it is checked too.
    assert rule_errors(["nope", {**GOOD, "action": "allow"}]) == [
        "rule 1: must be an object",
        "rule 2: action must be one of require, block, approve",
    ]


@pytest.mark.parametrize("rule_id", ["has space", "", "x" * 51, 7, None])
def test_an_id_outside_its_alphabet_or_length_is_refused(rule_id):
    assert rule_errors([{**GOOD, "id": rule_id}]) == [
        "rule 1: id must be 1–50 letters, digits, '_', '.', '-'"
    ]


@pytest.mark.parametrize("rule_id", ["Big_Refund-2.v1", "X", "x" * 50])
def test_an_id_of_upper_and_lower_case_letters_digits_and_marks_is_taken(rule_id):
    assert rule_errors([{**GOOD, "id": rule_id}]) == []


@pytest.mark.parametrize("op", ["==", "!=", "<=", ">="])
def test_the_ascii_spellings_of_the_operators_are_taken(op):
    assert rule_errors([{**GOOD, "op": op}]) == []
    assert condition_holds(1, op, 1) is (op in ("==", "<=", ">="))


def test_a_valid_regular_expression_is_taken():
    assert rule_errors([{**GOOD, "op": "matches", "value": r"^ceo@"}]) == []


def test_require_without_approvals_means_one_and_one_is_taken():
    require = {**GOOD, "action": "require"}
    assert rule_errors([require]) == []
    assert rule_errors([{**require, "approvals": 1}]) == []
    assert rule_errors([{**require, "approvals": 0}]) == ["rule 1: approvals must be 1, 2 or 3"]


def test_the_effective_rule_as_the_api_shows_it():
    rule = effective_rule(
        {"kind": "effect", "needs_approval": True, "approvals_required": 2},
        {"approval_ttl": 120, "on_expiry": "reject"},
        default_ttl=600,
    )
    assert rule.as_dict() == {
        "kind": "effect",
        "needs_approval": True,
        "approvals_required": 2,
        "approval_ttl": 120,
        "on_expiry": "reject",
    }


@pytest.mark.parametrize(
    ("approvals", "why"),
    [
        (1, "The tool's registered declaration requires one approval."),
        (3, "The tool's registered declaration requires 3 approvals."),
    ],
)
def test_why_approval_is_required_counts_in_words(approvals, why):
    declared = {"kind": "effect", "needs_approval": True, "approvals_required": approvals}
    assert effective_rule(declared, None, default_ttl=600).why == why


def test_a_list_index_of_several_digits_is_found_and_a_lone_zero_too():
    doc = {"list": list(range(12))}
    assert resolve_pointer(doc, "/list/10") == 10
    assert resolve_pointer(doc, "/list/0") == 0
    assert resolve_pointer(doc, "/list/00") is MISSING


def test_a_value_canonical_json_cannot_write_equals_nothing():
    # 2**64 is beyond RFC 8785's numbers: such a value is never equal, so never "="
    # and always "≠"; a policy cannot match it by accident.
    assert condition_holds(2**64, "=", 2**64) is False
    assert condition_holds(2**64, "≠", 1) is True


@pytest.mark.parametrize(
    ("actual", "expected", "holds"),
    [
        ("winter sale", "sale", True),
        ("winter", "sale", False),
        ("winter sale", 5, False),  # a string contains strings only
        ({"vip": 1}, "vip", True),  # an object contains its keys
        ({"vip": 1}, "other", False),
        (5, 5, False),  # a number contains nothing
        (None, "x", False),
    ],
)
def test_contains_by_the_type_of_the_value(actual, expected, holds):
    assert condition_holds(actual, "contains", expected) is holds


def test_an_unknown_operator_holds_for_nothing():
    assert condition_holds(1, "≈", 1) is False


def test_a_block_rule_holds_the_effect_naming_the_policy_and_the_rule():
    assert policy_hold("send_campaign", {"id": "all-segment"}) == {
        "reason": "policy_rule",
        "message": "Blocked by the policy of send_campaign, rule all-segment.",
        "effect_id": None,
    }
