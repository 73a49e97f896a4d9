"""Escalation: an effect still awaiting approval when its SLA passes goes to a second group.

product.md, "Operators where they are". The SLA is a share of the effect's deadline
window (``ESCALATION_SLA``): the window runs from when the effect started awaiting
(its deadline minus its ``approval_ttl``) to its deadline, so 0.5 escalates half way.
An effect escalates once: its ``Escalation`` row (the effect is its primary key) is
written under the effect's row lock, with an audit event ``escalated`` and the
outbox row of the escalation e-mail (to ``ESCALATE_EMAILS``, sent by the notify
task), all in one transaction. An effect decided, or expired, before its SLA passed
is never escalated: the status is read under the same lock the decisions take.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import DurationField, Exists, ExpressionWrapper, F, OuterRef, Value

from approvals.models import Escalation, Notification, NotificationKind
from approvals.slack import slack_enabled
from runs.audit import SYSTEM, record_event
from runs.lifecycle import is_past_deadline
from runs.models import Effect, EffectStatus

# The audit verb; integrations (the Slack escalation channel) look for it.
VERB = "escalated"
# Effects escalated per pass; the rest on the next (every NOTIFY_INTERVAL).
BATCH = 500


def _share() -> float:
    return settings.STARTSAFE["ESCALATION_SLA"]


def escalation_on() -> bool:
    """Whether anyone hears of escalations: the escalation e-mail addresses, or
    Slack's escalation channel with Slack on (approvals/slack.py posts there)."""
    conf = settings.STARTSAFE
    return bool(conf["ESCALATE_EMAILS"] or (slack_enabled() and conf["SLACK_ESCALATION_CHANNEL"]))


def escalation_due_at(effect: Effect) -> datetime | None:
    """When ``effect``'s SLA passes: ``ESCALATION_SLA`` of the way to its deadline."""
    if effect.approval_expires_at is None:
        return None
    remaining = timedelta(seconds=effect.approval_ttl * (1 - _share()))
    return effect.approval_expires_at - remaining


def escalate_due(now: datetime) -> int:
    """Escalate every awaiting effect whose SLA passed and that was not escalated yet;
    how many were escalated now. Safe to run twice, and from two workers at once."""
    if not escalation_on():
        return 0
    due = (
        Effect.objects.filter(status=EffectStatus.AWAITING_APPROVAL, approval_expires_at__gt=now)
        .filter(~Exists(Escalation.objects.filter(effect=OuterRef("pk"))))
        .order_by("approval_expires_at")
    )
    if connection.vendor == "postgresql":
        # deadline - ttl * (1 - share) <= now, in the database: the due effects only.
        # (SQLite cannot multiply a duration; the embedded default's few awaiting
        # effects are sifted below, as every candidate is.)
        remaining = ExpressionWrapper(
            F("approval_ttl") * Value(timedelta(seconds=1 - _share())),
            output_field=DurationField(),
        )
        due = due.filter(approval_expires_at__lte=Value(now) + remaining)
    candidates = due.only("pk", "approval_expires_at", "approval_ttl")[:BATCH]
    return sum(
        escalate(effect.pk, now) for effect in list(candidates) if escalation_due_at(effect) <= now
    )


def escalate(effect_id, now: datetime) -> bool:
    """Escalate one effect if it still awaits approval past its SLA and never was.

    Under the effect's lock, so a decision either came first (nothing to escalate)
    or waits; the ``Escalation`` row is the once.
    """
    with transaction.atomic():
        effect = (
            Effect.objects.select_for_update()
            .select_related("run")
            .filter(pk=effect_id, status=EffectStatus.AWAITING_APPROVAL)
            .first()
        )
        due_at = escalation_due_at(effect) if effect is not None else None
        if due_at is None or due_at > now or is_past_deadline(effect, now):
            return False
        escalation, created = Escalation.objects.get_or_create(
            effect=effect, defaults={"at": now, "due_at": due_at, "args_hash": effect.args_hash}
        )
        if not created:
            return False
        emails = settings.STARTSAFE.get("ESCALATE_EMAILS") or []
        record_event(
            SYSTEM,
            VERB,
            at=now,
            effect=effect,
            run=effect.run,
            old_status=effect.status,
            new_status=effect.status,
            note=f"Still awaiting approval {_share():.0%} of the way to its deadline.",
            data={
                "due_at": due_at.isoformat(),
                "deadline": effect.approval_expires_at.isoformat(),
                "args_hash": effect.args_hash,
                "emails": len(emails),
            },
        )
        Notification.objects.create(
            kind=NotificationKind.ESCALATED,
            dedupe_key=f"escalated:{effect.pk}",
            run=effect.run,
            effect=effect,
            line=f"Escalated: {effect.tool} still awaits approval, deadline "
            f"{effect.approval_expires_at:%Y-%m-%d %H:%M} UTC"
            + (f": {effect.preview[:120]}" if effect.preview else "")
            + f" (effect {effect.pk})",
            due_at=now,
            created_at=now,
        )
    return True
