"""The tools pages (approvals/views_tools.py): every tool with its declaration,
policy, state and what the journal did with it; admins confirm tools and edit
policies after trying them on the tool's last calls; everyone signed in reads."""

from __future__ import annotations

import json

import pytest
from lifecycle_helpers import read, send, start

from approvals.views_tools import journal_counts
from runs.lifecycle import finish_run
from runs.models import AuditEvent, EffectStatus, Tool, ToolMode, ToolPolicy, ToolState
from runs.outcomes import complete_effect
from runs.registry import declare_tools, save_policy

pytestmark = pytest.mark.django_db

SMALL = {"id": "small", "pointer": "/amount", "op": "≤", "value": 50, "action": "approve"}
BIG = {"id": "big", "pointer": "/amount", "op": ">", "value": 1000, "action": "block"}
MID = {"id": "mid", "pointer": "/amount", "op": ">", "value": 500, "action": "require",
       "approvals": 2}  # fmt: skip


def _policy_post(**fields) -> dict:
    return {
        "kind": "",
        "approvals_required": "1",
        "approval_ttl": "",
        "on_expiry": "expire",
        "rules": "[]",
        **fields,
    }


def _refunds(agent, amounts: list[int], run_key: str = "refunds"):
    """One call of ``refund`` per amount, each its own key: they run (no policy)."""
    run = start(agent, run_key).run
    for n, amount in enumerate(amounts):
        send(agent, run, tool="refund", key=f"{run_key}:{n}", args={"amount": amount})
    return run


def _tool(agent, name: str) -> Tool:
    return Tool.objects.get(agent=agent, name=name)


# --- What the journal did with each tool -----------------------------------------------


def test_counts_say_what_the_journal_did_with_each_tool(agent, other_agent):
    run = start(agent).run
    first = send(agent, run, tool="send_email", key="k1")  # executes
    complete_effect(agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={})
    assert send(agent, run, tool="send_email", key="k1").action == "skip"  # duplicate
    assert send(agent, run, tool="send_email", key="k1").action == "skip"  # duplicate
    # An effect recorded awaiting approval: its own call waits (no duplicate); a
    # replay of its key waits too (a duplicate prevented).
    waiting = send(agent, run, tool="send_email", key="k2", needs_approval=True)
    assert waiting.action == "wait"
    assert send(agent, run, tool="send_email", key="k2", needs_approval=True).action == "wait"
    send(agent, run, tool="send_email", key="k3")  # in flight when the run fails: unknown
    read(agent, run, tool="search")
    read(agent, run, tool="search")
    finish_run(agent, run.pk, attempt=1, outcome="failed", error="killed")
    # Another agent's tool of the same name counts apart.
    send(other_agent, start(other_agent).run, tool="send_email", key="k1")

    tools = list(Tool.objects.all())
    counts = journal_counts(tools)

    email = counts[(agent.pk, "send_email")]
    assert email == {
        "calls": 6,
        "executions": 2,  # k1 and k3 claimed
        "duplicates": 3,
        "unknown": 1,
        "unknown_now": 1,
        "drift_holds": 0,
    }
    assert counts[(agent.pk, "search")]["calls"] == 2
    assert counts[(agent.pk, "search")]["executions"] == 2  # every read is executed
    assert counts[(other_agent.pk, "send_email")]["calls"] == 1
    assert counts[(other_agent.pk, "send_email")]["duplicates"] == 0


def test_a_drift_hold_is_counted_on_its_tool(agent):
    run = start(agent).run
    first = send(agent, run, tool="send_email", key="email:aaa", key_source="content")
    complete_effect(agent, first.effect.pk, run_id=run.pk, attempt=1, outcome="done", result={})
    start(agent, "job-1", supersede=1)
    held = send(agent, run, attempt=2, tool="send_email", key="email:bbb", key_source="content")
    assert held.effect.hold["reason"] == "key_drift"

    counts = journal_counts([_tool(agent, "send_email")])

    assert counts[(agent.pk, "send_email")]["drift_holds"] == 1


def test_the_tools_page_lists_every_tool_of_every_agent_for_anyone_signed_in(
    client, viewer, agent, other_agent
):
    declare_tools(agent, [{"name": "refund", "kind": "effect", "needs_approval": True}])
    _refunds(other_agent, [10, 20])
    client.force_login(viewer)

    response = client.get("/tools/")

    assert response.status_code == 200
    html = response.content.decode()
    refund = _tool(agent, "refund")
    assert f'href="/tools/{refund.pk}/"' in html
    assert f'href="/tools/{_tool(other_agent, "refund").pk}/"' in html
    assert "support-bot" in html and "other-bot" in html
    assert 'data-status="registered"' in html
    assert "1 approval" in html  # the declaration in force
    assert '<td class="num" data-count="calls">2</td>' in html
    assert "Confirm" not in html  # nothing to edit on the list


def test_the_tools_pages_need_a_sign_in(client, agent):
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    for path in ("/tools/", f"/tools/{tool.pk}/"):
        response = client.get(path)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/?next=")


