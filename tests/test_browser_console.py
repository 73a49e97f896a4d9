"""The console in a real browser: Playwright driving Debian's chromium.

Each test signs in through the login form, acts like an operator would, and saves a
screenshot under test-artifacts/ (the README's screenshots come from these).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest

from runs.lifecycle import action_for
from runs.models import Effect, EffectStatus
from runs.outcomes import claim_effect
from tests.console_helpers import awaiting_campaign, failed_unkeyed_run, unknown_effect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


@pytest.fixture(autouse=True)
def _roles(transactional_db):
    """The flush after each transactional test drops the groups the migration made.

    The flush's post_migrate recreates the permissions; the groups are made again
    here from the migration's own lists, so the roles stay the migration's.
    """
    import importlib

    from django.contrib.auth.models import Group, Permission

    roles = importlib.import_module("approvals.migrations.0002_roles")
    for name, wanted in (
        ("operators", roles.OPERATOR_PERMISSIONS),
        ("admins", roles.ADMIN_PERMISSIONS),
    ):
        group, _ = Group.objects.get_or_create(name=name)
        for app_label, codename in wanted:
            group.permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=codename)
            )


def sign_in(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{live_server.url}/")


def shot(page, name: str, *, publish: str | None = None) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if publish:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, SCREENSHOTS / f"{publish}.png")


def test_sign_in_and_see_the_queue(page, live_server, operator, agent):
    awaiting_campaign(agent)
    failed_unkeyed_run(agent)
    unknown_effect(agent)
    sign_in(page, live_server, "olivia")
    assert page.get_by_role("heading", name="Awaiting approval").is_visible()
    assert page.locator("#nav-count").inner_text() == "5"  # 1 awaiting, 2 unknown, 2 runs
    shot(page, "queue", publish="queue")


def test_approve_updates_the_row_in_place_and_the_agent_sees_claim(
    page, live_server, operator, agent
):
    effect = awaiting_campaign(agent)
    sign_in(page, live_server, "olivia")
    # A marker on the window survives only if the page is not reloaded.
    page.evaluate("window.__noReload = true")

    seen: list[str] = []

    def agent_polls():
        # The agent's side: poll the effect until the answer says claim.
        from django.db import connection
        from django.utils import timezone

        try:
            for _ in range(100):
                current = Effect.objects.get(pk=effect.pk)
                seen.append(action_for(current, timezone.now()))
                if seen[-1] == "claim":
                    return
                time.sleep(0.1)
        finally:
            connection.close()

    poller = threading.Thread(target=agent_polls)
    poller.start()
    row = page.locator(f"#effect-{effect.pk}")
    row.get_by_role("button", name="Approve").click()
    page.locator(f'#effect-{effect.pk}[data-status="approved"]').wait_for()
    poller.join(timeout=15)
    assert page.evaluate("window.__noReload") is True
    assert "Approved send_campaign" in page.locator("#toasts").inner_text()
    assert seen and seen[0] == "wait" and seen[-1] == "claim"
    # The agent claims it: execute, exactly what the operator saw.
    claimed, action = claim_effect(agent, effect.pk, run_id=effect.run_id, attempt=1)
    assert action == "execute" and claimed.args == effect.args
    shot(page, "approved-in-place")


def test_approve_with_edits_shows_the_diff_then_approves(page, live_server, operator, agent):
    effect = awaiting_campaign(agent)
    sign_in(page, live_server, "olivia")
    page.goto(f"{live_server.url}/effects/{effect.pk}/edit")
    editor = page.get_by_label("Arguments (a JSON object)")
    editor.fill(editor.input_value().replace("Winter sale", "Winter sale -20%"))
    page.get_by_role("button", name="Review changes").click()
    page.locator("pre.diff .d-add").first.wait_for()
    assert "Winter sale -20%" in page.locator("pre.diff").inner_text()
    shot(page, "approve-with-edits")
    page.get_by_role("button", name="Approve the edited version").click()
    page.wait_for_url(f"{live_server.url}/effects/{effect.pk}/")
    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED
    assert effect.args["subject"] == "Winter sale -20%"
    assert "operator:olivia" in page.content()
    shot(page, "effect", publish="effect")


def test_reject_with_a_note(page, live_server, operator, agent):
    effect = awaiting_campaign(agent)
    sign_in(page, live_server, "olivia")
    row = page.locator(f"#effect-{effect.pk}")
    row.locator("summary", has_text="Reject").click()
    row.get_by_label("Note (required)").fill("Wrong segment")
    row.get_by_role("button", name="Reject").click()
    page.locator(f'#effect-{effect.pk}[data-status="rejected"]').wait_for()
    effect.refresh_from_db()
    assert effect.status == EffectStatus.REJECTED
    assert effect.decision["note"] == "Wrong segment"
    shot(page, "rejected")


def test_mark_an_unknown_effect_done(page, live_server, operator, agent):
    effect = unknown_effect(agent)
    sign_in(page, live_server, "olivia")
    page.goto(f"{live_server.url}/effects/{effect.pk}/")
    # Nothing is chosen for the operator: every decision is folded, and each says,
    # while folded, what it will cause.
    assert page.locator("details.action[open]").count() == 0
    assert page.get_by_role("button", name="Release").is_visible() is False
    assert page.get_by_text("if it did happen, it happens twice").is_visible()
    assert page.get_by_text("The next attempt skips it").is_visible()
    assert page.get_by_text("It is never performed").is_visible()
    shot(page, "unknown-effect")
    page.locator("summary", has_text="Mark done").click()
    panel = page.locator("details", has=page.locator("summary", has_text="Mark done"))
    panel.get_by_label("Note (required)").fill("Found it in Sent Items")
    panel.get_by_role("button", name="Mark done").click()
    page.locator("#effect-detail .page-head [data-status=done]").wait_for()
    effect.refresh_from_db()
    assert effect.status == EffectStatus.DONE
    shot(page, "marked-done")


def test_a_viewer_sees_no_action_buttons(page, live_server, viewer, agent):
    effect = awaiting_campaign(agent)
    run = failed_unkeyed_run(agent)
    sign_in(page, live_server, "vera")
    assert page.locator(f"#effect-{effect.pk}").is_visible()
    assert page.get_by_role("button", name="Approve").count() == 0
    assert page.locator("form[action*='/reject']").count() == 0
    page.goto(f"{live_server.url}/runs/{run.pk}/")
    assert page.locator("form[action*='/abandon']").count() == 0
    assert "deciding needs the operator role" in page.content()
    shot(page, "run", publish="run")


def test_the_queue_picks_up_a_new_awaiting_effect_by_itself(page, live_server, operator, agent):
    sign_in(page, live_server, "olivia")
    assert "Nothing awaits approval." in page.content()
    page.evaluate("window.__noReload = true")
    effect = awaiting_campaign(agent, "arrives-later")
    # The poll runs every 5 s while the tab is visible.
    page.locator(f"#effect-{effect.pk}").wait_for(timeout=15_000)
    assert page.evaluate("window.__noReload") is True
    assert page.locator("#nav-count").inner_text() == "1"
    shot(page, "queue-picked-up")
