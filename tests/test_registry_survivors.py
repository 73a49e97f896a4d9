"""What the mutation run (make mutate) found untested in runs/registry.py: what a
confirmation writes and releases, a change's stricter rule, whose tools a
declaration reads, and the registry's views of a tool. Each test fails with the
mutant it was written for applied."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from lifecycle_helpers import send, start, verbs

from approvals.decisions import reject_effect
from runs.errors import ToolNotRegistered
from runs.models import (
    AuditEvent,
    EffectStatus,
    Tool,
    ToolDeclaration,
    ToolMode,
    ToolPolicy,
    ToolState,
)
from runs.registry import (
    confirm_tool,
    declaration,
    declare_tools,
    effective_of,
    policy_of,
    rule_of,
    save_policy,
    stricter,
)

pytestmark = pytest.mark.django_db


def _mode(agent, mode: str) -> None:
    agent.tool_mode = mode
    agent.save(update_fields=["tool_mode"])


def _tool(agent, name="send_email") -> Tool:
    return Tool.objects.get(agent=agent, name=name)


# --- stricter ----------------------------------------------------------------------


def test_a_change_keeps_the_larger_number_of_approvers_from_either_side():
    none = declaration(kind="effect")
    three = declaration(kind="effect", needs_approval=True, approvals_required=3)

    assert stricter(none, three)["approvals_required"] == 3
    assert stricter(three, none)["approvals_required"] == 3
    assert stricter(none, none)["approvals_required"] == 1
    assert (stricter(three, none)["needs_approval"], stricter(none, none)["needs_approval"]) == (
        True,
        False,
    )


def test_a_read_changed_into_a_read_stays_a_read():
    read = declaration(kind="read")
    assert stricter(read, read)["kind"] == "read"
    assert stricter(read, declaration(kind="effect"))["kind"] == "effect"
    assert stricter(declaration(kind="effect"), read)["kind"] == "effect"


# --- declarations --------------------------------------------------------------------


def test_declaring_the_confirmed_version_again_makes_the_tool_confirmed_again(agent, admin_user):
    [tool] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    confirm_tool(admin_user, tool.pk)
    declare_tools(agent, [{"name": "send_email", "kind": "effect", "needs_approval": True}])
    assert _tool(agent).state == ToolState.CHANGED

    [back] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])

    assert back.state == ToolState.CONFIRMED


def test_the_history_says_each_declaration_came_from_a_declaration(agent):
    declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    declare_tools(agent, [{"name": "send_email", "kind": "effect", "needs_approval": True}])

    sources = ToolDeclaration.objects.filter(tool=_tool(agent)).values_list("source", flat=True)
    assert list(sources) == ["declared", "declared"]


def test_closed_mode_does_not_count_another_agents_tool_as_registered(agent, other_agent):
    declare_tools(other_agent, [{"name": "send_email", "kind": "effect"}])
    _mode(agent, ToolMode.CLOSED)

    with pytest.raises(ToolNotRegistered):
        declare_tools(agent, [{"name": "send_email", "kind": "effect"}])


def test_a_declaration_answers_with_the_agents_own_tools(agent, other_agent):
    declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    [theirs] = declare_tools(other_agent, [{"name": "send_email", "kind": "read"}])

    [mine] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])  # again

    assert mine.pk != theirs.pk
    assert (mine.agent_id, mine.adopted["kind"]) == (agent.pk, "effect")


def test_the_declared_tools_come_with_their_policies_in_the_same_query(
    agent, admin_user, django_assert_num_queries
):
    [tool] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    save_policy(admin_user, ToolPolicy(tool=tool, needs_approval=True))

    [again] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])

    with django_assert_num_queries(0):
        assert again.policy.needs_approval is True


# --- the views of a tool ------------------------------------------------------------


def test_the_effective_rule_of_a_tool_includes_its_policy_and_the_default_deadline(
    agent, admin_user
):
    [tool] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    assert effective_of(tool).needs_approval is False

    save_policy(admin_user, ToolPolicy(tool=tool, needs_approval=True, approvals_required=2))
    tool = Tool.objects.get(pk=tool.pk)

    rule = effective_of(tool)
    assert (rule.needs_approval, rule.approvals_required) == (True, 2)
    assert rule.approval_ttl == settings.STARTSAFE["APPROVAL_TTL"]


def test_a_tool_shows_its_policy_with_when_it_was_saved(agent, admin_user):
    [tool] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    assert policy_of(tool) is None
    at = timezone.now() - timedelta(hours=1)

    save_policy(admin_user, ToolPolicy(tool=tool, on_expiry="reject"), now=at)

    shown = policy_of(Tool.objects.get(pk=tool.pk))
    assert shown["on_expiry"] == "reject"
    assert shown["updated_at"] == at.isoformat()
    assert set(shown) == {
        "kind",
        "needs_approval",
        "approvals_required",
        "approval_ttl",
        "on_expiry",
        "rules",
        "updated_at",
    }


# --- confirming ----------------------------------------------------------------------


def test_a_confirmation_is_audited_with_the_states_and_the_fingerprint(agent, admin_user):
    [tool] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    at = timezone.now() - timedelta(minutes=3)

    confirm_tool(admin_user, tool.pk, now=at)

    tool.refresh_from_db()
    assert (tool.state, tool.confirmed_by, tool.confirmed_at) == (
        ToolState.CONFIRMED,
        admin_user,
        at,
    )
    [event] = AuditEvent.objects.filter(verb="tool_confirmed", effect=None)
    assert (event.old_status, event.new_status, event.agent_id, event.at) == (
        "registered",
        "confirmed",
        agent.pk,
        at,
    )
    assert event.data == {"tool": "send_email", "fingerprint": tool.fingerprint}


def test_a_confirmation_releases_only_the_effects_held_for_this_tool(
    agent, other_agent, admin_user, operator
):
    _mode(agent, ToolMode.CONFIRM)
    _mode(other_agent, ToolMode.CONFIRM)
    run = start(agent).run
    held = send(agent, run, key="held").effect
    other_tool = send(agent, run, tool="send_sms", key="sms").effect
    other_agents = send(other_agent, start(other_agent).run, key="theirs").effect
    rejected = send(agent, run, key="rejected").effect
    reject_effect(operator, rejected.pk, args_hash=rejected.args_hash, note="not this one")

    confirm_tool(admin_user, _tool(agent).pk)

    for effect in (held, other_tool, other_agents, rejected):
        effect.refresh_from_db()
    assert (held.status, held.hold) == (EffectStatus.PENDING, None)
    assert held.approval_expires_at is None
    for untouched in (other_tool, other_agents):
        assert (untouched.status, untouched.hold["reason"]) == (
            EffectStatus.AWAITING_APPROVAL,
            "tool_unconfirmed",
        )
        assert "tool_confirmed" not in verbs(untouched)
    assert rejected.status == EffectStatus.REJECTED
    assert "tool_confirmed" not in verbs(rejected)


def test_a_confirmation_leaves_alone_an_effect_awaiting_its_own_approval(agent, admin_user):
    [tool] = declare_tools(agent, [{"name": "send_email", "kind": "effect"}])
    confirm_tool(admin_user, tool.pk)
    _mode(agent, ToolMode.CONFIRM)
    run = start(agent).run
    waiting = send(agent, run, key="asks", needs_approval=True).effect
    assert (waiting.status, waiting.hold) == (EffectStatus.AWAITING_APPROVAL, None)
    declare_tools(agent, [{"name": "send_email", "kind": "effect", "key_source": "intent"}])

    confirm_tool(admin_user, tool.pk)

    assert "tool_confirmed" not in verbs(waiting)


def test_a_released_effect_that_needs_approval_keeps_its_deadline_and_says_why(agent, admin_user):
    _mode(agent, ToolMode.CONFIRM)
    effect = send(agent, start(agent).run, needs_approval=True).effect
    deadline = effect.approval_expires_at
    assert deadline is not None

    confirm_tool(admin_user, _tool(agent).pk)

    effect.refresh_from_db()
    assert (effect.status, effect.approval_expires_at) == (
        EffectStatus.AWAITING_APPROVAL,
        deadline,
    )
    event = AuditEvent.objects.get(effect=effect, verb="tool_confirmed")
    assert event.note == "The tool send_email was confirmed."


def test_a_rule_as_sqlite_gives_it_is_decoded_as_postgresql_nests_it():
    # SQLite's json_object (the embedded default) embeds JSON columns as text.
    adopted = {"kind": "effect", "needs_approval": True}
    rules = [{"id": "big", "pointer": "/n", "op": ">", "value": 5, "action": "block"}]
    as_text = {
        "state": "registered",
        "adopted": json.dumps(adopted),
        "policy": {"id": 7, "kind": None, "rules": json.dumps(rules)},
    }
    as_nested = {**as_text, "adopted": adopted, "policy": {**as_text["policy"], "rules": rules}}

    for given in (as_text, as_nested):
        assert rule_of(given) == as_nested
    no_policy = {**as_nested, "policy": {"id": None, "kind": None, "rules": None}}
    assert rule_of(no_policy)["policy"] is None
