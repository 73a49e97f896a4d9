"""Idempotency-Key answers are forgotten after 24 hours, on the beat schedule, in batches.

api.md: "Answers are kept at least 24 hours". Every keyed POST adds a row; the
schedule (startsafe/settings.py) runs runs.tasks.prune_idempotency_answers every hour.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs import tasks
from runs.api import idempotency
from runs.models import IdempotentRequest

pytestmark = pytest.mark.django_db


def _answers(agent, prefix: str, n: int, age: timedelta) -> None:
    at = timezone.now() - age
    IdempotentRequest.objects.bulk_create(
        IdempotentRequest(
            agent=agent,
            key=f"{prefix}-{i}",
            method="POST",
            path="/api/v1/runs",
            request_hash="0" * 64,
            response_status=201,
            response_body=b"{}",
            created_at=at,
            completed_at=at,
            locked_until=at,
        )
        for i in range(n)
    )


def test_the_beat_schedule_runs_the_prune_of_idempotency_answers_every_hour():
    from startsafe.celery import app

    entry = app.conf.beat_schedule["prune-idempotency-answers"]
    assert entry["task"] == "runs.tasks.prune_idempotency_answers"
    assert entry["task"] in app.tasks  # the name the worker knows
    assert entry["schedule"] <= 3_600


def test_the_task_deletes_answers_older_than_a_day_in_batches(agent, monkeypatch):
    _answers(agent, "old", 5, timedelta(hours=25))
    _answers(agent, "fresh", 2, timedelta(hours=23))
    monkeypatch.setattr(idempotency, "PRUNE_BATCH", 2)

    with CaptureQueriesContext(connection) as queries:
        summary = tasks.prune_idempotency_answers()

    assert summary.startswith("5 idempotency answer(s)")
    kept = IdempotentRequest.objects.values_list("key", flat=True)
    assert sorted(kept) == ["fresh-0", "fresh-1"]
    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3  # 2 + 2 + 1 rows


def test_nothing_to_prune_is_one_query(agent):
    _answers(agent, "fresh", 3, timedelta(hours=1))

    with CaptureQueriesContext(connection) as queries:
        assert idempotency.prune_idempotent_requests() == 0

    assert len(queries) == 1
    assert IdempotentRequest.objects.count() == 3
