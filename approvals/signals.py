"""The approvals app's receivers, connected in ``ApprovalsConfig.ready``."""

from __future__ import annotations

import logging

from approvals.notifications import notify_needs_person_many
from runs.models import AuditEvent
from startsafe.logs import kv

logger = logging.getLogger("startsafe.events")


def log_audit_event(sender, instance: AuditEvent, created: bool, **kwargs) -> None:
    """One key=value log line for every audit event, i.e. for every state change."""
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


def tell_operators_runs_need_person(sender, runs: list, now, **kwargs) -> None:
    """``runs.signals.runs_need_person``: a notification row per run, in the sweep's
    transaction, so operators hear of it exactly when it is true."""
    notify_needs_person_many(runs, now)
