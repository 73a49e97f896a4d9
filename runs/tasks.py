"""Celery tasks: thin wrappers over plain functions, safe to run twice.

``acks_late`` (also the default in settings): a message is acknowledged after the
task ran, so a worker that dies mid-task leaves it to be delivered again. The
plain functions do not rely on that: their rows (the hand-off outbox, the runs'
``stale_at``) are found again by the next sweep whatever the broker kept.
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.conf import settings

from runs.api.idempotency import prune_idempotent_requests
from runs.handoff import deliver_restart_handoff as deliver_once
from runs.prune import prune_finished_runs
from runs.sweep import sweep as run_sweep


@shared_task(acks_late=True, ignore_result=True)
def sweep() -> str:
    """One sweep; it logs its own key=value summary."""
    return run_sweep().summary()


@shared_task(acks_late=True, ignore_result=True)
def deliver_restart_handoff(run_id: str, attempt: int) -> str:
    """One try of a hand-off. A failed try is not retried here: the row's back-off
    makes it due again and the sweep queues it, so retries survive a lost message."""
    return deliver_once(run_id, attempt)


@shared_task(acks_late=True, ignore_result=True)
def prune() -> str:
    """Retention on the schedule: ``manage.py prune --older-than`` with the setting's
    days (``STARTSAFE_PRUNE_OLDER_THAN_DAYS``); runs twice, prunes once."""
    days = settings.STARTSAFE["PRUNE_OLDER_THAN_DAYS"]
    if days is None:
        return "retention is off (STARTSAFE_PRUNE_OLDER_THAN_DAYS is not set)"
    return "; ".join(prune_finished_runs(timedelta(days=days)).lines())


@shared_task(acks_late=True, ignore_result=True)
def prune_idempotency_answers() -> str:
    """Forget the ``Idempotency-Key`` answers older than 24 hours (api.md keeps them
    at least that long), in batches; on the schedule every hour, so none lives
    much past its day."""
    return f"{prune_idempotent_requests()} idempotency answer(s) older than 24 h deleted"
