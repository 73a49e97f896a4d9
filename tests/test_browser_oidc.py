"""Signing in through the OpenID provider in a real browser (issue 22's acceptance):
the sign-in page's button, the provider's own sign-in form, and back to the queue
with the role the provider's groups give."""

from __future__ import annotations

import pytest

from tests.test_browser_console import _roles, shot  # noqa: F401 (_roles: autouse)
from tests.test_oidc import AXES, CLIENT_ID, CLIENT_SECRET, OIDC, PASSWORDS, Provider

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def provider(tmp_path_factory):
    started = Provider(tmp_path_factory.mktemp("oidc-provider"))
    yield started
    started.stop()


def test_an_operator_signs_in_through_the_provider(page, live_server, provider, settings):
    settings.STARTSAFE = {
        **settings.STARTSAFE,
        "OIDC_ISSUER": provider.issuer,
        "OIDC_CLIENT_ID": CLIENT_ID,
        "OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_PROVIDER_NAME": "Test IdP",
        "OIDC_OPERATOR_GROUPS": ["sre"],
    }
    settings.AUTHENTICATION_BACKENDS = [AXES, OIDC, PASSWORDS]
    # The live server's callback, registered at the provider beside the test client's.
    provider.shell(
        "from oauth2_provider.models import Application\n"
        "app = Application.objects.get()\n"
        f"app.redirect_uris += ' {live_server.url}/oidc/callback/'\n"
        "app.save()"
    )

    page.goto(f"{live_server.url}/accounts/login/")
    shot(page, "oidc-sign-in-page")
    page.get_by_role("link", name="Sign in with Test IdP").click()
    page.wait_for_url(f"{provider.url}/accounts/login/**")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("provider-password")
    page.get_by_role("button", name="Sign in at the provider").click()
    page.wait_for_url(f"{live_server.url}/")
    assert page.locator(".who").inner_text() == "alice · operator"
    shot(page, "oidc-signed-in")

    # The acceptance's last step: the insights page, as this operator, on a desktop
    # and on a phone (tests/test_browser_insights.py checks its figures and charts).
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(f"{live_server.url}/insights/")
    assert page.get_by_role("heading", name="Insights").is_visible()
    shot(page, "oidc-insights-desktop")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    widths = page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert widths[0] <= widths[1], widths  # no sideways scrolling on the phone
    shot(page, "oidc-insights-phone")
