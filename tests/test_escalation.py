"""Escalation (approvals/escalation.py): an effect still awaiting approval when its SLA
passes goes, once, to the escalation group, with an audit event ``escalated``."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import Group, User
from django.core import mail
from django.db import connection
from django.test import Client
from race_helpers import start_waiting_on

from approvals.decisions import approve_effect
from approvals.escalation import escalate
from approvals.models import Escalation
from approvals.notifications import notify
from runs.models import AuditEvent, Effect, EffectStatus
from tests.console_helpers import awaiting_campaign

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
BASE = "https://startsafe.example.com"
TTL = 3600  # the effect's deadline window: an hour


@pytest.fixture(autouse=True)
def _escalation(settings):
    settings.STARTSAFE = {
        **settings.STARTSAFE,
        "PUBLIC_URL": BASE,
        # A quarter of the way: 900 s into the hour (0.5 would not tell the share from
        # its complement).
        "ESCALATION_SLA": 0.25,
        "ESCALATE_EMAILS": ["boss@example.com", "desk@example.org", "vera@example.com"],
    }


@pytest.fixture
def boss(db) -> User:
    """The escalation group's console operator (desk@example.org has no account)."""
    user = User.objects.create_user("bea", "boss@example.com", "pw-bea")
    user.groups.add(Group.objects.get(name="operators"))
    return user


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def notify_at(seconds: float) -> None:
    with time_machine.travel(at(seconds), tick=False):
        notify()


def escalation_mail() -> dict[str, str]:
    return {m.to[0]: m.body for m in mail.outbox if m.subject.startswith("startsafe: 1 escalated")}


def recorded(agent) -> Effect:
    with time_machine.travel(T0, tick=False):
        return awaiting_campaign(agent, approval_ttl=TTL)


def test_an_effect_escalates_once_when_its_sla_passes(agent, operator, boss, viewer):
    effect = recorded(agent)

    notify_at(899)  # not yet: 900 s is a quarter of the hour
    assert not Escalation.objects.exists()
    assert escalation_mail() == {}

    notify_at(901)
    notify_at(1500)  # and never again
    notify_at(3000)

    (event,) = AuditEvent.objects.filter(effect=effect, verb="escalated")
    assert (event.actor, event.at) == ("system", at(901))
    assert Escalation.objects.get(effect=effect).due_at == at(900)
    sent = escalation_mail()
    assert set(sent) == {"boss@example.com", "desk@example.org", "vera@example.com"}
    # The operators heard of it when it started awaiting; the escalation is not theirs.
    assert not any("escalated" in m.subject for m in mail.outbox if m.to == ["olivia@example.com"])
    # Bea (an operator's account) gets links; the desk's address (no account) and Vera
    # (a viewer, who may not decide) the page only, and why.
    assert "Approve: " in sent["boss@example.com"]
    for address in ("desk@example.org", "vera@example.com"):
        assert "Approve: " not in sent[address]
        assert f"Open: {BASE}/effects/{effect.pk}/" in sent[address]
        assert "carries no action links" in sent[address]


def test_the_escalation_emails_link_approves_for_its_recipient(agent, operator, boss):
    effect = recorded(agent)
    notify_at(901)
    body = escalation_mail()["boss@example.com"]
    (approve,) = re.findall(rf"^  Approve: {BASE}(\S+)$", body, re.M)

    client = Client()
    client.force_login(boss)
    with time_machine.travel(at(1000), tick=False):
        assert client.get(approve).status_code == 200
        assert client.post(approve, {"note": ""}).status_code == 303
    effect.refresh_from_db()
    assert effect.status == EffectStatus.APPROVED and effect.decision["by"] == "bea"


def test_an_effect_decided_in_time_is_not_escalated(agent, operator, boss):
    effect = recorded(agent)
    with time_machine.travel(at(600), tick=False):
        approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    notify_at(901)
    notify_at(3000)

    assert not Escalation.objects.exists()
    assert not AuditEvent.objects.filter(verb="escalated").exists()
    assert escalation_mail() == {}


def test_an_effect_decided_after_it_was_found_due_is_not_escalated(agent, operator, boss):
    # The decision won the effect's lock between the pass's query and its escalation.
    effect = recorded(agent)
    with time_machine.travel(at(950), tick=False):
        approve_effect(operator, effect.pk, args_hash=effect.args_hash)

    assert escalate(effect.pk, at(951)) is False
    assert not AuditEvent.objects.filter(verb="escalated").exists()


def test_an_effect_past_its_deadline_is_not_escalated(agent, operator, boss):
    effect = recorded(agent)

    notify_at(TTL + 1)
    # Nor by a pass that found it due the instant before (the sweep had not expired it).
    assert escalate(effect.pk, at(TTL + 1)) is False

    assert not Escalation.objects.exists()


def test_without_an_escalation_group_nothing_escalates(agent, operator, settings):
    settings.STARTSAFE = {**settings.STARTSAFE, "ESCALATE_EMAILS": []}
    recorded(agent)

    notify_at(901)

    assert not Escalation.objects.exists()


def test_the_effect_page_says_when_it_escalated(agent, operator, boss):
    effect = recorded(agent)
    notify_at(901)
    client = Client()
    client.force_login(operator)

    page = client.get(f"/effects/{effect.pk}/").content.decode()

    assert "escalated at 2026-01-05 09:15 UTC" in page


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite runs one writer at a time")
def test_two_workers_escalating_at_once_escalate_once(agent, boss):
    effect = recorded(agent)

    outcomes = start_waiting_on(Effect, effect.pk, [lambda: escalate(effect.pk, at(901))] * 2)

    assert sorted(outcomes) == [False, True]
    assert AuditEvent.objects.filter(effect=effect, verb="escalated").count() == 1
