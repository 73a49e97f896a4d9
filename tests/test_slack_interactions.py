"""POST /integrations/slack/interactions: Slack's clicks, signed as Slack signs them.

Each refusal changes nothing: the effect stays awaiting approval with no approval
recorded, and the member who clicked is told why (only they see it).
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from approvals.decisions import approve_effect
from approvals.models import Approval, SlackMessage, SlackUserMapping
from approvals.slack import sync_slack
from runs.models import Effect
from tests.slack_fake import (
    FakeSlack,
    click,
    member,
    post_interaction,
    submission,
)
from tests.slack_fake import (
    awaiting_effect as _awaiting,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch):
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda *a, **kw: None)


@pytest.fixture
def olivia_in_slack(slack: FakeSlack, operator):
    """The operator's Slack account: her console e-mail, confirmed by Slack."""
    slack.members["U0OLIVIA"] = member("U0OLIVIA", "Olivia@Example.com")
    return "U0OLIVIA"


def _shown(effect: Effect) -> str:
    """The value the message's buttons carry for ``effect`` as it is now."""
    return f"{effect.pk}:{effect.args_hash}"


def _unchanged(effect: Effect) -> None:
    effect.refresh_from_db()
    assert effect.status == "awaiting_approval" and effect.decision is None
    assert not Approval.objects.filter(effect=effect).exists()


def _told(slack: FakeSlack) -> str:
    (ephemeral,) = slack.made("chat.postEphemeral")
    assert (ephemeral["channel"], ephemeral["user"]) == ("C0APPROVALS", "U0OLIVIA")
    return ephemeral["text"]


def _refused_click(client, agent, slack: FakeSlack) -> str:
    """Approve clicked on a new effect, changing nothing; what the member was told."""
    effect = _awaiting(agent)
    response = post_interaction(client, click(_shown(effect)))
    assert response.status_code == 200
    _unchanged(effect)
    return _told(slack)


def test_a_signed_click_approves_the_version_the_message_showed(
    agent, operator, olivia_in_slack, slack: FakeSlack
):
    effect = _awaiting(agent)
    # Slack sends no CSRF token: its signature is the request's only credential.
    client = Client(enforce_csrf_checks=True)

    response = post_interaction(client, click(_shown(effect)))

    assert response.status_code == 200
    effect.refresh_from_db()
    assert effect.status == "approved" and effect.decision["by"] == "olivia"
    # Bound to the hash on the button, by the console user Slack's e-mail named.
    (approval,) = Approval.objects.filter(effect=effect)
    assert (approval.user, approval.args_hash) == (operator, effect.args_hash)
    assert slack.made("users.info") == [{"user": "U0OLIVIA"}]
    assert slack.made("chat.postEphemeral") == []


def test_a_bad_signature_is_refused_and_changes_nothing(
    client, agent, operator, olivia_in_slack, slack: FakeSlack
):
    effect = _awaiting(agent)

    response = post_interaction(client, click(_shown(effect)), secret="not-the-secret")

    assert response.status_code == 401
    _unchanged(effect)
    assert slack.calls == []  # not even who clicked was asked


def test_a_request_signed_more_than_five_minutes_ago_is_refused(
    client, agent, operator, olivia_in_slack, slack: FakeSlack
):
    effect = _awaiting(agent)

    replayed = post_interaction(client, click(_shown(effect)), age=301)

    assert replayed.status_code == 401
    _unchanged(effect)
    assert slack.calls == []
    # The same request signed just now is taken: only its age was wrong.
    assert post_interaction(client, click(_shown(effect)), age=60).status_code == 200
    effect.refresh_from_db()
    assert effect.status == "approved"


def test_a_request_without_signature_headers_is_refused_even_from_a_signed_in_operator(
    client, agent, operator, slack: FakeSlack
):
    effect = _awaiting(agent)
    body = "payload=" + json.dumps(click(_shown(effect)))
    client.force_login(operator)  # a console session is no credential here

    response = client.post(
        "/integrations/slack/interactions",
        data=body,
        content_type="application/x-www-form-urlencoded",
    )

    assert response.status_code == 401
    _unchanged(effect)


@pytest.mark.parametrize(
    "slack_account",
    [
        pytest.param(None, id="unknown-to-slack"),
        pytest.param({"is_email_confirmed": False}, id="e-mail-not-confirmed"),
        pytest.param({"profile": {"email": "someone@else.example"}}, id="no-such-user"),
        pytest.param({"deleted": True}, id="deactivated-in-slack"),
        pytest.param({"is_bot": True}, id="a-bot"),
    ],
)
def test_a_member_mapped_to_nobody_decides_nothing_and_is_told_so(
    client, agent, operator, slack: FakeSlack, slack_account
):
    if slack_account is not None:
        slack.members["U0OLIVIA"] = {**member("U0OLIVIA", "olivia@example.com"), **slack_account}
    assert "not linked to a startsafe user" in _refused_click(client, agent, slack)


def test_an_inactive_console_user_decides_nothing(
    client, agent, operator, olivia_in_slack, slack: FakeSlack
):
    operator.is_active = False
    operator.save()
    assert "not linked" in _refused_click(client, agent, slack)


def test_an_e_mail_two_console_users_share_maps_to_neither(
    client, agent, operator, olivia_in_slack, slack: FakeSlack, django_user_model
):
    django_user_model.objects.create_user("olivia2", "olivia@example.com", "pw")
    assert "not linked" in _refused_click(client, agent, slack)


