"""Claiming an outbox's due rows: the operators' notifications (approvals/notifications.py)
and the Slack messages (approvals/slack.py) are sent the same way.

A sender claims up to ``batch`` due rows by compare-and-set (only rows still due and
unclaimed-or-lease-passed change), each with a lease of ``NOTIFY_LEASE`` seconds: a
sender that dies leaves its rows to come back when the lease passes, and two senders
never both get a row.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.conf import settings

from runs.models import ACTIVE_OUTBOX_STATUSES, OutboxStatus


def claim_due(model, now: datetime, *, batch: int, related: tuple[str, ...] = ()) -> list:
    """The rows of ``model`` due at ``now`` that this sender now holds, oldest due
    first (the models' partial index on ``due_at``), with ``related`` joined."""
    ids = list(
        model.objects.filter(status__in=ACTIVE_OUTBOX_STATUSES, due_at__lte=now)
        .order_by("due_at", "id")
        .values_list("pk", flat=True)[:batch]
    )
    if not ids:
        return []
    token = str(uuid.uuid4())
    model.objects.filter(pk__in=ids, status__in=ACTIVE_OUTBOX_STATUSES, due_at__lte=now).update(
        status=OutboxStatus.SENDING,
        claim=token,
        due_at=now + timedelta(seconds=settings.STARTSAFE["NOTIFY_LEASE"]),
    )
    return list(
        model.objects.filter(claim=token, status=OutboxStatus.SENDING)
        .select_related(*related)
        .order_by("id")
    )
