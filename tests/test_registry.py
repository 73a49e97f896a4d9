"""The tool registry (runs/registry.py; product.md "Tool registry and policies"):
declarations, fingerprints, states, history, and registration by a first call."""

from __future__ import annotations

import hashlib

import pytest
import rfc8785
from django.db import connection
from lifecycle_helpers import read, send, start
from race_helpers import run_together

from runs.models import Effect, EffectStatus, Tool, ToolDeclaration, ToolState
from runs.registry import confirm_tool, declare_tools, effective_of

pytestmark = pytest.mark.django_db

CAMPAIGN = {"name": "send_campaign", "kind": "effect", "key_source": "intent"}


def _tool(agent, name="send_campaign") -> Tool:
    return Tool.objects.get(agent=agent, name=name)


def _history(tool: Tool) -> list[dict]:
    return [d.declaration for d in ToolDeclaration.objects.filter(tool=tool).order_by("id")]


def test_a_first_declaration_registers_the_tool_with_its_fingerprint(agent):
    [tool] = declare_tools(
        agent, [{**CAMPAIGN, "needs_approval": True, "approvals_required": 2, "schema": {}}]
    )

    declared = {
        "kind": "effect",
        "key_source": "intent",
        "needs_approval": True,
        "approvals_required": 2,
        "schema": {},
        "annotations": None,
    }
    assert tool.declaration == tool.adopted == declared
    # SHA-256 of the declaration's canonical JSON (RFC 8785), as args_hash is.
    assert tool.fingerprint == hashlib.sha256(rfc8785.dumps(declared)).hexdigest()
    assert tool.state == ToolState.REGISTERED
    assert _history(tool) == [declared]


def test_the_same_declaration_twice_changes_nothing(agent):
    [first] = declare_tools(agent, [CAMPAIGN])
    [again] = declare_tools(agent, [dict(reversed(list(CAMPAIGN.items())))])  # other order

    assert (again.pk, again.fingerprint, again.updated_at) == (
        first.pk,
        first.fingerprint,
        first.updated_at,
    )
    assert again.state == ToolState.REGISTERED
    assert len(_history(again)) == 1


def test_a_looser_declaration_is_a_change_recorded_and_never_adopted(agent):
    declare_tools(agent, [{**CAMPAIGN, "needs_approval": True, "approvals_required": 2}])
    # The agent's new version drops the approval, and says the tool is a read.
    [tool] = declare_tools(agent, [{**CAMPAIGN, "kind": "read", "schema": {"type": "object"}}])

    assert tool.state == ToolState.CHANGED
    assert tool.declaration["needs_approval"] is False  # what the agent declared, shown
    assert len(_history(tool)) == 2
    # In force: the stricter of the two; the descriptive parts follow the new one.
    assert tool.adopted["kind"] == "effect"
    assert (tool.adopted["needs_approval"], tool.adopted["approvals_required"]) == (True, 2)
    assert tool.adopted["schema"] == {"type": "object"}
    effective = effective_of(tool)
    assert (effective.kind, effective.needs_approval, effective.approvals_required) == (
        "effect",
        True,
        2,
    )

    # So its call without approval waits for two people, and the effect says why.
    recorded = send(agent, start(agent).run, tool="send_campaign", key="c-1", key_source="intent")
    assert recorded.action == "wait"
    assert (recorded.effect.needs_approval, recorded.effect.approvals_required) == (True, 2)
    assert recorded.effect.hold["reason"] == "policy_rule"
    assert "registered declaration requires 2 approvals" in recorded.effect.hold["message"]


def test_a_stricter_declaration_is_a_change_that_applies_at_once(agent):
    declare_tools(agent, [CAMPAIGN])
    [tool] = declare_tools(agent, [{**CAMPAIGN, "needs_approval": True}])

    assert tool.state == ToolState.CHANGED
    assert tool.adopted["needs_approval"] is True


