"""``/healthz`` (is this process able to work?) and ``/metrics`` (Prometheus text).

The metrics are read from the database at scrape time, not counted in memory: the
web server, the worker and beat are separate processes, and the numbers operators
care about (what waits, what failed) live in the rows every process shares.
"""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.db import connection
from django.db.models import Count, Min, Sum
from django.http import HttpResponse, JsonResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from runs.api.auth import bearer_token
from startsafe.logs import kv

logger = logging.getLogger("startsafe.health")


def check_database() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return "ok"


def check_broker() -> str:
    """Connect to the broker with a short timeout and no retries."""
    from startsafe.celery import app

    timeout = settings.STARTSAFE["HEALTH_BROKER_TIMEOUT"]
    with app.connection_for_write(connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout)
    return "ok"


def healthz(request):
    """200 when the database and the broker answer, else 503 naming what failed."""
    checks: dict[str, str] = {}
    healthy = True
    for name, check in (("database", check_database), ("broker", check_broker)):
        try:
            checks[name] = check()
        except Exception as exc:
            healthy = False
            checks[name] = f"error: {type(exc).__name__}: {exc}"[:300]
            logger.warning(kv("healthz_failed", check=name, error=type(exc).__name__))
    if checks.get("database") == "ok":
        # Informational: a sweep that stopped running is visible here and in metrics,
        # but does not fail the web server's health check (beat may be restarting).
        from runs.models import TaskState

        state = TaskState.objects.filter(name="sweep").first()
        if state is not None and state.last_started_at is not None:
            age = (timezone.now() - state.last_started_at).total_seconds()
            checks["last_sweep_seconds_ago"] = f"{age:.1f}"
    return JsonResponse(
        {"status": "ok" if healthy else "error", **checks}, status=200 if healthy else 503
    )


class StartsafeCollector:
    """Reads the gauges and counters from the database at each scrape."""

    def collect(self):
        from runs.models import (
            Effect,
            EffectStatus,
            OutboxStatus,
            RestartHandoff,
            Run,
            RunStatus,
            TaskState,
        )

        now = timezone.now()
        runs = GaugeMetricFamily("startsafe_runs", "Runs by status.", labels=["status"])
        by_status = dict(Run.objects.values_list("status").annotate(n=Count("pk")))
        for status in RunStatus.values:
            runs.add_metric([status], by_status.get(status, 0))
        yield runs

        effects = GaugeMetricFamily("startsafe_effects", "Effects by status.", labels=["status"])
        by_status = dict(Effect.objects.values_list("status").annotate(n=Count("pk")))
        for status in EffectStatus.values:
            effects.add_metric([status], by_status.get(status, 0))
        yield effects

        oldest = Effect.objects.filter(status=EffectStatus.AWAITING_APPROVAL).aggregate(
            m=Min("updated_at")
        )["m"]
        yield GaugeMetricFamily(
            "startsafe_oldest_awaiting_approval_age_seconds",
            "Age of the oldest effect awaiting approval (0 when none waits).",
            value=max((now - oldest).total_seconds(), 0.0) if oldest else 0.0,
        )

        ready = Run.objects.filter(restart_ready=True, status__in=["interrupted", "failed"])
        yield GaugeMetricFamily(
            "startsafe_runs_restart_ready",
            "Runs handed back, not yet started.",
            value=ready.count(),
        )

        handoffs = RestartHandoff.objects.aggregate(f=Sum("failures"))
        yield CounterMetricFamily(
            "startsafe_handoff_failures",
            "Restart hand-off tries that did not get a 2xx (or died half-way).",
            value=handoffs["f"] or 0,
        )
        pending = RestartHandoff.objects.filter(
            status__in=[OutboxStatus.PENDING, OutboxStatus.SENDING]
        ).count()
        yield GaugeMetricFamily(
            "startsafe_handoffs_pending", "Restart hand-offs not yet delivered.", value=pending
        )
        given_up = RestartHandoff.objects.filter(status=OutboxStatus.GIVEN_UP).count()
        yield GaugeMetricFamily(
            "startsafe_handoffs_given_up", "Restart hand-offs given up.", value=given_up
        )

        states = {s.name: s for s in TaskState.objects.all()}
        duration = GaugeMetricFamily(
            "startsafe_task_last_duration_seconds",
            "Duration of the last run of a periodic task (sweep, notify).",
            labels=["task"],
        )
        age = GaugeMetricFamily(
            "startsafe_task_last_run_age_seconds",
            "Seconds since a periodic task last ran.",
            labels=["task"],
        )
        runs_total = CounterMetricFamily(
            "startsafe_task_runs", "Runs of a periodic task.", labels=["task"]
        )
        errors_total = CounterMetricFamily(
            "startsafe_task_errors", "Runs of a periodic task with an error.", labels=["task"]
        )
        for name, state in sorted(states.items()):
            duration.add_metric([name], state.last_duration)
            if state.last_started_at is not None:
                age.add_metric([name], (now - state.last_started_at).total_seconds())
            runs_total.add_metric([name], state.runs_total)
            errors_total.add_metric([name], state.errors_total)
        yield duration
        yield age
        yield runs_total
        yield errors_total

        notify = states.get("notify")
        counters = notify.counters if notify is not None else {}
        for key, help_text in (
            ("webhook_failures", "Notification webhook POSTs that failed."),
            ("email_failures", "Notification e-mails that failed."),
            ("emails", "Notification e-mails sent."),
            ("webhooks", "Notification webhook POSTs delivered."),
        ):
            yield CounterMetricFamily(
                f"startsafe_notification_{key}", help_text, value=counters.get(key, 0)
            )


def metrics(request):
    """The Prometheus text, for a scraper that sends ``STARTSAFE_METRICS_TOKEN`` as a
    bearer token; without a token set, for a development server (``DEBUG``) only."""
    expected = settings.STARTSAFE["METRICS_TOKEN"]
    if not expected and not settings.DEBUG:
        return HttpResponse(
            "/metrics is off: set STARTSAFE_METRICS_TOKEN and scrape with the header "
            "'Authorization: Bearer <that token>' (README, \"Metrics\").\n",
            status=403,
            content_type="text/plain; charset=utf-8",
        )
    if expected and not hmac.compare_digest(
        (bearer_token(request) or "").encode(), expected.encode()
    ):
        response = HttpResponse(
            "/metrics needs 'Authorization: Bearer <STARTSAFE_METRICS_TOKEN>'.\n",
            status=401,
            content_type="text/plain; charset=utf-8",
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry()
    registry.register(StartsafeCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def sweep_is_recent(max_age: float) -> bool:
    """For beat's container health check: a sweep ran in the last ``max_age`` seconds."""
    from runs.models import TaskState

    state = TaskState.objects.filter(name="sweep").first()
    if state is None or state.last_started_at is None:
        return False
    return (timezone.now() - state.last_started_at).total_seconds() < max_age
