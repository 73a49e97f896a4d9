"""People's approvals of an effect's arguments.

An approval names the ``args_hash`` the operator was shown; only approvals of the
current version count, so a change of arguments silently stops older ones from
counting, and the unique constraint keeps one operator from approving one version
twice (the two-person rule counts distinct operators).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from runs.models import Effect, OutboxStatus, Run


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


# --- Operators' notifications ----------------------------------------------------
#
# An outbox (runs/models.py says how outboxes work), written in the transaction of
# the news or collected from the audit log, sent by the periodic ``notify`` task.


class NotificationKind(models.TextChoices):
    AWAITING_APPROVAL = "awaiting_approval"
    DEADLINE_NEAR = "deadline_near"
    NEEDS_PERSON = "needs_person"
    # Sent to the escalation group (STARTSAFE_ESCALATE_EMAILS), not to the operators.
    ESCALATED = "escalated"


class Notification(models.Model):
    """One thing operators should hear about; many are sent as one message per channel."""

    kind = models.CharField(max_length=20, choices=NotificationKind.choices)
    # Makes writing the same news twice a no-op ("awaiting_approval:<audit id>",
    # "deadline_near:<effect>:<deadline>", "needs_person:<run>:<attempt>",
    # "escalated:<effect>").
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


class NotificationEmail(models.Model):
    """A notification's e-mail went to this address (approvals/notifications.py).

    Written right after that address's message was taken, so a retry after a failure
    part-way (the SMTP server dropped after 3 of 5 messages) sends only to the
    addresses still missing: nobody gets the same news twice.
    """

    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="+")
    address = models.CharField(max_length=254)
    sent_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["notification", "address"], name="one_email_per_notification_and_address"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.notification_id} e-mailed to {self.address}"


# --- Operators where they are: signed e-mail links, escalation ---------------------


class EmailLinkUse(models.Model):
    """A signed e-mail link that decided (approvals/links.py).

    Written in the transaction of the decision it made; the unique ``nonce`` is what
    makes a link single use: a second use, even one racing the first, meets this row
    (its INSERT waits for the first transaction and then fails) and is refused.
    """

    nonce = models.CharField(max_length=64, unique=True)
    effect = models.ForeignKey(Effect, on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    action = models.CharField(max_length=20)
    used_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.user} {self.action} {self.effect_id} by e-mail link"


class Escalation(models.Model):
    """An effect still awaiting approval when its SLA passed (approvals/escalation.py).

    One row per effect at most (the primary key is the effect): escalating twice,
    from two workers at once, is one INSERT that wins and one that finds the row.
    """

    effect = models.OneToOneField(
        Effect, on_delete=models.CASCADE, primary_key=True, related_name="escalation"
    )
    at = models.DateTimeField()
    # The point of the deadline window it was due at, and the version then awaiting.
    due_at = models.DateTimeField()
    args_hash = models.CharField(max_length=64)

    def __str__(self) -> str:
        return f"{self.effect_id} escalated at {self.at:%Y-%m-%d %H:%M:%S}"


# --- Slack (docs/slack.md) --------------------------------------------------------
#
# An outbox too: a row per effect and purpose, posted once by the periodic ``slack``
# task (approvals/slack.py), then updated in place whenever the effect changes.


class SlackPurpose(models.TextChoices):
    # The effect awaits approval: STARTSAFE_SLACK_CHANNEL.
    APPROVAL = "approval"
    # Its SLA passed undecided: STARTSAFE_SLACK_ESCALATION_CHANNEL.
    ESCALATION = "escalation"


class SlackMessage(models.Model):
    """One effect's message in one channel: posted once, then only ever updated."""

    effect = models.ForeignKey(Effect, on_delete=models.CASCADE, related_name="+")
    purpose = models.CharField(max_length=10, choices=SlackPurpose.choices)
    # The configured channel until posted; then the channel id Slack answered with,
    # which chat.update needs (it takes no channel name).
    channel = models.CharField(max_length=80)
    # Slack's id of the message; empty until it is posted.
    ts = models.CharField(max_length=40, blank=True, default="")
    # The effect's revision the message shows: behind the effect's, it needs an update.
    shown_revision = models.PositiveIntegerField(default=0)
    status = models.CharField(
        max_length=10, choices=OutboxStatus.choices, default=OutboxStatus.PENDING
    )
    due_at = models.DateTimeField()
    tries = models.PositiveIntegerField(default=0)
    claim = models.CharField(max_length=36, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    # When its last chat.postMessage was tried, saved before the call: a row without
    # ts may then be in Slack already (the answer lost, the worker gone), so it is
    # looked up in the channel's history around that time before it is posted again.
    # Cleared when the row goes obsolete (approvals/slack.py, _deliver).
    post_tried_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            # Never posted twice: a second collect, a second worker, a re-awaiting
            # effect all find this row and update its message instead.
            models.UniqueConstraint(
                fields=["effect", "purpose"], name="one_slack_message_per_effect_and_purpose"
            ),
        ]
        indexes = [
            # The sender's claim: due rows, oldest first.
            models.Index(
                fields=["due_at"],
                name="slack_message_due_idx",
                condition=models.Q(status__in=["pending", "sending"]),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.purpose} message of {self.effect_id} ({self.status})"


class SlackUserMapping(models.Model):
    """An admin's word that a Slack member is this console user; it wins over e-mail."""

    slack_user_id = models.CharField(
        max_length=32,
        unique=True,
        help_text="The Slack member ID (U…): in Slack, the person's profile, ⋮, Copy member ID.",
    )
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")

    class Meta:
        ordering = ["slack_user_id"]
        verbose_name = "Slack user mapping"

    def __str__(self) -> str:
        return f"{self.slack_user_id} → {self.user}"


class OidcIdentity(models.Model):
    """Which console user an OpenID Connect provider's account is (startsafe/oidc.py).

    By the issuer and its ``sub``, the one claim the provider promises never to
    reassign; never by e-mail or username, which a provider's user may choose or be
    given later, so an account there can never take over a local one here."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="oidc_identity"
    )
    issuer = models.CharField(max_length=255)
    subject = models.CharField(max_length=255)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["issuer", "subject"], name="oidc_identity_unique")
        ]

    def __str__(self) -> str:
        return f"{self.subject} at {self.issuer}"
