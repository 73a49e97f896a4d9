"""Signed e-mail links (approvals/links.py, approvals/views_links.py).

A link names one effect's version, one recipient and one action; following it shows
a page to confirm and decides nothing; the POST from that page decides once, through
the console's rules. Every refusal changes nothing.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.core import mail
from django.db import connection
from django.test import Client
from django.utils import timezone
from django.utils.html import escape
from race_helpers import start_waiting_on

from approvals.decisions import approve_effect
from approvals.links import LinkRefused, decide_by_link, link_expiry, link_path, make_token
from approvals.models import EmailLinkUse
from approvals.notifications import notify
from runs.calls import record_call
from runs.models import AuditEvent, Effect, EffectStatus
from tests.console_helpers import CAMPAIGN_ARGS, awaiting_campaign

pytestmark = pytest.mark.django_db

BASE = "https://startsafe.example.com"


@pytest.fixture(autouse=True)
def _public_url(settings):
    settings.STARTSAFE = {**settings.STARTSAFE, "PUBLIC_URL": BASE}


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def snapshot(effect: Effect) -> tuple:
    """Everything a decision would change: the effect's row, its trail, the link uses."""
    row = Effect.objects.values("status", "revision", "args_hash", "current_approvals").get(
        pk=effect.pk
    )
    return (
        row,
        AuditEvent.objects.filter(effect=effect).count(),
        EmailLinkUse.objects.count(),
    )


def links_in(body: str) -> dict[str, list[str]]:
    """The console paths each action's links lead to, in the order the body lists them."""
    found: dict[str, list[str]] = {}
    for label, url in re.findall(rf"^  (Approve|Reject|Mark done|Open): ({BASE}\S+)$", body, re.M):
        found.setdefault(label, []).append(url.removeprefix(BASE))
    return found


# --- The e-mail ------------------------------------------------------------------


def test_the_email_names_each_effect_and_its_links_work_when_followed(
    agent, operator, second_operator
):
    first = awaiting_campaign(agent, "ticket-1")
    second = awaiting_campaign(agent, "ticket-2")

    notify()

    by_address = {message.to[0]: message for message in mail.outbox}
    assert set(by_address) == {"olivia@example.com", "oscar@example.com"}
    body = by_address["olivia@example.com"].body
    for effect in (first, second):
        assert effect.preview in body  # "Send 'Winter sale' for ticket-1"
        assert f"Tool: send_campaign · run {effect.run.run_key} · deadline " in body
        assert f"{effect.approval_expires_at:%Y-%m-%d %H:%M} UTC" in body
    links = links_in(body)
    assert links["Open"] == [f"/effects/{first.pk}/", f"/effects/{second.pk}/"]
    assert len(links["Approve"]) == len(links["Reject"]) == len(links["Mark done"]) == 2
    # Each recipient's links are their own.
    assert set(links_in(by_address["oscar@example.com"].body)["Approve"]).isdisjoint(
        links["Approve"]
    )

    client = signed_in(operator)
    page = client.get(links["Approve"][0])
    assert page.status_code == 200
    assert escape(first.preview) in page.content.decode()
    answer = client.post(links["Approve"][0], {"note": "looks right"})
    assert answer.status_code == 303 and answer["Location"] == f"/effects/{first.pk}/"
    first.refresh_from_db()
    assert first.status == EffectStatus.APPROVED
    event = AuditEvent.objects.get(effect=first, verb="approved")
    assert (event.actor, event.note) == ("olivia", "looks right (via e-mail link)")

    # The second effect's reject link rejects it, with the note it requires.
    assert client.post(links["Reject"][1], {"note": "wrong segment"}).status_code == 303
    second.refresh_from_db()
    assert second.status == EffectStatus.REJECTED
    assert second.decision["note"] == "wrong segment (via e-mail link)"


def test_an_address_that_is_no_operators_gets_the_console_link_only(agent, operator, settings):
    settings.STARTSAFE = {**settings.STARTSAFE, "NOTIFY_EMAILS": ["oncall@example.org"]}
    effect = awaiting_campaign(agent)

    notify()

    (message,) = mail.outbox
    links = links_in(message.body)
    assert links == {"Open": [f"/effects/{effect.pk}/"]}
    assert "carries no action links" in message.body


def test_an_address_two_accounts_share_gets_no_action_links(agent, operator, settings):
    # A link decides for one person: whose decision it would be is not known here.
    twin = User.objects.create_user("olivia2", "Olivia@example.com", "pw-olivia2")
    twin.groups.add(Group.objects.get(name="operators"))
    settings.STARTSAFE = {**settings.STARTSAFE, "NOTIFY_EMAILS": ["olivia@example.com"]}
    awaiting_campaign(agent)

    notify()

    (message,) = mail.outbox
    assert "Approve" not in links_in(message.body)
    assert "carries no action links" in message.body


