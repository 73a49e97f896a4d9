"""/healthz checks the database and the broker; /metrics speaks Prometheus."""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from runs.calls import record_call
from runs.lifecycle import start_run
from runs.models import RestartHandoff
from runs.sweep import sweep
from startsafe.settings import _metrics_token


@pytest.fixture(autouse=True)
def _no_broker(monkeypatch):
    monkeypatch.setattr("runs.handoff.enqueue_handoff", lambda *a, **kw: None)


@pytest.fixture
def metrics_token(settings) -> str:
    """STARTSAFE_METRICS_TOKEN, as production sets it."""
    token = secrets.token_urlsafe(32)
    settings.STARTSAFE = {**settings.STARTSAFE, "METRICS_TOKEN": token}
    return token


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

    # A port nobody listens on; the check gives up after its short timeout. The
    # embedded default names its transport class too (startsafe/broker.py), which
    # would win over the URL's scheme: Redis's, as a Redis deployment has it.
    app.conf.broker_url = "redis://127.0.0.1:9/0"
    transport, app.conf.broker_transport = app.conf.broker_transport, None
    try:
        response = client.get("/healthz")
    finally:
        app.conf.broker_url = settings.CELERY_BROKER_URL
        app.conf.broker_transport = transport

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
def test_metrics_count_runs_and_effects_by_status_and_the_oldest_approval(
    client, agent, metrics_token
):
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

    response = client.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})

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


# --- Who may read /metrics (issue 15, item 7) -------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer ", "Basic abc"])
def test_metrics_refuse_a_scraper_without_the_token(client, metrics_token, header):
    headers = {"Authorization": header} if header else {}
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"startsafe_runs" not in response.content


@pytest.mark.django_db
def test_a_console_session_is_not_a_metrics_token(client, metrics_token, admin_user):
    client.force_login(admin_user)
    assert client.get("/metrics").status_code == 401


@pytest.mark.django_db
def test_without_a_token_metrics_are_off_in_production_and_say_how_to_turn_them_on(
    client, settings
):
    settings.DEBUG = False
    settings.STARTSAFE = {**settings.STARTSAFE, "METRICS_TOKEN": ""}
    response = client.get("/metrics", headers={"Authorization": "Bearer anything"})
    assert response.status_code == 403
    assert b"set STARTSAFE_METRICS_TOKEN" in response.content
    assert b"startsafe_runs" not in response.content


@pytest.mark.django_db
def test_without_a_token_a_development_server_shows_its_metrics(client, settings):
    settings.DEBUG = True
    settings.STARTSAFE = {**settings.STARTSAFE, "METRICS_TOKEN": ""}
    response = client.get("/metrics")
    assert response.status_code == 200 and b"startsafe_runs" in response.content


@pytest.mark.parametrize("token", ["short", "x" * 31, "a" * 20 + " " + "b" * 20])
def test_a_guessable_metrics_token_stops_the_start(monkeypatch, token):
    monkeypatch.setenv("STARTSAFE_METRICS_TOKEN", token)
    with pytest.raises(ImproperlyConfigured, match="STARTSAFE_METRICS_TOKEN"):
        _metrics_token()
