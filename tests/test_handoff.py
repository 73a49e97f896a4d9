"""The restart hand-off as plain functions, against a loopback runtime; clock by ``now=``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from approvals.decisions import allow_restart
from approvals.models import Notification
from runs.handoff import backoff, deliver_restart_handoff, dispatch_due_handoffs
from runs.lifecycle import start_run
from runs.models import AuditEvent, RestartHandoff
from runs.sweep import sweep
from tests.runtime_server import RuntimeServer

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def later(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.fixture
def queued(monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setattr(
        "runs.handoff.enqueue_handoff",
        lambda run_id, attempt, **kw: calls.append((run_id, attempt)),
    )
    return calls


def _handed_back(agent, url):
    """A run interrupted by the sweep at T0+6 and handed back (attempt 2 next)."""
    run = start_run(agent, "job-1", heartbeat_timeout=5, restart_url=url, now=T0).run
    sweep(now=later(6))
    run.refresh_from_db()
    assert run.restart_ready
    return run


@pytest.mark.django_db
def test_a_handoff_posts_the_next_attempt_with_its_idempotency_key(agent, queued, allow_loopback):
    with RuntimeServer() as runtime:
        run = _handed_back(agent, runtime.url)

        outcome = deliver_restart_handoff(str(run.pk), 2, now=later(7))

    assert outcome == "sent"
    (delivery,) = runtime.deliveries
    assert delivery["key"] == f"restart:{run.pk}:2"
    assert delivery["body"]["attempt"] == 2
    assert delivery["body"]["run_key"] == "job-1"
    assert delivery["body"]["verdict"]["safe"] is True
    handoff = RestartHandoff.objects.get(run=run)
    assert (handoff.status, handoff.tries, handoff.failures) == ("sent", 1, 0)
    # The try and its answer are on the run page (its audit events).
    event = AuditEvent.objects.get(run=run, verb="handoff_try")
    assert event.note == "delivered" and event.data["status"] == 200
    assert event.data["reason"] == "HTTP 200"


@pytest.mark.django_db
def test_a_failed_try_backs_off_and_is_retried_by_the_sweep_when_due(agent, queued, allow_loopback):
    answers = iter([503, 200])
    with RuntimeServer(lambda d: next(answers)) as runtime:
        run = _handed_back(agent, runtime.url)

        assert deliver_restart_handoff(str(run.pk), 2, now=later(7)) == "pending"
        handoff = RestartHandoff.objects.get(run=run)
        assert handoff.failures == 1 and handoff.last_answer["status"] == 503
        assert handoff.last_answer["reason"] == "HTTP 503" and "body" not in handoff.last_answer
        # Not due yet: a duplicate message does nothing.
        assert deliver_restart_handoff(str(run.pk), 2, now=later(7)) == "not_due"
        queued.clear()
        assert dispatch_due_handoffs(handoff.due_at) == 0
        assert dispatch_due_handoffs(handoff.due_at + timedelta(seconds=1)) == 1
        assert queued == [(str(run.pk), 2)]

        assert deliver_restart_handoff(str(run.pk), 2, now=later(60)) == "sent"

    assert [d["key"] for d in runtime.deliveries] == [f"restart:{run.pk}:2"] * 2


@pytest.mark.django_db
def test_a_try_that_died_half_way_is_taken_over_after_its_lease(
    agent, queued, allow_loopback, settings
):
    settings.STARTSAFE = {**settings.STARTSAFE, "RESTART_HANDOFF_TIMEOUT": 2}
    with RuntimeServer() as runtime:
        run = _handed_back(agent, runtime.url)
        handoff = RestartHandoff.objects.get(run=run)
        # A worker claimed it, then died (SIGKILL) before any answer was recorded.
        RestartHandoff.objects.filter(pk=handoff.pk).update(
            status="sending", tries=1, due_at=later(7 + 9)
        )

        assert deliver_restart_handoff(str(run.pk), 2, now=later(10)) == "not_due"
        assert dispatch_due_handoffs(later(17)) == 1
        assert deliver_restart_handoff(str(run.pk), 2, now=later(17)) == "sent"

    handoff.refresh_from_db()
    assert (handoff.tries, handoff.failures) == (2, 1)
    notes = list(
        AuditEvent.objects.filter(run=run, verb="handoff_try")
        .order_by("id")
        .values_list("note", flat=True)
    )
    assert notes == ["no answer: the try stopped half-way", "delivered"]


@pytest.mark.django_db
def test_a_run_that_started_again_is_not_handed_off(agent, queued, allow_loopback):
    with RuntimeServer() as runtime:
        run = _handed_back(agent, runtime.url)
        start_run(agent, "job-1", now=later(7))  # the runtime restarted it by itself

        assert deliver_restart_handoff(str(run.pk), 2, now=later(8)) == "obsolete"

    assert runtime.deliveries == []
    assert RestartHandoff.objects.get(run=run).status == "obsolete"


@pytest.mark.django_db
def test_the_handoff_is_given_up_at_the_cap_and_a_person_is_told(
    agent, queued, allow_loopback, settings
):
    settings.STARTSAFE = {**settings.STARTSAFE, "RESTART_HANDOFF_MAX_TRIES": 2}
    with RuntimeServer(lambda d: 500) as runtime:
        run = _handed_back(agent, runtime.url)
        assert deliver_restart_handoff(str(run.pk), 2, now=later(7)) == "pending"
        assert deliver_restart_handoff(str(run.pk), 2, now=later(100)) == "given_up"
        assert deliver_restart_handoff(str(run.pk), 2, now=later(1000)) == "done"

    assert len(runtime.deliveries) == 2
    assert Notification.objects.filter(kind="needs_person", run=run).exists()


@pytest.mark.django_db
def test_an_unreachable_runtime_is_a_failed_try_with_a_fixed_reason(
    agent, queued, allow_loopback, caplog
):
    run = _handed_back(agent, "http://127.0.0.1:9/restart")

    assert deliver_restart_handoff(str(run.pk), 2, now=later(7)) == "pending"

    # Kept and shown: that no HTTP answer came, not how the connection failed.
    answer = RestartHandoff.objects.get(run=run).last_answer
    assert answer["reason"] == "no HTTP answer (could not connect or timed out)"
    assert "error" not in answer and "status" not in answer
    # The detail is in the server's log, for administrators.
    assert "ConnectError" in caplog.text


@pytest.mark.django_db
def test_an_operators_allow_restart_hands_a_given_up_run_back_again(agent, operator, queued):
    run = start_run(
        agent, "job-1", heartbeat_timeout=5, restart_url="http://runtime.test/r", now=T0
    ).run
    sweep(now=later(6))
    RestartHandoff.objects.filter(run=run).update(status="given_up")

    allow_restart(operator, run.pk, note="checked the mailbox", now=later(60))

    assert RestartHandoff.objects.get(run=run).status == "pending"


def test_backoff_doubles_and_is_capped():
    assert [backoff(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert backoff(30) == 300