def test_declaring_the_one_in_force_again_clears_the_change(agent):
    declare_tools(agent, [CAMPAIGN])
    declare_tools(agent, [{**CAMPAIGN, "kind": "read"}])
    [tool] = declare_tools(agent, [CAMPAIGN])

    assert tool.state == ToolState.REGISTERED
    assert tool.fingerprint == tool.adopted_fingerprint
    assert len(_history(tool)) == 2  # one row per distinct declaration


def test_an_admin_confirms_the_latest_declaration_looser_parts_included(agent, admin_user):
    declare_tools(agent, [{**CAMPAIGN, "needs_approval": True}])
    [tool] = declare_tools(agent, [CAMPAIGN])

    confirmed = confirm_tool(admin_user, tool.pk)

    assert confirmed.state == ToolState.CONFIRMED
    assert confirmed.adopted == confirmed.declaration
    assert confirmed.confirmed_by == admin_user
    assert send(agent, start(agent).run, tool="send_campaign", key="c-1").action == "execute"


def test_the_first_call_of_an_undeclared_tool_registers_it_from_the_call(agent):
    run = start(agent).run
    send(agent, run, tool="crm.note", key="n-1", key_source="intent", needs_approval=True)
    read(agent, run, tool="search")

    note, search = _tool(agent, "crm.note"), _tool(agent, "search")
    # Kind and key source; a call's approval is its effect's (runs/registry.py says why).
    assert note.declaration == {
        "kind": "effect",
        "key_source": "intent",
        "needs_approval": False,
        "approvals_required": 1,
        "schema": None,
        "annotations": None,
    }
    assert search.declaration["kind"] == "read"
    assert ToolDeclaration.objects.get(tool=note).source == "call"
    assert note.state == search.state == ToolState.REGISTERED


def test_a_tool_registered_as_an_effect_makes_a_read_of_it_an_effect(agent):
    run = start(agent).run
    declare_tools(agent, [{"name": "send_sms", "kind": "effect"}])

    recorded = read(agent, run, tool="send_sms")

    assert recorded.call.kind == "effect"
    assert recorded.effect is not None
    assert recorded.effect.status == EffectStatus.IN_FLIGHT  # an unkeyed effect, claimed
    assert Effect.objects.filter(tool="send_sms").count() == 1


def test_a_tool_named_twice_in_one_declaration_is_declared_twice_in_order(agent):
    tools = declare_tools(agent, [{**CAMPAIGN, "needs_approval": True}, CAMPAIGN])

    assert [t.pk for t in tools] == [tools[0].pk] * 2
    assert tools[0].state == ToolState.CHANGED  # the second was a looser change
    assert tools[0].adopted["needs_approval"] is True


def test_tools_are_per_agent(agent, other_agent):
    declare_tools(agent, [{**CAMPAIGN, "needs_approval": True}])
    declare_tools(other_agent, [CAMPAIGN])

    assert send(other_agent, start(other_agent).run, tool="send_campaign").action == "execute"


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="sessions of their own")
def test_concurrent_first_declarations_of_one_tool_create_one_row(agent):
    # Eight sessions, held open before a barrier lets them go together: four declare
    # the tool (two declarations), four record its first call in runs of their own.
    runs = [start(agent, f"race-{i}").run for i in range(4)]
    loose, strict = CAMPAIGN, {**CAMPAIGN, "needs_approval": True}
    works = [
        (lambda decl=(strict if i % 2 else loose): declare_tools(agent, [decl])) for i in range(4)
    ] + [
        (lambda run=run: send(agent, run, tool="send_campaign", key=f"k-{run.pk}").action)
        for run in runs
    ]

    answers = run_together(works)

    assert [a for a in answers if isinstance(a, Exception)] == []
    tool = _tool(agent)
    assert Tool.objects.filter(agent=agent).count() == 1
    # One history row per distinct declaration, however many sessions sent it.
    fingerprints = list(
        ToolDeclaration.objects.filter(tool=tool).values_list("fingerprint", flat=True)
    )
    assert len(fingerprints) == len(set(fingerprints)) <= 3
    # Whatever the order, the strict declaration was never loosened.
    assert tool.adopted["needs_approval"] is True
