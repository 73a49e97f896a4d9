"""People's approvals of an effect's arguments.

An approval names the ``args_hash`` the operator was shown; only approvals of the
current version count, so a change of arguments silently stops older ones from
counting, and the unique constraint keeps one operator from approving one version
twice (the two-person rule counts distinct operators).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runs.models import Effect, Run


class Approval(models.Model):
    effect = models.ForeignKey(Effect, on_delete=models.CASCADE, related_name="approvals")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    args_hash = models.CharField(max_length=64)
    note = models.TextField(blank=True, default="")
    at = models.DateTimeField()

    class Meta:
        ordering = ["effect", "at"]
        permissions = [
            ("decide", "Can approve, reject, mark done, release, allow restart and abandon"),
            ("view_history", "Can see the restart history and the audit log"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["effect", "user", "args_hash"], name="one_approval_per_operator_per_version"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} approved {self.effect_id}"


# --- The background work's own rows ----------------------------------------------
#
# Outboxes written in the same transaction as the event they tell about, then sent
# by a periodic task that claims them with a compare-and-set update. A broker that
# loses a message (the filesystem transport after a crash, a worker killed with
# SIGKILL) loses nothing: the row is still due and the next sweep sends it.


class OutboxStatus(models.TextChoices):
    PENDING = "pending"
    # Claimed by one worker until ``due_at``; past it a crashed try is taken over.
    SENDING = "sending"
    SENT = "sent"
    # Nothing to send any more (the run started again, the effect was decided).
    OBSOLETE = "obsolete"
    # Every try failed up to the cap; kept with its last answer for operators.
    GIVEN_UP = "given_up"


ACTIVE_OUTBOX_STATUSES = (OutboxStatus.PENDING, OutboxStatus.SENDING)


class RestartHandoff(models.Model):
    """The hand-off of attempt ``attempt`` of a run to its runtime's ``restart_url``.

    One row per (run, attempt): delivering it twice is the same POST with the same
    ``Idempotency-Key``. Every try and its answer is also an audit event
    (``handoff_try``), which the run page shows.
    """

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="handoffs")
    attempt = models.PositiveIntegerField()
    status = models.CharField(
        max_length=10, choices=OutboxStatus.choices, default=OutboxStatus.PENDING
    )
    # Pending: when the next try may start (back-off). Sending: the claim's lease.
    due_at = models.DateTimeField()
    tries = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    last_answer = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "attempt"], name="handoff_unique_per_attempt"),
        ]
        indexes = [
            # The sweep's dispatch: active hand-offs whose time has come.
            models.Index(
                fields=["due_at"],
                name="handoff_due_idx",
                condition=models.Q(status__in=["pending", "sending"]),
            ),
        ]

    def __str__(self) -> str:
        return f"hand-off {self.run_id} #{self.attempt} {self.status}"


class NotificationKind(models.TextChoices):
    AWAITING_APPROVAL = "awaiting_approval"
    DEADLINE_NEAR = "deadline_near"
    NEEDS_PERSON = "needs_person"


class Notification(models.Model):
    """One thing operators should hear about; many are sent as one message per channel."""

    kind = models.CharField(max_length=20, choices=NotificationKind.choices)
    # Makes writing the same news twice a no-op ("awaiting_approval:<audit id>",
    # "deadline_near:<effect>:<deadline>", "needs_person:<run>:<attempt>").
    dedupe_key = models.CharField(max_length=200, unique=True)
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    effect = models.ForeignKey(
        Effect, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    line = models.TextField()
    status = models.CharField(
        max_length=10, choices=OutboxStatus.choices, default=OutboxStatus.PENDING
    )
    due_at = models.DateTimeField()
    tries = models.PositiveIntegerField(default=0)
    claim = models.CharField(max_length=36, blank=True, default="")
    # Each channel is done once, so a failing webhook does not resend the e-mail.
    email_done_at = models.DateTimeField(null=True, blank=True)
    webhook_done_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(
                fields=["due_at"],
                name="notification_due_idx",
                condition=models.Q(status__in=["pending", "sending"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.status}: {self.line}"


class TaskState(models.Model):
    """The last run of a periodic task, shared by every process (``/metrics``, ``/healthz``)."""

    name = models.CharField(max_length=50, primary_key=True)
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_duration = models.FloatField(default=0.0)
    last_error = models.TextField(blank=True, default="")
    runs_total = models.PositiveBigIntegerField(default=0)
    errors_total = models.PositiveBigIntegerField(default=0)
    # Counters a task keeps for the metrics (e.g. webhook failures).
    counters = models.JSONField(default=dict, blank=True)

    def __str__(self) -> str:
        return self.name


def record_task_run(name: str, started_at, duration: float, *, error: str = "", **counts) -> None:
    """Add one run of a periodic task to its shared state (a single-row upsert)."""
    from django.db import transaction

    with transaction.atomic():
        state, _ = TaskState.objects.select_for_update().get_or_create(name=name)
        state.last_started_at = started_at
        state.last_duration = duration
        state.runs_total += 1
        if error:
            state.errors_total += 1
            state.last_error = error[:2000]
        for key, value in counts.items():
            if value:
                state.counters[key] = state.counters.get(key, 0) + value
        state.save()


# Structured logs of every state change: the audit row is the one place all of them
# pass through (runs/audit.py), so one receiver logs them all as key=value lines.
from approvals import signals  # noqa: E402, F401
