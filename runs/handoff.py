"""Handing a restart-ready run back to its runtime at its ``restart_url``.

The POST carries ``Idempotency-Key: restart:<run_id>:<n>`` (n, the attempt to start
next), so a runtime that gets it twice starts the run once; the run's own start
rules make a second start answer ``already_running``. Every try and its answer (a
status code or a short reason, never the runtime's reply: startsafe/outbound.py,
which also refuses addresses that are not public) is kept as an audit event
(``handoff_try``) and shown on the run page.

The hand-off is an outbox row (``runs.models.RestartHandoff``) written in the
transaction that made the run ready. A worker claims it with a compare-and-set
update and a lease; a try that dies half-way (SIGKILL, a lost broker message) is
taken over by the sweep once the lease has passed, so the hand-off always arrives.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from runs.audit import SYSTEM, record_event
from runs.models import (
    ACTIVE_OUTBOX_STATUSES,
    STOPPED_RUN_STATUSES,
    OutboxStatus,
    RestartHandoff,
    Run,
)
from runs.signals import runs_need_person
from runs.verdict import restart_verdict
from startsafe import outbound
from startsafe.logs import kv

logger = logging.getLogger("startsafe.handoff")

# The longest wait between two tries, whatever the back-off says.
MAX_BACKOFF = 300


def handoff_key(run_id, attempt: int) -> str:
    return f"restart:{run_id}:{attempt}"


def backoff(tries: int) -> float:
    """Seconds before try ``tries + 1``: 1, 2, 4, ... capped at five minutes."""
    return float(min(2 ** max(tries - 1, 0), MAX_BACKOFF))


def lease_seconds() -> float:
    # httpx's timeout is per phase (connect, write, read), so one try can take
    # more than the timeout; the lease covers two phases plus slack.
    return 2 * settings.STARTSAFE["RESTART_HANDOFF_TIMEOUT"] + 5


def schedule_restart_handoff(run: Run, now: datetime | None = None) -> RestartHandoff | None:
    """In the caller's transaction, write the hand-off row; after the commit, queue it.

    The row is what makes the hand-off happen; the task queued on commit only makes
    it happen at once instead of at the next sweep.
    """
    if not run.restart_url:
        return None
    now = now or timezone.now()
    attempt = run.current_attempt + 1
    handoff, created = RestartHandoff.objects.get_or_create(
        run=run,
        attempt=attempt,
        defaults={"due_at": now, "created_at": now, "updated_at": now},
    )
    if not created and handoff.status not in ACTIVE_OUTBOX_STATUSES:
        # Only an operator's "allow restart" finds a row already there (the sweep
        # hands back each attempt once): their decision is worth another delivery,
        # under the same Idempotency-Key.
        RestartHandoff.objects.filter(pk=handoff.pk, status=handoff.status).update(
            status=OutboxStatus.PENDING, due_at=now, updated_at=now
        )
    run_id = str(run.pk)
    transaction.on_commit(lambda: enqueue_handoff(run_id, attempt))
    return handoff


def enqueue_handoff(run_id: str, attempt: int, *, expires: float | None = None) -> None:
    from runs.tasks import deliver_restart_handoff

    try:
        deliver_restart_handoff.apply_async((run_id, attempt), expires=expires)
    except Exception:
        # The broker is down: the row is still due, so the next sweep sends it.
        logger.exception(kv("handoff_enqueue_failed", run=run_id, attempt=attempt))


def handoff_payload(run: Run, attempt: int) -> dict:
    return {
        "run_id": str(run.pk),
        "run_key": run.run_key,
        "attempt": attempt,
        "verdict": restart_verdict(run).as_dict(),
    }


def still_wanted(run: Run | None, attempt: int) -> bool:
    """The run still waits for this hand-off: not started again, not abandoned."""
    return (
        run is not None
        and bool(run.restart_url)
        and run.restart_ready
        and run.status in STOPPED_RUN_STATUSES
        and run.current_attempt + 1 == attempt
    )


def claim_handoff(handoff: RestartHandoff, now: datetime) -> bool:
    """Compare-and-set: take the row if nobody else took it since we read it."""
    claimed = RestartHandoff.objects.filter(
        pk=handoff.pk,
        status=handoff.status,
        tries=handoff.tries,
        due_at__lte=now,
    ).update(
        status=OutboxStatus.SENDING,
        due_at=now + timedelta(seconds=lease_seconds()),
        tries=F("tries") + 1,
        updated_at=now,
    )
    return claimed == 1


def deliver_restart_handoff(run_id, attempt: int, now: datetime | None = None) -> str:
    """Try the hand-off of ``attempt`` once; safe to call twice or concurrently.

    1. Nothing to do unless the row is active and due (another worker has it, or it
       was delivered): ``"not_due"`` / ``"done"``.
    2. A run that started again (or was abandoned) is not handed off: ``"obsolete"``.
    3. Claim the row (compare-and-set, with a lease). A row found ``sending`` past
       its lease is a try that died half-way; it is recorded as such.
    4. POST; record the answer as an audit event; settle the row: ``delivered``,
       back to ``pending`` with back-off, or ``given_up`` past the cap.
    """
    real_clock = now is None
    now = now or timezone.now()
    handoff = RestartHandoff.objects.filter(run_id=run_id, attempt=attempt).first()
    if handoff is None or handoff.status not in ACTIVE_OUTBOX_STATUSES:
        return "done"
    if handoff.due_at > now:
        return "not_due"
    run = Run.objects.filter(pk=run_id).first()
    if not still_wanted(run, attempt):
        RestartHandoff.objects.filter(pk=handoff.pk, status__in=ACTIVE_OUTBOX_STATUSES).update(
            status=OutboxStatus.OBSOLETE, updated_at=now
        )
        logger.info(kv("handoff_obsolete", run=run_id, attempt=attempt))
        return "obsolete"
    crashed = handoff.status == OutboxStatus.SENDING
    if not claim_handoff(handoff, now):
        return "not_due"
    try_number = handoff.tries + 1
    if crashed:
        # The previous try's worker stopped before it recorded an answer.
        record_event(
            SYSTEM,
            "handoff_try",
            at=now,
            run=run,
            attempt_number=attempt,
            old_status=run.status,
            new_status=run.status,
            note="no answer: the try stopped half-way",
            data={"try": handoff.tries, "attempt": attempt, "reason": "worker stopped"},
        )
        RestartHandoff.objects.filter(pk=handoff.pk).update(failures=F("failures") + 1)

    answer = post_handoff(run, attempt, try_number)
    delivered = answer.get("delivered", False)
    # The POST took time; a caller that moved the clock keeps its own.
    done_at = timezone.now() if real_clock else now
    max_tries = settings.STARTSAFE["RESTART_HANDOFF_MAX_TRIES"]
    if delivered:
        status, due_at = OutboxStatus.SENT, done_at
    elif try_number >= max_tries or answer.get("refused"):
        # A refused address is refused again on every try: a person must act (allow
        # it, or start the run by hand), so they are told now, not after the back-off.
        status, due_at = OutboxStatus.GIVEN_UP, done_at
    else:
        status, due_at = OutboxStatus.PENDING, done_at + timedelta(seconds=backoff(try_number))
    with transaction.atomic():
        record_event(
            SYSTEM,
            "handoff_try",
            at=done_at,
            run=run,
            attempt_number=attempt,
            old_status=run.status,
            new_status=run.status,
            note="delivered" if delivered else "not delivered",
            data=answer,
        )
        # Only the claim we hold is settled; a try that outlived its lease lost it.
        RestartHandoff.objects.filter(
            pk=handoff.pk, status=OutboxStatus.SENDING, tries=try_number
        ).update(
            status=status,
            due_at=due_at,
            last_answer=answer,
            failures=F("failures") + (0 if delivered else 1),
            updated_at=done_at,
        )
        if status == OutboxStatus.GIVEN_UP:
            why = (
                "its restart_url names an address startsafe does not send to"
                if answer.get("refused")
                else f"restart hand-off given up after {try_number} tries"
            )
            runs_need_person.send(Run, runs=[(run, why)], now=done_at)
    logger.log(
        logging.INFO if delivered else logging.WARNING,
        kv(
            "handoff_try",
            run=run_id,
            attempt=attempt,
            try_number=try_number,
            outcome=status,
            http_status=answer.get("status"),
            reason=answer["reason"],
        ),
    )
    return status


def post_handoff(run: Run, attempt: int, try_number: int) -> dict:
    """One POST to the runtime; the answer as it is stored and shown to any viewer.

    The status code and a reason from ``startsafe.outbound``'s fixed vocabulary, never
    the runtime's body or how a connection failed: the run page must not map the
    network behind a URL an agent chose. The detail is in the server's log.
    """
    outcome = outbound.post_json(
        run.restart_url,
        handoff_payload(run, attempt),
        headers={"Idempotency-Key": handoff_key(run.pk, attempt)},
        timeout=settings.STARTSAFE["RESTART_HANDOFF_TIMEOUT"],
        purpose=handoff_key(run.pk, attempt),
    )
    answer: dict = {"try": try_number, "attempt": attempt, "url": run.restart_url}
    if outcome.status is not None:
        answer["status"] = outcome.status
    answer["reason"] = outcome.reason
    answer["delivered"] = outcome.delivered
    if outcome.refused:
        answer["refused"] = True
    return answer


def dispatch_due_handoffs(now: datetime, limit: int = 500) -> int:
    """Queue every hand-off whose time has come: back-off over, or a lease passed.

    The queued task expires after a sweep interval, so a worker that was down for
    an hour finds one copy to run, not seven hundred.
    """
    # Strictly before ``now``: a row this very sweep wrote was queued on its commit.
    due = RestartHandoff.objects.filter(status__in=ACTIVE_OUTBOX_STATUSES, due_at__lt=now).order_by(
        "due_at"
    )
    rows = list(due.values_list("run_id", "attempt")[:limit])
    expires = max(settings.STARTSAFE["SWEEP_INTERVAL"] * 2, 10)
    for run_id, attempt in rows:
        enqueue_handoff(str(run_id), attempt, expires=expires)
    return len(rows)
