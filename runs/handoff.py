"""Handing a restart-ready run back to its runtime at its ``restart_url``.

The POST carries ``Idempotency-Key: restart:<run_id>:<n>`` (n, the attempt to start
next), so a runtime that gets it twice starts the run once; the run's own start
rules make a second start answer ``already_running``. Every try and its answer is
kept as an audit event (``handoff_try``) and shown on the run page.
"""

from __future__ import annotations

import logging

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from runs.audit import SYSTEM, record_event
from runs.models import Run, RunStatus
from runs.verdict import restart_verdict

logger = logging.getLogger("startsafe.handoff")


def schedule_restart_handoff(run: Run) -> None:
    """After the commit, queue the hand-off of a run that has a restart URL."""
    if not run.restart_url:
        return
    run_id, attempt = str(run.pk), run.current_attempt + 1

    def enqueue() -> None:
        from runs.tasks import deliver_restart_handoff

        deliver_restart_handoff.delay(run_id, attempt)

    transaction.on_commit(enqueue)


def handoff_payload(run: Run, attempt: int) -> dict:
    return {
        "run_id": str(run.pk),
        "run_key": run.run_key,
        "attempt": attempt,
        "verdict": restart_verdict(run).as_dict(),
    }


def deliver_restart_handoff(run_id: str, attempt: int, try_number: int = 1) -> bool | None:
    """POST the hand-off once. True: delivered (2xx). False: try again later.

    None: nothing to deliver any more (the run started, was abandoned, or the
    attempt number moved on), so a duplicate task does nothing.
    """
    run = Run.objects.filter(pk=run_id).first()
    if (
        run is None
        or not run.restart_url
        or not run.restart_ready
        or run.status not in (RunStatus.INTERRUPTED, RunStatus.FAILED)
        or run.current_attempt + 1 != attempt
    ):
        return None
    headers = {"Idempotency-Key": f"restart:{run.pk}:{attempt}"}
    answer: dict = {"try": try_number, "attempt": attempt, "url": run.restart_url}
    delivered = False
    try:
        response = httpx.post(
            run.restart_url,
            json=handoff_payload(run, attempt),
            headers=headers,
            timeout=settings.STARTSAFE.get("RESTART_HANDOFF_TIMEOUT", 10),
        )
        answer["status"] = response.status_code
        answer["body"] = response.text[:500]
        delivered = 200 <= response.status_code < 300
    except httpx.HTTPError as exc:
        answer["error"] = f"{type(exc).__name__}: {exc}"[:500]
    record_event(
        SYSTEM,
        "handoff_try",
        at=timezone.now(),
        run=run,
        attempt_number=attempt,
        old_status=run.status,
        new_status=run.status,
        note="delivered" if delivered else "not delivered",
        data=answer,
    )
    logger.info("restart hand-off of run %s attempt %s: %s", run.pk, attempt, answer)
    return delivered
