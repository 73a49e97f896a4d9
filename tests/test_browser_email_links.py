"""A signed e-mail link in a real browser (issue 21's acceptance): the operator follows
the approve link from the notification e-mail, signs in when asked, lands on the
page to confirm, and approves there."""

from __future__ import annotations

import re

import pytest
from django.core import mail

from approvals.notifications import notify
from runs.models import AuditEvent, EffectStatus
from tests.console_helpers import awaiting_campaign
from tests.test_browser_console import _roles, shot  # noqa: F401 (_roles: autouse)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_follows_the_emails_link_and_approves_on_the_confirm_page(
    page, live_server, operator, agent, settings
):
    settings.STARTSAFE = {**settings.STARTSAFE, "PUBLIC_URL": live_server.url}
    effect = awaiting_campaign(agent)
    notify()
    (message,) = mail.outbox
    (link,) = re.findall(r"^  Approve: (\S+)$", message.body, re.M)
    assert link.startswith(f"{live_server.url}/links/")

    page.goto(link)
    # Not signed in: the sign-in page first, which leads back to the link.
    page.wait_for_url(re.compile(r"/accounts/login/\?next=/links/"))
    page.get_by_label("Username").fill("olivia")
    page.get_by_label("Password").fill("pw-olivia")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(link)

    assert page.get_by_role("heading", name=f"Approve: {effect.preview}").is_visible()
    assert "Winter sale" in page.locator("pre.json").inner_text()
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL  # the page decided nothing
    shot(page, "email-link-confirm")

    page.get_by_label("Note (optional)").fill("fine from my phone")
    page.get_by_role("button", name="Approve").click()
    page.wait_for_url(f"{live_server.url}/effects/{effect.pk}/")

    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED
    event = AuditEvent.objects.get(effect=effect, verb="approved")
    assert (event.actor, event.note) == ("olivia", "fine from my phone (via e-mail link)")
    assert "Approved send_campaign" in page.locator("#toasts").inner_text()