# --- A GET decides nothing ------------------------------------------------------


def test_following_a_link_changes_nothing_signed_in_or_not(agent, operator):
    effect = awaiting_campaign(agent)
    path = link_path(make_token(effect, operator, "approve"))
    before = snapshot(effect)

    # A mail scanner, not signed in: sent to sign in.
    scanner = Client().get(path)
    assert scanner.status_code == 302 and scanner["Location"].startswith("/accounts/login/")
    # The recipient, signed in: the page to confirm, with the effect's current content.
    page = signed_in(operator).get(path)
    assert page.status_code == 200
    assert CAMPAIGN_ARGS["subject"] in page.content.decode()
    assert 'id="link-form"' in page.content.decode()

    assert snapshot(effect) == before


# --- Each refusal, and that it changes nothing -----------------------------------


def test_a_tampered_link_is_refused(agent, operator):
    effect = awaiting_campaign(agent)
    token = make_token(effect, operator, "approve")
    # One character of the signed payload changed: the signature no longer matches.
    tampered = token.replace(token[5], "A" if token[5] != "A" else "B", 1)
    before = snapshot(effect)

    client = signed_in(operator)
    for answer in (
        client.get(link_path(tampered)),
        client.post(link_path(tampered), {"note": "x"}),
    ):
        assert answer.status_code == 400
        assert "not valid" in answer.content.decode()
    assert snapshot(effect) == before


def test_a_link_expires_after_its_ttl(agent, operator, settings):
    settings.STARTSAFE = {**settings.STARTSAFE, "EMAIL_LINK_TTL": 600}
    effect = awaiting_campaign(agent)  # its deadline is a day away
    path = link_path(make_token(effect, operator, "approve"))
    before = snapshot(effect)
    client = signed_in(operator)

    with time_machine.travel(timezone.now() + timedelta(seconds=590)):
        assert client.get(path).status_code == 200
    with time_machine.travel(timezone.now() + timedelta(seconds=610)):
        page = client.get(path)
        answer = client.post(path, {"note": "late"})
    assert page.status_code == answer.status_code == 410
    assert "This link expired" in answer.content.decode()
    assert snapshot(effect) == before


def test_a_shorter_ttl_set_later_shortens_the_links_already_sent(agent, operator, settings):
    effect = awaiting_campaign(agent)
    path = link_path(make_token(effect, operator, "approve"))  # for a day
    settings.STARTSAFE = {**settings.STARTSAFE, "EMAIL_LINK_TTL": 600}  # then 10 minutes

    with time_machine.travel(timezone.now() + timedelta(seconds=610)):
        answer = signed_in(operator).post(path, {"note": ""})

    assert answer.status_code == 410
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL


def test_a_link_never_outlives_the_effects_deadline(agent, operator):
    effect = awaiting_campaign(agent, approval_ttl=300)  # the link's TTL is a day
    now = timezone.now()
    assert link_expiry(effect, now) == effect.approval_expires_at
    token = make_token(effect, operator, "reject", now)

    with (
        time_machine.travel(effect.approval_expires_at + timedelta(seconds=1)),
        pytest.raises(LinkRefused) as refused,
    ):
        decide_by_link(token, operator, note="too late")
    assert refused.value.status == 410
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL  # the link decided nothing


def test_a_link_decides_only_for_its_recipient(agent, operator, second_operator):
    effect = awaiting_campaign(agent)
    path = link_path(make_token(effect, second_operator, "approve"))  # oscar's link
    before = snapshot(effect)

    client = signed_in(operator)  # olivia follows it
    for answer in (client.get(path), client.post(path, {"note": "mine now"})):
        assert answer.status_code == 403
        assert "sent to another person" in answer.content.decode()
    assert snapshot(effect) == before


def test_a_link_of_someone_no_longer_an_operator_is_refused(agent, operator):
    effect = awaiting_campaign(agent)
    path = link_path(make_token(effect, operator, "approve"))
    operator.groups.clear()
    before = snapshot(effect)

    client = signed_in(operator)
    for answer in (client.get(path), client.post(path, {"note": ""})):
        assert answer.status_code == 403
        assert "needs the operator role" in answer.content.decode()
    assert snapshot(effect) == before


