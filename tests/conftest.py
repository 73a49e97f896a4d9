"""The cast every test can use: two agents, two operators, a viewer, an admin, an outsider;
and ``new_client``, which makes each client test run for both clients (client_helpers.py).

Other rows are made inline where a test needs them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from client_helpers import client_kind, new_client  # noqa: F401 (fixtures for every module)
from db_helpers import connect_outside_django
from django.contrib.auth.models import Group, User

from runs.models import Agent
from tests.slack_fake import slack  # noqa: F401 (Slack on, its Web API a loopback fake)


@pytest.fixture(autouse=True)
def _fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _agent(name: str) -> Agent:
    agent = Agent(name=name)
    agent.token = agent.set_new_token()  # the clear token, for tests only
    agent.save()
    return agent


@pytest.fixture
def agent(db) -> Agent:
    return _agent("support-bot")


@pytest.fixture
def other_agent(db) -> Agent:
    return _agent("other-bot")


def _user(username: str, group: str | None = None) -> User:
    user = User.objects.create_user(username, f"{username}@example.com", "pw-" + username)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return user


@pytest.fixture
def operator(db) -> User:
    return _user("olivia", "operators")


@pytest.fixture
def second_operator(db) -> User:
    return _user("oscar", "operators")


@pytest.fixture
def viewer(db) -> User:
    return _user("vera")


@pytest.fixture
def admin_user(db) -> User:
    return _user("ada", "admins")


@pytest.fixture
def outsider(db) -> User:
    """A deactivated account: signed in once, now refused everywhere."""
    user = _user("otto")
    user.is_active = False
    user.save()
    return user


@pytest.fixture
def allow_loopback(settings):
    """The tests' loopback runtime and webhook, allowed as an administrator allows a
    runtime on the same host (startsafe sends only to public addresses otherwise)."""
    settings.STARTSAFE = {**settings.STARTSAFE, "OUTBOUND_ALLOW": ["127.0.0.1"]}


@pytest.fixture
def other_connection():
    """A second connection to the test database, outside Django's (PostgreSQL)."""
    conn = connect_outside_django()
    try:
        yield conn
    finally:
        conn.close()


# --- Browser tests (Playwright driving Debian's chromium) -------------------------

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        # Never a silent skip: make test and .ci/run install it.
        pytest.fail("Debian's chromium is not installed (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; Django's ORM calls made
    # by the test itself are then wrongly flagged as "async unsafe".
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    yield page
    context.close()
