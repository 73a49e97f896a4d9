"""Celery tasks: thin wrappers over plain functions, safe to run twice."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings

from runs.handoff import deliver_restart_handoff as deliver_once
from runs.sweep import sweep as run_sweep

logger = logging.getLogger("startsafe.tasks")


@shared_task(acks_late=True)
def sweep() -> str:
    report = run_sweep()
    summary = report.summary()
    logger.info("sweep: %s", summary)
    return summary


@shared_task(bind=True, acks_late=True, max_retries=None)
def deliver_restart_handoff(self, run_id: str, attempt: int) -> None:
    """Deliver a hand-off, retrying with exponential back-off up to the configured cap."""
    try_number = self.request.retries + 1
    delivered = deliver_once(run_id, attempt, try_number)
    if delivered is False:
        if try_number >= settings.STARTSAFE["RESTART_HANDOFF_MAX_TRIES"]:
            logger.warning("giving up the hand-off of run %s after %s tries", run_id, try_number)
            return
        raise self.retry(countdown=min(2 ** (try_number - 1), 300))