def test_the_tools_page_counts_in_a_constant_number_of_queries(
    client, viewer, agent, other_agent, django_assert_max_num_queries
):
    for bot in (agent, other_agent):
        for n in range(15):
            _refunds(bot, [n], run_key=f"r-{n}")
            read(bot, start(bot, f"s-{n}").run, tool=f"search_{n}")
    assert Tool.objects.count() == 32
    client.force_login(viewer)
    # session, user, perms (2), nav, tools with their policies, then the counts:
    # calls, effects, audit events (a query per tool would be 32 more)
    with django_assert_max_num_queries(9):
        response = client.get("/tools/")
    assert response.status_code == 200
    assert response.content.decode().count('data-count="calls"') == 32


# --- One tool ---------------------------------------------------------------------------


def test_a_tools_page_shows_its_history_policy_state_and_counts(client, viewer, agent):
    declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    # Another declaration later (with approval): a change, recorded in the history.
    declare_tools(agent, [{"name": "refund", "kind": "effect", "needs_approval": True}])
    tool = _tool(agent, "refund")
    client.force_login(viewer)

    response = client.get(f"/tools/{tool.pk}/")

    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-status="changed"' in html
    assert "Declaration history (2)" in html
    assert html.count('tone-info">latest') == 1
    assert "No policy: the declaration in force applies." in html
    card = html.split('<section class="card" aria-labelledby="audit-title">')[1]
    assert '<h2 id="audit-title">Audit trail</h2>' in card.split("</section>")[0]
    # A viewer reads: no confirm, no policy form.
    assert "Confirm this tool" not in html and "Edit the policy" not in html


def test_unknown_tool_ids_answer_404(client, admin_user):
    client.force_login(admin_user)
    missing = "00000000-0000-0000-0000-000000000000"
    assert client.get(f"/tools/{missing}/").status_code == 404
    assert client.post(f"/tools/{missing}/confirm").status_code == 404
    assert client.post(f"/tools/{missing}/policy", _policy_post()).status_code == 404


def test_an_admin_confirms_a_tool_and_its_held_effects_go_on(client, admin_user, agent):
    agent.tool_mode = ToolMode.CONFIRM
    agent.save()
    effect = send(agent, start(agent).run, tool="refund", args={"amount": 5}).effect
    assert effect.hold["reason"] == "tool_unconfirmed"
    tool = _tool(agent, "refund")
    client.force_login(admin_user)
    assert "Confirm this tool" in client.get(f"/tools/{tool.pk}/").content.decode()

    response = client.post(f"/tools/{tool.pk}/confirm")

    assert response.status_code == 303 and response["Location"] == f"/tools/{tool.pk}/"
    tool.refresh_from_db()
    effect.refresh_from_db()
    assert (tool.state, tool.confirmed_by) == (ToolState.CONFIRMED, admin_user)
    assert effect.status == EffectStatus.PENDING
    event = AuditEvent.objects.get(verb="tool_confirmed", effect=None)
    assert (event.actor, event.data["tool"]) == ("ada", "refund")
    html = client.get(f"/tools/{tool.pk}/").content.decode()
    assert "tool_confirmed" in html  # the tool's audit trail
    assert "Confirm this tool" not in html


@pytest.mark.parametrize("who", ["viewer", "operator"])
def test_only_admins_confirm_tools_and_edit_policies(client, request, who, agent):
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    client.force_login(request.getfixturevalue(who))

    confirm = client.post(f"/tools/{tool.pk}/confirm")
    policy = client.post(f"/tools/{tool.pk}/policy", _policy_post(needs_approval="on"))
    tried = client.post(f"/tools/{tool.pk}/policy", _policy_post(**{"try": "1"}))
    malformed = client.post(f"/tools/{tool.pk}/policy", {"rules": "{not json"})

    assert [r.status_code for r in (confirm, policy, tried, malformed)] == [403] * 4
    tool.refresh_from_db()
    assert tool.state == ToolState.REGISTERED
    assert not ToolPolicy.objects.exists()
    assert not AuditEvent.objects.filter(verb__startswith="policy_").exists()
    assert not AuditEvent.objects.filter(verb="tool_confirmed").exists()


