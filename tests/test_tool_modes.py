"""An agent's tool modes (product.md, "Tool registry and policies"): ``open`` registers
as declared, ``confirm`` holds a new or changed tool's effects until an admin
confirms it, ``closed`` refuses an unregistered tool."""

from __future__ import annotations

import pytest
from lifecycle_helpers import read, send, start, verbs

from runs.errors import ToolNotRegistered
from runs.lifecycle import action_for
from runs.models import Effect, EffectStatus, Tool, ToolMode, ToolState
from runs.outcomes import claim_effect
from runs.registry import confirm_tool, declare_tools

pytestmark = pytest.mark.django_db


def _mode(agent, mode: str) -> None:
    agent.tool_mode = mode
    agent.save(update_fields=["tool_mode"])


def test_open_mode_registers_and_runs_a_new_tool(agent):
    assert agent.tool_mode == ToolMode.OPEN
    assert send(agent, start(agent).run, tool="brand_new").action == "execute"


def test_confirm_mode_holds_a_new_tool_until_an_admin_confirms_it(agent, admin_user):
    _mode(agent, ToolMode.CONFIRM)
    run = start(agent).run

    recorded = send(agent, run, tool="send_email")

    effect = recorded.effect
    assert recorded.action == "wait"
    assert effect.status == EffectStatus.AWAITING_APPROVAL
    assert effect.hold["reason"] == "tool_unconfirmed"
    assert effect.needs_approval is False  # its own rule: it needs no person once confirmed

    confirm_tool(admin_user, Tool.objects.get(agent=agent, name="send_email").pk)

    effect.refresh_from_db()
    assert effect.status == EffectStatus.PENDING
    assert effect.hold is None
    assert "tool_confirmed" in verbs(effect)
    assert claim_effect(agent, effect.pk, run_id=run.pk, attempt=1)[1] == "execute"
    # A confirmed tool's next effect runs at once.
    assert send(agent, run, tool="send_email", key="k-2").action == "execute"


def test_confirming_leaves_an_effect_that_needs_approval_awaiting_it(agent, admin_user):
    _mode(agent, ToolMode.CONFIRM)
    effect = send(agent, start(agent).run, needs_approval=True).effect

    confirm_tool(admin_user, Tool.objects.get(agent=agent, name="send_email").pk)

    effect.refresh_from_db()
    assert (effect.status, effect.hold) == (EffectStatus.AWAITING_APPROVAL, None)


def test_confirm_mode_holds_a_changed_tools_effects_again(agent, admin_user):
    _mode(agent, ToolMode.CONFIRM)
    [tool] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    confirm_tool(admin_user, tool.pk)
    run = start(agent).run
    assert send(agent, run, key="k-1").action == "execute"

    [tool] = declare_tools(agent, [{"name": "send_email", "kind": "effect", "schema": {}}])

    assert tool.state == ToolState.CHANGED
    held = send(agent, run, key="k-2")
    assert held.action == "wait"
    assert held.effect.hold["reason"] == "tool_unconfirmed"
    assert action_for(held.effect, held.effect.updated_at) == "wait"


def test_closed_mode_refuses_an_unregistered_tool(agent):
    _mode(agent, ToolMode.CLOSED)
    run = start(agent).run

    for record in (lambda: send(agent, run, tool="rm_rf"), lambda: read(agent, run, tool="peek")):
        with pytest.raises(ToolNotRegistered) as refused:
            record()
        assert refused.value.status == 409
        assert refused.value.code == "tool_not_registered"
    assert refused.value.details == {"tool": "peek"}
    assert not Tool.objects.exists()
    assert not Effect.objects.exists()


def test_closed_mode_takes_registered_tools_and_no_new_declarations(agent):
    declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    _mode(agent, ToolMode.CLOSED)

    assert send(agent, start(agent).run).action == "execute"
    with pytest.raises(ToolNotRegistered) as refused:
        declare_tools(
            agent, [{"name": "send_email", "kind": "effect"}, {"name": "x", "kind": "read"}]
        )
    assert refused.value.details == {"tool": "x"}
    assert list(Tool.objects.values_list("name", flat=True)) == ["send_email"]


def test_no_operator_approval_lets_an_unconfirmed_tools_effect_through(agent, operator):
    from django.utils import timezone

    from approvals.decisions import allowed_actions, approve_effect, reject_effect
    from runs.errors import NotAllowed

    _mode(agent, ToolMode.CONFIRM)
    effect = send(agent, start(agent).run).effect

    assert allowed_actions(effect, operator, timezone.now()) == {"reject", "mark_done"}
    with pytest.raises(NotAllowed):
        approve_effect(operator, effect.pk, args_hash=effect.args_hash)
    with pytest.raises(NotAllowed):
        approve_effect(operator, effect.pk, args_hash=effect.args_hash, edited_args={"s": 1})
    effect.refresh_from_db()
    assert (effect.status, effect.args_versions) == (EffectStatus.AWAITING_APPROVAL, 1)
    # Refusing it is a person's call as always.
    reject_effect(operator, effect.pk, args_hash=effect.args_hash, note="not this tool")