def test_a_link_for_arguments_that_changed_since_the_email_is_refused(agent, operator):
    effect = awaiting_campaign(agent)
    path = link_path(make_token(effect, operator, "approve"))
    # The agent's next call rewrites the subject before anyone decided.
    record_call(
        agent,
        effect.run_id,
        attempt=1,
        tool="send_campaign",
        kind="effect",
        args=dict(CAMPAIGN_ARGS, campaign_id="ticket-1", subject="Winter SALE!!!"),
        key=effect.key,
        key_source="intent",
        needs_approval=True,
    )
    before = snapshot(effect)

    client = signed_in(operator)
    page = client.get(path)
    answer = client.post(path, {"note": "ok"})
    assert page.status_code == answer.status_code == 409
    for html in (page.content.decode(), answer.content.decode()):
        assert "The arguments changed" in html
        assert "Winter SALE!!!" in html  # the current content, with the diff
    assert 'id="link-form"' not in page.content.decode()
    assert snapshot(effect) == before


def test_a_link_decides_once(agent, operator):
    effect = awaiting_campaign(agent)
    path = link_path(make_token(effect, operator, "approve"))
    client = signed_in(operator)

    assert client.post(path, {"note": ""}).status_code == 303
    after_first = snapshot(effect)
    again = client.post(path, {"note": ""})
    page = client.get(path)

    assert again.status_code == page.status_code == 410
    assert "used already" in again.content.decode()
    assert snapshot(effect) == after_first
    assert AuditEvent.objects.filter(effect=effect, verb="approved").count() == 1
    assert AuditEvent.objects.get(effect=effect, verb="approved").note == "via e-mail link"


def test_two_approvers_each_approve_from_their_own_link(agent, operator, second_operator):
    effect = awaiting_campaign(agent, approvals_required=2)
    olivias = [link_path(make_token(effect, operator, "approve")) for _ in range(2)]
    oscars = link_path(make_token(effect, second_operator, "approve"))
    client = signed_in(operator)

    first = client.post(olivias[0], {"note": ""}, follow=True)
    assert "Your approval of send_campaign is recorded (1 of 2)." in first.content.decode()
    # Her other link for the same version: the two-person rule still holds.
    page = client.get(olivias[1])
    assert page.status_code == 409 and "You already approved this version." in (
        page.content.decode()
    )
    assert client.post(olivias[1], {"note": ""}).status_code == 409
    effect.refresh_from_db()
    assert effect.status == EffectStatus.AWAITING_APPROVAL

    assert signed_in(second_operator).post(oscars, {"note": ""}).status_code == 303
    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED
    assert [a["by"] for a in effect.current_approvals] == ["olivia", "oscar"]


def test_reject_by_link_needs_a_note(agent, operator):
    effect = awaiting_campaign(agent)
    path = link_path(make_token(effect, operator, "reject"))
    before = snapshot(effect)

    answer = signed_in(operator).post(path, {"note": "  "})

    assert answer.status_code == 400
    # The form again, with why: the operator adds a note and confirms.
    assert "A note is required." in answer.content.decode()
    assert 'id="link-form"' in answer.content.decode()
    assert snapshot(effect) == before


def test_a_link_to_an_effect_decided_meanwhile_is_refused_and_not_used_up(
    agent, operator, second_operator
):
    effect = awaiting_campaign(agent)
    path = link_path(make_token(effect, operator, "approve"))
    approve_effect(second_operator, effect.pk, args_hash=effect.args_hash)  # in the console
    before = snapshot(effect)

    client = signed_in(operator)
    page = client.get(path)
    answer = client.post(path, {"note": "me too"})

    assert page.status_code == 409 and "It can no longer be done" in page.content.decode()
    # The rule's own refusal, as the console answers it; the link is not spent by it.
    assert answer.status_code == 409 and "not allowed while the effect is approved" in (
        answer.content.decode()
    )
    assert snapshot(effect) == before


# --- Two POSTs of one link at once ------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs one writer at a time")
def test_two_concurrent_posts_of_one_link_decide_once(agent, operator):
    effect = awaiting_campaign(agent)
    token = make_token(effect, operator, "approve")

    def use():
        return decide_by_link(token, operator, note="")

    # The effect's row is held from outside until both wait: one on the row (it
    # recorded the use), the other on the first's use of the nonce. Then they meet.
    outcomes = start_waiting_on(Effect, effect.pk, [use, use])

    decided = [o for o in outcomes if isinstance(o, Effect)]
    refused = [o for o in outcomes if isinstance(o, LinkRefused)]
    assert len(decided) == 1 and len(refused) == 1, outcomes
    assert refused[0].status == 410  # refused as a reused link, not by the state
    assert AuditEvent.objects.filter(effect=effect, verb="approved").count() == 1
    assert EmailLinkUse.objects.count() == 1
