"""/healthz checks the database and the broker; /metrics speaks Prometheus."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from approvals.models import RestartHandoff
from runs.calls import record_call
from runs.lifecycle import start_run
from runs.sweep import sweep


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch):
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda *a, **kw: None)


def _samples(text: str) -> dict:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@pytest.mark.django_db
def test_healthz_is_ok_when_the_database_and_the_broker_answer(client, monkeypatch):
    monkeypatch.setattr("startsafe.health.check_broker", lambda: "ok")

    response = client.get("/healthz")

    assert response.status_code == 200
    assert response.json()["database"] == "ok" and response.json()["broker"] == "ok"


@pytest.mark.django_db
def test_healthz_is_503_when_the_broker_is_down(client, settings):
    from startsafe.celery import app

    # A port nobody listens on; the check gives up after its short timeout.
    app.conf.broker_url = "redis://127.0.0.1:9/0"
    try:
        response = client.get("/healthz")
    finally:
        app.conf.broker_url = settings.CELERY_BROKER_URL

    assert response.status_code == 503
    body = response.json()
    assert body["database"] == "ok"
    assert body["broker"].startswith("error:")


@pytest.mark.django_db
def test_healthz_is_503_when_the_database_fails(client, monkeypatch):
    def broken():
        raise RuntimeError("connection refused")

    monkeypatch.setattr("startsafe.health.check_database", broken)
    monkeypatch.setattr("startsafe.health.check_broker", lambda: "ok")

    response = client.get("/healthz")

    assert response.status_code == 503
    assert "connection refused" in response.json()["database"]


@pytest.mark.django_db
def test_healthz_checks_the_real_broker_of_the_settings(client):
    # The embedded default (or whatever CELERY_BROKER_URL the suite runs with).
    response = client.get("/healthz")
    assert response.json()["broker"] == "ok", response.json()


@pytest.mark.django_db
def test_metrics_count_runs_and_effects_by_status_and_the_oldest_approval(client, agent):
    now = timezone.now()
    run = start_run(agent, "job", heartbeat_timeout=3600, now=now - timedelta(seconds=90)).run
    record_call(
        agent,
        run.pk,
        attempt=1,
        tool="refund",
        kind="effect",
        args={},
        key="r:1",
        key_source="intent",
        needs_approval=True,
        now=now - timedelta(seconds=90),
    )
    stale = start_run(agent, "stale", heartbeat_timeout=5, now=now - timedelta(seconds=60)).run
    sweep(now=now)
    RestartHandoff.objects.create(
        run=stale, attempt=2, due_at=now, created_at=now, updated_at=now, failures=3
    )

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = _samples(response.content.decode())
    assert samples[("startsafe_runs", (("status", "running"),))] == 1
    assert samples[("startsafe_runs", (("status", "interrupted"),))] == 1
    assert samples[("startsafe_effects", (("status", "awaiting_approval"),))] == 1
    assert samples[("startsafe_oldest_awaiting_approval_age_seconds", ())] >= 89
    assert samples[("startsafe_handoff_failures_total", ())] == 3
    assert ("startsafe_task_last_duration_seconds", (("task", "sweep"),)) in samples
    assert samples[("startsafe_task_runs_total", (("task", "sweep"),))] == 1