def test_an_admin_saves_a_policy_and_the_change_is_audited(client, admin_user, agent):
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    client.force_login(admin_user)
    rules = json.dumps([SMALL])

    response = client.post(
        f"/tools/{tool.pk}/policy",
        _policy_post(needs_approval="on", approvals_required="2", approval_ttl="600",
                     on_expiry="reject", rules=rules, save="1"),
    )  # fmt: skip

    assert response.status_code == 303 and response["Location"] == f"/tools/{tool.pk}/"
    policy = ToolPolicy.objects.get(tool=tool)
    assert (policy.needs_approval, policy.approvals_required, policy.approval_ttl) == (
        True,
        2,
        600,
    )
    assert (policy.on_expiry, policy.rules, policy.updated_by) == ("reject", [SMALL], admin_user)
    event = AuditEvent.objects.get(verb="policy_created")
    assert (event.actor, event.agent_id, event.data["tool"]) == ("ada", agent.pk, "refund")
    assert event.data["policy"]["rules"] == [SMALL]
    # The next call applies it: 20 is approved by the rule, 80 waits for two people.
    run = start(agent).run
    assert send(agent, run, tool="refund", key="r1", args={"amount": 20}).action == "execute"
    waiting = send(agent, run, tool="refund", key="r2", args={"amount": 80})
    assert (waiting.action, waiting.effect.approvals_required) == ("wait", 2)

    # A change is audited as a change, with the policy it made.
    client.post(f"/tools/{tool.pk}/policy", _policy_post(rules="[]"))
    changed = AuditEvent.objects.get(verb="policy_changed")
    assert changed.data["policy"]["needs_approval"] is False
    html = client.get(f"/tools/{tool.pk}/").content.decode()
    assert "policy_changed" in html and "policy_created" in html


def test_a_malformed_policy_is_refused_with_its_reasons_and_nothing_saved(
    client, admin_user, agent
):
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    client.force_login(admin_user)
    bad = [{"id": "x", "pointer": "amount", "op": "<=", "value": 1, "action": "approve"}]

    not_json = client.post(f"/tools/{tool.pk}/policy", _policy_post(rules="[{"))
    bad_rule = client.post(f"/tools/{tool.pk}/policy", _policy_post(rules=json.dumps(bad)))
    bad_ttl = client.post(f"/tools/{tool.pk}/policy", _policy_post(approval_ttl="5"))
    bad_count = client.post(f"/tools/{tool.pk}/policy", _policy_post(approvals_required="4"))

    assert [r.status_code for r in (not_json, bad_rule, bad_ttl, bad_count)] == [400] * 4
    assert "pointer must be a JSON Pointer" in bad_rule.content.decode()
    assert not ToolPolicy.objects.exists()
    assert not AuditEvent.objects.filter(verb__startswith="policy_").exists()


def test_trying_a_rule_shows_what_it_would_have_done_to_the_last_calls_and_saves_nothing(
    client, admin_user, agent
):
    # 12 small refunds, 3 middling, 1 huge, 2 in between: 18 calls.
    _refunds(agent, [10] * 12 + [700] * 3 + [5000] + [100, 200])
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    client.force_login(admin_user)
    rules = json.dumps([BIG, MID, SMALL])

    response = client.post(
        f"/tools/{tool.pk}/policy",
        _policy_post(needs_approval="on", rules=rules, **{"try": "1"}),
    )

    assert response.status_code == 200
    html = response.content.decode()
    # The first matching rule wins: 5000 is blocked (big), not sent to two (mid).
    assert (
        "would have: 12 approved automatically, 2 sent to one approver, "
        "3 sent to two approvers, 1 blocked" in html
    )
    assert "Tried on the last 18 calls" in html
    # Nothing saved, nothing audited; the form keeps what was tried.
    assert not ToolPolicy.objects.exists()
    assert not AuditEvent.objects.filter(verb__startswith="policy_").exists()
    assert "&quot;mid&quot;" in html
    # The page still shows the policy in force: none.
    assert "No policy: the declaration in force applies." in html


def test_a_trial_reads_the_last_100_calls_of_the_tool_only(client, admin_user, agent, other_agent):
    _refunds(agent, [10] * 5 + [900] * 100)  # the last 100 are big
    _refunds(other_agent, [10] * 3)  # another agent's tool of the same name
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    client.force_login(admin_user)

    response = client.post(
        f"/tools/{tool.pk}/policy", _policy_post(rules=json.dumps([SMALL]), **{"try": "1"})
    )

    assert "would have: 100 run without approval" in response.content.decode()


def test_trying_against_an_existing_policy_leaves_it_as_it_was(client, admin_user, agent):
    _refunds(agent, [10, 20])
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    save_policy(admin_user, ToolPolicy(tool=tool, needs_approval=True))
    client.force_login(admin_user)

    response = client.post(
        f"/tools/{tool.pk}/policy", _policy_post(rules=json.dumps([SMALL]), **{"try": "1"})
    )

    html = response.content.decode()
    assert "would have: 2 approved automatically" in html
    policy = ToolPolicy.objects.get(tool=tool)
    assert (policy.needs_approval, policy.rules) == (True, [])
    assert AuditEvent.objects.filter(verb__startswith="policy_").count() == 1


def test_an_htmx_try_answers_the_panel_only(client, admin_user, agent):
    _refunds(agent, [10])
    [tool] = declare_tools(agent, [{"name": "refund", "kind": "effect"}])
    client.force_login(admin_user)

    response = client.post(
        f"/tools/{tool.pk}/policy",
        _policy_post(rules=json.dumps([SMALL]), **{"try": "1"}),
        headers={"HX-Request": "true"},
    )

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="tool-detail"')
    assert "would have: 1 approved automatically" in html
