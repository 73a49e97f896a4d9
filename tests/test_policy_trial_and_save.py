"""Trying a policy on past calls and saving it (runs/registry.py ``try_policy`` and
``save_policy``), called directly: the console's tool page (tests/test_console_tools.py)
shows only their sums, and the mutation run (make mutate) counts only these."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError
from django.utils import timezone
from lifecycle_helpers import read, send, start

from runs.models import AuditEvent, Call, EffectStatus, Tool, ToolPolicy
from runs.registry import declare_tools, policy_dict, save_policy, try_policy

pytestmark = pytest.mark.django_db

BIG = {"id": "big", "pointer": "/amount", "op": ">", "value": 100, "action": "require"}
HUGE = {"id": "huge", "pointer": "/amount", "op": ">", "value": 1000, "action": "block"}


def _refund_tool(agent, **declared) -> Tool:
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect", **declared}])
    return tool


def _refunds(agent, amounts: list[int], run_key: str = "refunds") -> list[Call]:
    run = start(agent, run_key).run
    return [
        send(agent, run, tool="refund", args={"amount": n}, key=f"{run_key}:{i}").call
        for i, n in enumerate(amounts)
    ]


def _policy(**fields) -> dict:
    return {
        "kind": None,
        "needs_approval": False,
        "approvals_required": 1,
        "approval_ttl": None,
        "on_expiry": "expire",
        "rules": [],
        **fields,
    }


def test_a_trial_gates_each_past_call_by_the_rule_its_arguments_match(agent):
    tool = _refund_tool(agent)
    calls = _refunds(agent, [5, 500, 5000])

    trials = try_policy(tool, _policy(rules=[HUGE, BIG]))

    # Newest first; the first matching rule wins (5000 is also > 100).
    assert [t.call.pk for t in trials] == [c.pk for c in reversed(calls)]
    huge, big, small = trials
    assert (huge.rule, huge.opening.status, huge.opening.decided_by) == (
        HUGE,
        EffectStatus.REJECTED,
        "policy:huge",
    )
    assert (big.rule, big.opening.status, big.opening.needs_approval) == (
        BIG,
        EffectStatus.AWAITING_APPROVAL,
        True,
    )
    assert big.opening.hold["reason"] == "policy_rule"
    assert (small.rule, small.opening.status, small.opening.needs_approval) == (
        None,
        EffectStatus.PENDING,
        False,
    )


def test_a_trial_applies_the_policys_own_approval_and_its_number(agent):
    tool = _refund_tool(agent)
    _refunds(agent, [5])

    [trial] = try_policy(tool, _policy(needs_approval=True, approvals_required=2))

    assert trial.rule is None
    assert trial.opening.status == EffectStatus.AWAITING_APPROVAL
    assert (trial.opening.needs_approval, trial.opening.approvals_required) == (True, 2)


def test_a_trial_keeps_the_declaration_in_force_stricter_than_the_policy(agent):
    tool = _refund_tool(agent, needs_approval=True, approvals_required=3)
    _refunds(agent, [5])

    [trial] = try_policy(tool, _policy(needs_approval=True, approvals_required=1))

    assert (trial.opening.status, trial.opening.approvals_required) == (
        EffectStatus.AWAITING_APPROVAL,
        3,
    )


def test_a_read_is_never_gated_unless_the_policy_makes_the_tool_an_effect(agent):
    [tool] = declare_tools(agent, [{"name": "search", "kind": "read"}])
    run = start(agent).run
    read(agent, run, tool="search", args={"amount": 5000})
    block_all = {"id": "all", "pointer": "/amount", "op": ">", "value": 0, "action": "block"}

    [as_read] = try_policy(tool, _policy(rules=[block_all]))
    [as_effect] = try_policy(tool, _policy(kind="effect", rules=[block_all]))

    assert (as_read.rule, as_read.opening) == (None, None)
    assert (as_effect.rule, as_effect.opening.status) == (block_all, EffectStatus.REJECTED)


def test_a_trial_reads_only_this_agents_calls_of_this_tool_and_at_most_limit(agent, other_agent):
    tool = _refund_tool(agent)
    mine = _refunds(agent, [1, 2, 3, 4])
    _refunds(other_agent, [9, 9])  # another agent's tool of the same name
    send(agent, start(agent, "mail").run, tool="send_email", key="m:1")  # another tool

    trials = try_policy(tool, _policy(), limit=3)

    assert [t.call.pk for t in trials] == [c.pk for c in reversed(mine)][:3]


def test_calls_recorded_at_the_same_instant_come_newest_id_first(agent):
    tool = _refund_tool(agent)
    calls = _refunds(agent, [1, 2, 3])
    Call.objects.filter(pk__in=[c.pk for c in calls]).update(at=timezone.now())

    assert [t.call.pk for t in try_policy(tool, _policy(), limit=2)] == [
        calls[2].pk,
        calls[1].pk,
    ]


def test_an_older_call_is_left_out_when_newer_fill_the_limit(agent):
    tool = _refund_tool(agent)
    old, new = _refunds(agent, [1, 2])
    Call.objects.filter(pk=new.pk).update(at=old.at - timedelta(hours=1))

    assert [t.call.pk for t in try_policy(tool, _policy(), limit=1)] == [old.pk]


def test_saving_a_policy_stamps_who_and_when_and_audits_it_in_full(agent, admin_user):
    tool = _refund_tool(agent)
    at = timezone.now() - timedelta(minutes=5)

    policy = save_policy(admin_user, ToolPolicy(tool=tool, rules=[BIG]), now=at)

    stored = ToolPolicy.objects.get(tool=tool)
    assert (stored.pk, stored.updated_by, stored.updated_at) == (policy.pk, admin_user, at)
    [event] = AuditEvent.objects.filter(verb__startswith="policy_")
    assert (event.verb, event.actor, event.at, event.agent_id) == (
        "policy_created",
        admin_user.username,
        at,
        agent.pk,
    )
    assert event.data == {"tool": "refund", "policy": policy_dict(stored)}


def test_saving_it_again_is_a_change_with_the_new_policy(agent, admin_user):
    tool = _refund_tool(agent)
    policy = save_policy(admin_user, ToolPolicy(tool=tool))
    policy.needs_approval = True
    save_policy(admin_user, policy)

    verbs = list(
        AuditEvent.objects.filter(verb__startswith="policy_")
        .order_by("id")
        .values_list("verb", "data__policy__needs_approval")
    )
    assert verbs == [("policy_created", False), ("policy_changed", True)]
    assert ToolPolicy.objects.get(tool=tool).needs_approval is True


def test_a_policy_the_database_refuses_leaves_no_audit_row(agent, admin_user):
    tool = _refund_tool(agent)

    with pytest.raises(IntegrityError):
        save_policy(admin_user, ToolPolicy(tool=tool, approvals_required=9))

    assert not ToolPolicy.objects.exists()
    assert not AuditEvent.objects.filter(verb__startswith="policy_").exists()


def test_a_call_recorded_as_an_effect_of_a_tool_declared_read_is_tried_as_one(agent):
    [tool] = declare_tools(agent, [{"name": "search", "kind": "read"}])
    run = start(agent).run
    as_effect = send(agent, run, tool="search", key="s:1", args={"amount": 5000}).call
    as_read = read(agent, run, tool="search", args={"amount": 5000}).call

    # Newest first: the read, then (not cut short by it) the call made as an effect.
    later, earlier = try_policy(tool, _policy(rules=[HUGE]))

    assert (later.call.pk, later.rule, later.opening) == (as_read.pk, None, None)
    assert earlier.call.pk == as_effect.pk
    assert (earlier.rule, earlier.opening.status) == (HUGE, EffectStatus.REJECTED)
    assert earlier.opening.hold["message"] == "Blocked by the policy of search, rule huge."


def test_a_trial_reads_the_calls_in_one_query_with_what_the_page_shows(
    agent, django_assert_num_queries
):
    tool = _refund_tool(agent)
    _refunds(agent, [5, 500])

    with django_assert_num_queries(1):
        shown = [
            (c.pk, c.run_id, c.attempt_number, c.seq, c.kind, c.args, c.args_hash, c.action)
            for c in (t.call for t in try_policy(tool, _policy(rules=[BIG])))
        ]

    assert [row[3] for row in shown] == [2, 1]
