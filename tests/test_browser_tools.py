"""The tool registry in a real browser (issue 20's acceptance): an admin edits a
tool's policy, tries it on the tool's past calls, saves it; an operator then sees
the effect the new policy holds explain why it waits."""

from __future__ import annotations

import json

import pytest
from lifecycle_helpers import send, start

from runs.models import AuditEvent, EffectStatus, Tool, ToolPolicy
from tests.test_browser_console import _roles, shot, sign_in  # noqa: F401 (_roles: autouse)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

RULES = [
    {"id": "huge", "pointer": "/amount", "op": ">", "value": 1000, "action": "block"},
    {"id": "big", "pointer": "/amount", "op": ">", "value": 500, "action": "require",
     "approvals": 2},
    {"id": "small", "pointer": "/amount", "op": "≤", "value": 50, "action": "approve"},
]  # fmt: skip


def test_an_admin_tries_and_saves_a_policy_and_an_operator_sees_why_it_waits(
    page, browser, live_server, admin_user, operator, agent
):
    # The tool's past: 12 small refunds, 3 big ones, 1 huge one, all executed.
    run = start(agent, "refunds-before").run
    for n, amount in enumerate([20] * 12 + [700] * 3 + [5000]):
        assert send(agent, run, tool="refund", key=f"r-{n}", args={"amount": amount}).action == (
            "execute"
        )
    tool = Tool.objects.get(agent=agent, name="refund")

    sign_in(page, live_server, "ada")
    page.get_by_role("link", name="Tools").click()
    page.get_by_role("link", name="refund").click()
    page.wait_for_url(f"{live_server.url}/tools/{tool.pk}/")
    assert page.locator('#tool-detail [data-count="calls"]').inner_text() == "16"

    page.get_by_label("Rules").fill(json.dumps(RULES, ensure_ascii=False, indent=2))
    page.evaluate("window.__noReload = true")
    page.get_by_role("button", name="Try it on the last 100 calls").click()
    summary = page.locator(".trial-summary")
    summary.wait_for()
    assert summary.inner_text() == (
        "would have: 12 approved automatically, 3 sent to two approvers, 1 blocked"
    )
    assert page.evaluate("window.__noReload") is True  # swapped in place by htmx
    assert not ToolPolicy.objects.exists()  # a try saves nothing
    assert (
        "No policy: the declaration in force applies." in page.locator("#tool-detail").inner_text()
    )
    shot(page, "tool-policy-tried")

    page.get_by_role("button", name="Save the policy").click()
    page.locator("#toasts", has_text="Saved the policy of refund").wait_for()
    policy = ToolPolicy.objects.get(tool=tool)
    assert (policy.rules, policy.updated_by) == (RULES, admin_user)
    assert AuditEvent.objects.filter(verb="policy_created", actor="ada").count() == 1
    page.locator("#tool-detail .events-table", has_text="policy_created").wait_for()

    # The agent's next big refund is held by the saved rule.
    run = start(agent, "refunds-after").run
    held = send(agent, run, tool="refund", key="r-big", args={"amount": 800})
    assert held.action == "wait"
    assert held.effect.status == EffectStatus.AWAITING_APPROVAL
    assert held.effect.hold["reason"] == "policy_rule"

    operator_page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    operator_page.set_default_timeout(10_000)
    try:
        sign_in(operator_page, live_server, "olivia")
        operator_page.locator(f"#effect-{held.effect.pk}").get_by_role("link").first.click()
        operator_page.wait_for_url(f"{live_server.url}/effects/{held.effect.pk}/")
        why = operator_page.locator("#hold")
        assert operator_page.get_by_role("heading", name="Why it waits").is_visible()
        assert "The policy of refund, rule big, requires 2 approvals." in why.inner_text()
        assert "0 of 2 for this version" in operator_page.content()
        shot(operator_page, "effect-held-by-policy")
    finally:
        operator_page.context.close()