def test_an_admins_mapping_wins_over_the_slack_e_mail(
    client, agent, operator, second_operator, olivia_in_slack, slack: FakeSlack
):
    SlackUserMapping.objects.create(slack_user_id="U0OLIVIA", user=second_operator)
    effect = _awaiting(agent)

    post_interaction(client, click(_shown(effect)))

    effect.refresh_from_db()
    assert effect.status == "approved" and effect.decision["by"] == "oscar"
    assert slack.made("users.info") == []


def test_a_mapping_to_a_deactivated_user_maps_to_nobody(
    client, agent, operator, outsider, olivia_in_slack, slack: FakeSlack
):
    # Slack's e-mail names an active operator, but an admin's word comes first.
    SlackUserMapping.objects.create(slack_user_id="U0OLIVIA", user=outsider)
    assert "not linked" in _refused_click(client, agent, slack)


def test_a_mapped_user_without_the_operator_role_decides_nothing(
    client, agent, viewer, slack: FakeSlack
):
    slack.members["U0OLIVIA"] = member("U0OLIVIA", viewer.email)
    assert "needs the operator role" in _refused_click(client, agent, slack)


def test_a_click_on_content_that_changed_since_is_refused_with_the_consoles_link(
    client, agent, operator, second_operator, olivia_in_slack, slack: FakeSlack
):
    effect = _awaiting(agent, approvals_required=2)
    shown = _shown(effect)
    # Another operator edits the arguments before the message is updated.
    approve_effect(
        second_operator, effect.pk, args_hash=effect.args_hash, edited_args={"order": 99}
    )

    post_interaction(client, click(shown))

    effect.refresh_from_db()
    assert effect.status == "awaiting_approval"
    assert [a["by"] for a in effect.current_approvals] == ["oscar"]
    assert not Approval.objects.filter(effect=effect, user=operator).exists()
    told = _told(slack)
    assert "arguments changed" in told
    assert f"https://startsafe.example.com/effects/{effect.pk}/" in told


def test_reject_asks_for_a_note_in_a_modal_and_rejects_with_it(
    client, agent, operator, olivia_in_slack, slack: FakeSlack
):
    effect = _awaiting(agent)

    opened = post_interaction(client, click(_shown(effect), action_id="reject"))

    assert opened.status_code == 200
    _unchanged(effect)  # the click only asks
    (views_open,) = slack.made("views.open")
    assert views_open["trigger_id"] == "1234.5678.abcdef"
    modal = views_open["view"]
    assert modal["callback_id"] == "startsafe_reject"
    assert modal["private_metadata"] == _shown(effect)
    assert any(b["type"] == "input" and b["block_id"] == "note" for b in modal["blocks"])

    # Submitted without a note: the modal stays open and says why.
    empty = post_interaction(client, submission(modal["private_metadata"], "  "))
    assert empty.status_code == 200
    assert empty.json()["response_action"] == "errors"
    assert "note is required" in empty.json()["errors"]["note"]
    _unchanged(effect)

    done = post_interaction(client, submission(modal["private_metadata"], "Wrong customer."))

    assert done.status_code == 200 and done.content == b""  # closes the modal
    effect.refresh_from_db()
    assert effect.status == "rejected"
    assert (effect.decision["by"], effect.decision["note"]) == ("olivia", "Wrong customer.")
    assert effect.decision["args_hash"] == effect.args_hash


def test_a_reject_submitted_by_an_unmapped_member_decides_nothing(
    client, agent, operator, slack: FakeSlack
):
    effect = _awaiting(agent)

    answer = post_interaction(client, submission(_shown(effect), "No."))

    assert "not linked" in answer.json()["errors"]["note"]
    _unchanged(effect)


def test_with_slack_off_the_endpoint_is_not_there(client, agent, slack: FakeSlack, settings):
    settings.STARTSAFE = {**settings.STARTSAFE, "SLACK_BOT_TOKEN": "", "SLACK_SIGNING_SECRET": ""}
    effect = _awaiting(agent)

    assert post_interaction(client, click(_shown(effect))).status_code == 404
    _unchanged(effect)


@pytest.mark.django_db(transaction=True)
def test_the_message_follows_decisions_made_in_slack_and_in_the_console(
    client, agent, operator, olivia_in_slack, slack: FakeSlack, monkeypatch
):
    """Committed for real: each decision's commit queues the task (run here at once)."""
    monkeypatch.setattr("approvals.tasks.slack.apply_async", lambda **kw: sync_slack())
    in_slack, in_console = _awaiting(agent, 1), _awaiting(agent, 2)
    # Both were posted by their own commits.
    assert SlackMessage.objects.filter(status="sent").count() == 2

    post_interaction(client, click(_shown(in_slack)))
    client.force_login(operator)
    client.post(
        reverse("console:reject", kwargs={"effect_id": in_console.pk}),
        {"args_hash": in_console.args_hash, "note": "Not this one."},
    )

    updates = {u["ts"]: json.dumps(u["blocks"]) for u in slack.made("chat.update")}
    rows = {r.effect_id: r.ts for r in SlackMessage.objects.all()}
    assert "Approved by olivia" in updates[rows[in_slack.pk]]
    assert "Rejected by olivia" in updates[rows[in_console.pk]]
    assert "Not this one." in updates[rows[in_console.pk]]
    assert '"approve"' not in updates[rows[in_slack.pk]]
    assert len(slack.made("chat.postMessage")) == 2


def test_an_admin_maps_a_slack_member_in_the_django_admin_and_an_operator_may_not(
    client, admin_user, operator
):
    client.force_login(operator)
    assert client.get("/admin/approvals/slackusermapping/add/").status_code == 403

    client.force_login(admin_user)
    response = client.post(
        "/admin/approvals/slackusermapping/add/",
        {"slack_user_id": "U0OLIVIA", "user": operator.pk},
    )

    assert response.status_code == 302
    assert SlackUserMapping.objects.get().user == operator
