"""The tool registry in the Django admin: admins edit policies (audited) and confirm
tools; operators read them."""

from __future__ import annotations

import json

import pytest
from lifecycle_helpers import send, start

from runs.models import AuditEvent, EffectStatus, Tool, ToolMode, ToolPolicy, ToolState
from runs.registry import declare_tools

pytestmark = pytest.mark.django_db


def _login(client, user):
    client.force_login(user)


RULES = [{"id": "small", "pointer": "/amount", "op": "<=", "value": 50, "action": "approve"}]


def _policy_form(tool, **fields):
    return {
        "tool": str(tool.pk),
        "kind": "",
        "approvals_required": "1",
        "approval_ttl": "",
        "on_expiry": "expire",
        "rules": json.dumps(RULES),
        **fields,
    }


def test_an_admin_adds_a_policy_and_the_change_is_audited(client, admin_user, agent):
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    _login(client, admin_user)

    response = client.post("/admin/runs/toolpolicy/add/", _policy_form(tool, needs_approval="on"))

    assert response.status_code == 302, response.content.decode()[:2000]
    policy = ToolPolicy.objects.get(tool=tool)
    assert (policy.needs_approval, policy.rules, policy.updated_by) == (True, RULES, admin_user)
    event = AuditEvent.objects.get(verb="policy_created")
    assert (event.actor, event.agent_id, event.data["tool"]) == ("ada", agent.pk, "refund")
    assert event.data["policy"]["rules"] == RULES
    # The next call applies it: 20 is approved by the rule, 80 waits for a person.
    run = start(agent).run
    assert send(agent, run, tool="refund", key="r1", args={"amount": 20}).action == "execute"
    assert send(agent, run, tool="refund", key="r2", args={"amount": 80}).action == "wait"

    client.post(f"/admin/runs/toolpolicy/{policy.pk}/change/", _policy_form(tool, rules="[]"))
    assert AuditEvent.objects.filter(verb="policy_changed").count() == 1


def test_malformed_rules_are_refused_with_the_reason(client, admin_user, agent):
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    _login(client, admin_user)
    bad = [{"id": "x", "pointer": "amount", "op": "<=", "value": 1, "action": "approve"}]

    response = client.post("/admin/runs/toolpolicy/add/", _policy_form(tool, rules=json.dumps(bad)))

    assert response.status_code == 200
    assert "pointer must be a JSON Pointer" in response.content.decode()
    assert not ToolPolicy.objects.exists()


def test_an_admin_confirms_a_tool_and_its_held_effects_go_on(client, admin_user, agent):
    agent.tool_mode = ToolMode.CONFIRM
    agent.save()
    effect = send(agent, start(agent).run).effect
    assert effect.hold["reason"] == "tool_unconfirmed"
    tool = Tool.objects.get(agent=agent)
    _login(client, admin_user)

    response = client.post(
        "/admin/runs/tool/", {"action": "confirm", "_selected_action": [str(tool.pk)]}
    )

    assert response.status_code == 302
    tool.refresh_from_db()
    effect.refresh_from_db()
    assert tool.state == ToolState.CONFIRMED
    assert effect.status == EffectStatus.PENDING
    assert AuditEvent.objects.filter(verb="tool_confirmed", effect=None).count() == 1


def test_an_operator_reads_tools_and_policies_and_edits_nothing(client, operator, agent):
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    _login(client, operator)

    assert "refund" in client.get("/admin/runs/tool/").content.decode()
    assert client.get("/admin/runs/toolpolicy/").status_code == 200
    assert client.get("/admin/runs/toolpolicy/add/").status_code == 403
    client.post("/admin/runs/tool/", {"action": "confirm", "_selected_action": [str(tool.pk)]})
    tool.refresh_from_db()
    assert tool.state == ToolState.REGISTERED


def test_an_agents_tool_mode_change_is_audited(client, admin_user, agent):
    _login(client, admin_user)

    response = client.post(
        f"/admin/runs/agent/{agent.pk}/change/",
        {"name": agent.name, "is_active": "on", "tool_mode": "closed"},
    )

    assert response.status_code == 302
    agent.refresh_from_db()
    assert agent.tool_mode == ToolMode.CLOSED
    event = AuditEvent.objects.get(verb="tool_mode_changed")
    assert (event.agent_id, event.data) == (agent.pk, {"from": "open", "to": "closed"})
