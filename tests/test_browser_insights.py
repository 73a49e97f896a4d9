"""The insights page in a real browser: an operator opens it from the navigation;
its charts show at desktop and at phone size, and the phone never scrolls sideways
(docs/screenshots/insights-desktop.png and insights-phone.png come from here)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from lifecycle_helpers import send, start

from approvals.decisions import approve_effect, reject_effect
from runs.outcomes import complete_effect
from tests.test_browser_console import _roles, shot, sign_in  # noqa: F401 (_roles: autouse)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

MIN = timedelta(minutes=1)
TOOLS = ["send_email", "refund_customer_payment", "update_crm_record", "post_to_slack"]


def _decisions(agent, operator, second_operator):
    """A day ago: each tool asked a few times, decided after 3 to 40 minutes; one
    replay of a done lookup (a duplicate prevented)."""
    base = timezone.now() - timedelta(days=1)
    run = start(agent, "insights", heartbeat_timeout=86_400 * 3, now=base).run
    for n, tool in enumerate(TOOLS):
        for i in range(n + 2):
            effect = send(
                agent, run, tool=tool, key=f"{tool}:{i}", needs_approval=True, now=base
            ).effect
            decided_at = base + timedelta(minutes=3 + 7 * i + 5 * n)
            if i % 3 == 2:
                reject_effect(
                    second_operator, effect.pk, args_hash=effect.args_hash, note="no",
                    now=decided_at,
                )  # fmt: skip
            else:
                approve_effect(operator, effect.pk, args_hash=effect.args_hash, now=decided_at)
    done = send(agent, run, tool="lookup_order", key="order:1", now=base).effect
    complete_effect(agent, done.pk, run_id=run.pk, attempt=1, outcome="done", result={}, now=base)
    assert send(agent, run, tool="lookup_order", key="order:1", now=base + MIN).action == "skip"


def test_an_operator_reads_the_insights_on_a_desktop_and_a_phone(
    page, browser, live_server, operator, second_operator, agent
):
    _decisions(agent, operator, second_operator)

    sign_in(page, live_server, "olivia")
    page.get_by_role("link", name="Insights").click()
    page.wait_for_url(f"{live_server.url}/insights/")
    charts = page.locator("svg.bars")
    assert charts.count() == 4
    for i in range(charts.count()):
        box = charts.nth(i).bounding_box()
        assert charts.nth(i).is_visible() and box["width"] > 200 and box["height"] > 20
    assert page.locator("svg.bars rect.bar").count() == 4 + 1 + 2 + 2
    shot(page, "insights-desktop", publish="insights-desktop")

    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    phone_page = phone.new_page()
    phone_page.set_default_timeout(10_000)
    try:
        sign_in(phone_page, live_server, "olivia")
        phone_page.goto(f"{live_server.url}/insights/")
        first = phone_page.locator("svg.bars").first
        assert first.is_visible()
        assert first.bounding_box()["width"] <= 390
        widths = phone_page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert widths[0] <= widths[1], widths  # no horizontal scroll
        shot(phone_page, "insights-phone", publish="insights-phone")
    finally:
        phone.close()
