"""Operators' notifications: written as outbox rows, sent as one batched message."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from smtplib import SMTPRecipientsRefused, SMTPServerDisconnected

import pytest
from django.core import mail
from django.core.mail.backends.locmem import EmailBackend as LocmemBackend
from django.db import transaction

from approvals.models import Notification, NotificationEmail
from approvals.notifications import (
    collect_notifications,
    notify,
    operator_emails,
    send_pending_notifications,
)
from runs.calls import record_call
from runs.lifecycle import start_run
from runs.models import Effect, Run, TaskState
from runs.signals import runs_need_person
from runs.sweep import sweep
from tests.runtime_server import RuntimeServer

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch):
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda *a, **kw: None)


def _awaiting(agent, run, n: int, ttl: int = 86_400) -> Effect:
    return record_call(
        agent,
        run.pk,
        attempt=1,
        tool="refund",
        kind="effect",
        args={"order": n},
        key=f"refund:{n}",
        key_source="intent",
        needs_approval=True,
        approval_ttl=ttl,
        preview=f"Refund order {n}",
        now=T0,
    ).effect


@pytest.mark.django_db
def test_a_burst_of_500_awaiting_effects_is_one_email_per_operator(
    agent, operator, second_operator
):
    run = start_run(agent, "bulk-refunds", heartbeat_timeout=3600, now=T0).run
    for n in range(500):
        _awaiting(agent, run, n)

    report = notify(now=later(5))

    # One message to each operator (their action links are theirs alone), counting all 500.
    assert report.emails == 2 and report.sent == 500
    assert sorted(m.to for m in mail.outbox) == [["olivia@example.com"], ["oscar@example.com"]]
    for message in mail.outbox:
        assert "500 awaiting approval" in message.subject
        assert "... and 450 more" in message.body
    assert Notification.objects.filter(status="sent").count() == 500
    # Sending again sends nothing: every row is done.
    assert notify(now=later(10)).emails == 0
    assert len(mail.outbox) == 2


@pytest.mark.django_db
def test_collecting_twice_writes_each_piece_of_news_once(agent, operator):
    run = start_run(agent, "job", heartbeat_timeout=3600, now=T0).run
    _awaiting(agent, run, 1)

    collect_notifications(now=later(1))
    collect_notifications(now=later(2))

    assert Notification.objects.filter(kind="awaiting_approval").count() == 1


@pytest.mark.django_db
def test_an_effect_decided_before_the_batch_goes_out_is_not_news(agent, operator):
    run = start_run(agent, "job", heartbeat_timeout=3600, now=T0).run
    effect = _awaiting(agent, run, 1)
    collect_notifications(now=later(1))
    Effect.objects.filter(pk=effect.pk).update(status="approved")

    report = send_pending_notifications(now=later(2))

    assert report.skipped == 1 and report.emails == 0
    assert mail.outbox == []


@pytest.mark.django_db
def test_an_approval_near_its_deadline_is_announced_once(agent, operator, settings):
    settings.STARTSAFE = {**settings.STARTSAFE, "NOTIFY_DEADLINE_WARNING": 600}
    run = start_run(agent, "job", heartbeat_timeout=7200, now=T0).run
    effect = _awaiting(agent, run, 1, ttl=3600)
    notify(now=later(1))
    mail.outbox.clear()

    collect_notifications(now=later(2000))  # 1600 s left: not yet
    assert not Notification.objects.filter(kind="deadline_near").exists()

    notify(now=later(3100))  # 500 s left
    notify(now=later(3200))

    (message,) = mail.outbox
    assert "1 near their deadline" in message.subject
    assert str(effect.pk) in message.body


@pytest.mark.django_db
def test_a_run_that_needs_a_person_is_announced(agent, operator):
    start_run(agent, "job", heartbeat_timeout=5, restart_policy="manual", now=T0)
    sweep(now=later(6))

    notify(now=later(7))

    (message,) = mail.outbox
    assert "1 run(s) need a person" in message.subject
    assert "job" in message.body


@pytest.mark.django_db
def test_the_journals_news_is_written_in_its_transaction_and_rolls_back_with_it(agent):
    # The journal announces by a signal (runs/signals.py); the notification is
    # written by the receiver inside the sender's transaction, so operators never
    # hear of an interruption that did not happen.
    run = start_run(agent, "job", now=T0).run
    with pytest.raises(RuntimeError), transaction.atomic():
        runs_need_person.send(Run, runs=[(run, "manual policy")], now=T0)
        assert Notification.objects.get(kind="needs_person").line == (
            "Run job (attempt 1) needs a person: manual policy."
        )
        raise RuntimeError("the sweep's transaction fails after the news")
    assert not Notification.objects.exists()


@pytest.mark.django_db
def test_configured_addresses_replace_the_operators_group(operator, settings):
    settings.STARTSAFE = {**settings.STARTSAFE, "NOTIFY_EMAILS": ["oncall@example.com"]}
    assert operator_emails() == ["oncall@example.com"]


@pytest.mark.django_db
def test_operators_without_an_address_and_non_operators_get_no_mail(operator, viewer):
    operator.email = ""
    operator.save()
    assert operator_emails() == []


@pytest.mark.django_db
def test_the_webhook_gets_one_json_post_per_batch(agent, operator, settings, allow_loopback):
    with RuntimeServer() as hook:
        settings.STARTSAFE = {**settings.STARTSAFE, "NOTIFY_WEBHOOK_URL": hook.url}
        run = start_run(agent, "job", heartbeat_timeout=3600, now=T0).run
        for n in range(3):
            _awaiting(agent, run, n)

        report = notify(now=later(5))

    assert report.webhooks == 1
    (post,) = hook.deliveries
    assert post["body"]["counts"]["awaiting_approval"] == 3
    assert post["body"]["text"].startswith("startsafe: 3 awaiting approval")


@pytest.mark.django_db
def test_a_failing_webhook_is_retried_without_resending_the_email(
    agent, operator, settings, allow_loopback
):
    answers = iter([500, 200])
    with RuntimeServer(lambda d: next(answers)) as hook:
        settings.STARTSAFE = {**settings.STARTSAFE, "NOTIFY_WEBHOOK_URL": hook.url}
        run = start_run(agent, "job", heartbeat_timeout=3600, now=T0).run
        _awaiting(agent, run, 1)

        first = notify(now=later(5))
        row = Notification.objects.get()
        assert (row.status, row.tries) == ("pending", 1)
        assert "HTTP 500" in row.last_error
        second = notify(now=later(60))

    assert (first.webhook_failures, second.webhooks) == (1, 1)
    assert len(mail.outbox) == 1  # the e-mail went out once
    assert Notification.objects.get().status == "sent"
    # The metrics count the failure.
    assert TaskState.objects.get(name="notify").counters["webhook_failures"] == 1


@pytest.mark.django_db
def test_rows_claimed_by_a_sender_are_not_sent_twice_until_its_lease_passes(agent, operator):
    run = start_run(agent, "job", heartbeat_timeout=3600, now=T0).run
    _awaiting(agent, run, 1)
    collect_notifications(now=later(1))
    from approvals.notifications import claim_pending

    claimed = claim_pending(later(2))  # a sender that then died
    assert len(claimed) == 1

    assert send_pending_notifications(now=later(3)).claimed == 0
    assert send_pending_notifications(now=later(3 + 200)).emails == 1


class DropsAfterTwo(LocmemBackend):
    """An SMTP server that drops the connection after two messages: every later
    message on it fails."""

    def send_messages(self, messages):
        self.taken = getattr(self, "taken", 0) + 1
        if self.taken > 2:
            raise SMTPServerDisconnected("Connection unexpectedly closed")
        return super().send_messages(messages)


class RefusesBob(LocmemBackend):
    def send_messages(self, messages):
        if messages[0].to == ["bob@example.com"]:
            raise SMTPRecipientsRefused({"bob@example.com": (550, b"no such user")})
        return super().send_messages(messages)


FIVE = [f"{name}@example.com" for name in ("ann", "bob", "cat", "dan", "eve")]


def _one_effect_news_for_five(agent, settings, backend) -> None:
    settings.STARTSAFE = {**settings.STARTSAFE, "NOTIFY_EMAILS": FIVE}
    settings.EMAIL_BACKEND = f"{__name__}.{backend.__name__}"
    run = start_run(agent, "job", heartbeat_timeout=3600, now=T0).run
    _awaiting(agent, run, 1)


@pytest.mark.django_db
def test_a_connection_dropped_part_way_sends_the_rest_once_and_nobody_twice(agent, settings):
    _one_effect_news_for_five(agent, settings, DropsAfterTwo)

    first = notify(now=later(5))

    assert [m.to for m in mail.outbox] == [["ann@example.com"], ["bob@example.com"]]
    assert (first.emails, first.email_failures, first.sent) == (2, 3, 0)
    row = Notification.objects.get()
    assert (row.status, row.tries, row.email_done_at) == ("pending", 1, None)
    assert "SMTPServerDisconnected" in row.last_error
    assert sorted(NotificationEmail.objects.values_list("address", flat=True)) == FIVE[:2]

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    second = notify(now=later(60))

    assert sorted(m.to[0] for m in mail.outbox) == FIVE  # each address once
    assert [m.to for m in mail.outbox[2:]] == [[a] for a in FIVE[2:]]
    assert (second.emails, second.email_failures, second.sent) == (3, 0, 1)
    assert Notification.objects.get().status == "sent"
    assert notify(now=later(120)).emails == 0


@pytest.mark.django_db
def test_a_refused_address_does_not_hold_back_the_others(agent, settings):
    _one_effect_news_for_five(agent, settings, RefusesBob)

    notify(now=later(5))
    notify(now=later(60))  # bob still refused: only his message is tried again

    assert sorted(m.to[0] for m in mail.outbox) == [a for a in FIVE if a != "bob@example.com"]
    row = Notification.objects.get()
    assert (row.status, row.tries) == ("pending", 2)
    assert "SMTPRecipientsRefused" in row.last_error
