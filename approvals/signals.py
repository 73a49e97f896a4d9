"""One key=value log line for every audit event, i.e. for every state change."""

from __future__ import annotations

import logging

from django.db.models.signals import post_save
from django.dispatch import receiver

from runs.models import AuditEvent
from startsafe.logs import kv

logger = logging.getLogger("startsafe.events")


@receiver(post_save, sender=AuditEvent, dispatch_uid="startsafe_log_audit_event")
def log_audit_event(sender, instance: AuditEvent, created: bool, **kwargs) -> None:
    if not created or not logger.isEnabledFor(logging.INFO):
        return  # nothing to format: every write of the API's hot path sends this
    logger.info(
        kv(
            instance.verb,
            actor=instance.actor,
            run=instance.run_id,
            attempt=instance.attempt_number,
            effect=instance.effect_id,
            old=instance.old_status,
            new=instance.new_status,
            note=instance.note[:200],
        )
    )
