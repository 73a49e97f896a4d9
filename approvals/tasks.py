"""Celery tasks of the operators' side: thin wrappers over plain functions."""

from __future__ import annotations

from celery import shared_task

from approvals.notifications import notify as notify_operators
from approvals.slack import sync_slack


@shared_task(acks_late=True, ignore_result=True)
def notify() -> str:
    """Collect and send operators' notifications; the rows' claims make it safe twice."""
    report = notify_operators()
    return f"{report.sent} sent, {report.skipped} skipped"


@shared_task(acks_late=True, ignore_result=True)
def slack() -> str:
    """Post new Slack messages and update changed ones; the rows' claims make it safe twice."""
    report = sync_slack()
    return f"{report.posted} posted, {report.updated} updated, {report.failures} failed"
