"""Telling operators what waits for them: e-mail, and optionally a JSON webhook.

News is written as ``Notification`` rows (an outbox) in the transaction of the
event, or collected from the audit log by the periodic task; the same task sends
every pending row as ONE message per recipient and channel, so a burst of 500
effects awaiting approval is one e-mail to each operator and one webhook POST, not
500. Each e-mail names every effect it lists (preview, tool, run, deadline) with a
signed link per action its recipient may take (approvals/links.py): one message per
recipient, because each link is bound to its recipient. Escalations
(approvals/escalation.py) go to the escalation group instead of the operators.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import EmailMessage, get_connection
from django.db.models import Exists, OuterRef, Q
from django.urls import reverse
from django.utils import timezone

from approvals.decisions import can_decide
from approvals.links import LABELS, actions_for, link_path, make_token
from approvals.models import Notification, NotificationEmail, NotificationKind
from approvals.outbox import claim_due
from runs.models import (
    AuditEvent,
    Effect,
    EffectStatus,
    OutboxStatus,
    Run,
    record_task_run,
)
from startsafe import outbound
from startsafe.logs import kv

logger = logging.getLogger("startsafe.notifications")

# Rows sent per message; the rest go in the next one a moment later.
BATCH = 2000
# Lines listed in one message; beyond them the message says how many more.
LISTED = 50
MAX_BACKOFF = 600


def _conf(name: str):
    return settings.STARTSAFE[name]


# --- Writing the news -----------------------------------------------------------


def notify_needs_person_many(runs: list[tuple[Run, str]], now: datetime) -> None:
    """Runs wait for a person's decision, each with why: one INSERT for them all (the
    sweep's batches). Called inside the event's transaction (runs.signals)."""
    Notification.objects.bulk_create(
        [
            Notification(
                kind=NotificationKind.NEEDS_PERSON,
                dedupe_key=f"needs_person:{run.pk}:{run.current_attempt}",
                run=run,
                line=f"Run {run.run_key} (attempt {run.current_attempt}) needs a person: {why}.",
                due_at=now,
                created_at=now,
            )
            for run, why in runs
        ],
        ignore_conflicts=True,
    )


def collect_notifications(now: datetime | None = None) -> int:
    """Write rows for effects that started awaiting approval or near their deadline.

    1. Audit events into ``awaiting_approval`` (from another status) in the last
       ``NOTIFY_LOOKBACK`` seconds with no row yet: a time window rather than an id
       cursor, because ids are not committed in order and a cursor would skip a
       late commit.
    2. Awaiting effects whose deadline is within ``NOTIFY_DEADLINE_WARNING``
       (or a quarter of their own TTL, if shorter), once per deadline.
    The unique ``dedupe_key`` makes collecting twice a no-op.
    """
    now = now or timezone.now()
    rows: list[Notification] = []
    since = now - timedelta(seconds=_conf("NOTIFY_LOOKBACK"))
    already = Notification.objects.filter(
        dedupe_key=_awaiting_key("awaiting_approval:", OuterRef("pk"))
    )
    events = (
        AuditEvent.objects.filter(
            new_status=EffectStatus.AWAITING_APPROVAL, at__gte=since, effect__isnull=False
        )
        .exclude(old_status=EffectStatus.AWAITING_APPROVAL)
        .filter(~Exists(already))
        .select_related("effect", "run")
        .order_by("id")[:BATCH]
    )
    for event in events:
        effect = event.effect
        rows.append(
            Notification(
                kind=NotificationKind.AWAITING_APPROVAL,
                dedupe_key=f"awaiting_approval:{event.pk}",
                run_id=event.run_id or effect.run_id,
                effect=effect,
                line=f"{effect.tool} awaits approval until {_when(effect.approval_expires_at)}"
                + (f": {effect.preview[:120]}" if effect.preview else "")
                + f" (effect {effect.pk})",
                due_at=now,
                created_at=now,
            )
        )
    warning = timedelta(seconds=_conf("NOTIFY_DEADLINE_WARNING"))
    near = Effect.objects.filter(
        status=EffectStatus.AWAITING_APPROVAL,
        approval_expires_at__gt=now,
        approval_expires_at__lte=now + warning,
    ).order_by("approval_expires_at")[:BATCH]
    for effect in near:
        left = effect.approval_expires_at - now
        # A short-lived approval would be "near its deadline" from its first second.
        if left > timedelta(seconds=effect.approval_ttl / 4):
            continue
        rows.append(
            Notification(
                kind=NotificationKind.DEADLINE_NEAR,
                dedupe_key=f"deadline_near:{effect.pk}:{effect.approval_expires_at.isoformat()}",
                run_id=effect.run_id,
                effect=effect,
                line=f"{effect.tool} expires at {_when(effect.approval_expires_at)} "
                f"({int(left.total_seconds())} s left) (effect {effect.pk})",
                due_at=now,
                created_at=now,
            )
        )
    if rows:
        Notification.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def _awaiting_key(prefix: str, expression):
    from django.db.models import CharField, Value
    from django.db.models.functions import Cast, Concat

    return Concat(Value(prefix), Cast(expression, CharField()), output_field=CharField())


def _when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M UTC") if at else "no deadline"


# --- Sending --------------------------------------------------------------------


@dataclass
class SendReport:
    claimed: int = 0
    skipped: int = 0
    emails: int = 0
    webhooks: int = 0
    email_failures: int = 0
    webhook_failures: int = 0
    sent: int = 0


def operator_emails() -> list[str]:
    """``NOTIFY_EMAILS`` if set, else the active operators' addresses."""
    configured = [e for e in _conf("NOTIFY_EMAILS") if e]
    if configured:
        return configured
    users = (
        get_user_model().objects.filter(is_active=True, groups__name="operators").exclude(email="")
    )
    return sorted(set(users.values_list("email", flat=True)))


def escalation_emails() -> list[str]:
    """``ESCALATE_EMAILS``: the second group an escalation goes to."""
    return [e for e in _conf("ESCALATE_EMAILS") if e]


def deciders_by_email(addresses: list[str]) -> dict[str, object]:
    """The console user each address belongs to, when exactly one active user has it
    and may decide: only they get signed action links (a link decides for one user;
    an address two accounts share could not say whose decision it is)."""
    users: dict[str, list] = {}
    if not addresses:
        return {}
    same_address = Q()
    for address in addresses:
        same_address |= Q(email__iexact=address)
    for user in get_user_model().objects.filter(same_address, is_active=True):
        users.setdefault(user.email.lower(), []).append(user)
    return {
        address: found[0]
        for address in addresses
        if len(found := users.get(address.lower(), [])) == 1 and can_decide(found[0])
    }


def claim_pending(now: datetime) -> list[Notification]:
    """The due rows this sender holds now (approvals/outbox.py), each with its effect
    and run: each e-mail names them (compose, _effect_lines)."""
    return claim_due(Notification, now, batch=BATCH, related=("effect", "effect__run", "run"))


def _still_news(rows: list[Notification]) -> tuple[list[Notification], list[Notification]]:
    """Approval news about an effect that was decided meanwhile is no longer news."""
    effect_ids = {r.effect_id for r in rows if r.kind != NotificationKind.NEEDS_PERSON}
    awaiting = set(
        Effect.objects.filter(pk__in=effect_ids, status=EffectStatus.AWAITING_APPROVAL).values_list(
            "pk", flat=True
        )
    )
    keep, drop = [], []
    for row in rows:
        if row.kind == NotificationKind.NEEDS_PERSON or row.effect_id in awaiting:
            keep.append(row)
        else:
            drop.append(row)
    return keep, drop


def _url(path: str) -> str:
    """An address in the console: absolute with ``PUBLIC_URL``, else the path alone."""
    return (_conf("PUBLIC_URL") or "").rstrip("/") + path


def _effect_lines(effect: Effect, user, now: datetime) -> list[str]:
    """What an e-mail says of one effect: what it is, and a link per action its
    recipient may take (none for an address that is not a console operator)."""
    lines = [f"  Preview: {effect.preview}"] if effect.preview else []
    lines += [
        f"  Tool: {effect.tool} · run {effect.run.run_key} · deadline "
        f"{_when(effect.approval_expires_at)}",
        f"  Open: {_url(reverse('console:effect', args=[effect.pk]))}",
    ]
    if user is not None:
        for action in actions_for(effect, user, now):
            token = make_token(effect, user, action, now)
            lines.append(f"  {LABELS[action]}: {_url(link_path(token))}")
    return lines


def compose(
    rows: list[Notification], user=None, now: datetime | None = None
) -> tuple[str, str, dict]:
    """One subject, one body, one JSON payload for all the rows.

    ``user`` is the e-mail's recipient when the address is a console operator's: the
    body then carries their signed action links (``None``: the console's links only).
    """
    now = now or timezone.now()
    counts = {kind: 0 for kind in NotificationKind.values}
    for row in rows:
        counts[row.kind] += 1
    parts = []
    if counts[NotificationKind.ESCALATED]:
        parts.append(f"{counts[NotificationKind.ESCALATED]} escalated")
    if counts[NotificationKind.AWAITING_APPROVAL]:
        parts.append(f"{counts[NotificationKind.AWAITING_APPROVAL]} awaiting approval")
    if counts[NotificationKind.DEADLINE_NEAR]:
        parts.append(f"{counts[NotificationKind.DEADLINE_NEAR]} near their deadline")
    if counts[NotificationKind.NEEDS_PERSON]:
        parts.append(f"{counts[NotificationKind.NEEDS_PERSON]} run(s) need a person")
    summary = "startsafe: " + ", ".join(parts)
    lines: list[str] = []
    detailed: set = set()  # an effect named twice in a batch gets its links once
    for row in rows[:LISTED]:
        lines.append(f"- {row.line}")
        if row.effect_id is not None and row.effect_id not in detailed:
            detailed.add(row.effect_id)
            lines += _effect_lines(row.effect, user, now)
        elif row.run_id is not None and row.effect_id is None:
            lines.append(f"  Open: {_url(reverse('console:run', args=[row.run_id]))}")
    if len(rows) > LISTED:
        lines.append(f"... and {len(rows) - LISTED} more; see the queue.")
    body = summary + "\n\n" + "\n".join(lines) + "\n"
    if user is None and detailed:
        body += (
            "\nThis address is not a console operator's, so this e-mail carries no "
            "action links: sign in to the console to decide.\n"
        )
    elif detailed:
        ttl = _conf("EMAIL_LINK_TTL")
        body += (
            f"\nEach action link is yours alone, works once, and expires in {ttl // 3600} h "
            "or at the effect's deadline, whichever comes first. It opens a page to "
            "confirm: nothing is decided by following it.\n"
        )
    body += f"\nThe queue: {_url('/')}\n"
    payload = {
        "text": summary,
        "counts": counts,
        "items": [
            {
                "kind": row.kind,
                "run_id": str(row.run_id) if row.run_id else None,
                "effect_id": str(row.effect_id) if row.effect_id else None,
                "line": row.line,
            }
            for row in rows[:LISTED]
        ],
        "more": max(len(rows) - LISTED, 0),
    }
    return summary, body, payload


def _emails(
    rows: list[Notification], now: datetime, sent: set[tuple[int, str]] = frozenset()
) -> list[tuple[str, list[Notification], EmailMessage]]:
    """One message per recipient: the operators get the news, the escalation group
    the escalations (an address in both gets one message with both). ``sent`` holds
    the (row, address) pairs that already went: an address gets only the rows it has
    not had, and no message when it has had them all."""
    news = [r for r in rows if r.kind != NotificationKind.ESCALATED]
    escalated = [r for r in rows if r.kind == NotificationKind.ESCALATED]
    per_address: dict[str, list[Notification]] = {}
    for addresses, share in ((operator_emails(), news), (escalation_emails(), escalated)):
        for address in addresses:
            missing = [r for r in share if (r.pk, address) not in sent]
            if missing:
                per_address.setdefault(address, []).extend(missing)
    users = deciders_by_email(list(per_address))
    messages = []
    for address, own in per_address.items():
        own.sort(key=lambda row: row.pk)
        subject, body, _ = compose(own, users.get(address), now)
        messages.append((address, own, EmailMessage(subject, body, to=[address])))
    return messages


def _email_error(exc: Exception) -> str:
    return f"e-mail: {type(exc).__name__}: {exc}"[:500]


def _send_emails(rows: list[Notification], now: datetime, report: SendReport) -> dict[int, str]:
    """E-mail the rows, each address's message on its own, on one connection.

    Each message that went is recorded at once as (row, address) pairs
    (``NotificationEmail``), so a retry sends only to the addresses still missing.
    A failed message does not stop the others: a refused address must not hold back
    everyone after it on every retry (after a dropped connection the rest fail fast,
    and go on the next try). Returns the error of each row some address missed.
    """
    sent = set(
        NotificationEmail.objects.filter(notification__in=[r.pk for r in rows]).values_list(
            "notification_id", "address"
        )
    )
    emails = _emails(rows, now, sent)
    errors: dict[int, str] = {}
    if not emails:
        return errors
    connection = get_connection()
    failed, first_error = 0, ""
    try:
        connection.open()
    except Exception as exc:  # nothing went
        failed, first_error = len(emails), _email_error(exc)
        errors = {row.pk: first_error for _, own, _ in emails for row in own}
        emails = []
    try:
        for address, own, message in emails:
            try:
                report.emails += connection.send_messages([message]) or 0
            except Exception as exc:
                error = _email_error(exc)
                failed, first_error = failed + 1, first_error or error
                for row in own:
                    errors.setdefault(row.pk, error)
                continue
            NotificationEmail.objects.bulk_create(
                [NotificationEmail(notification=row, address=address, sent_at=now) for row in own],
                ignore_conflicts=True,
            )
    finally:
        connection.close()
    if failed:
        report.email_failures += failed
        logger.warning(kv("notify_email_failed", messages=failed, error=first_error))
    return errors


def send_pending_notifications(now: datetime | None = None) -> SendReport:
    """Send every due row as one message per channel; safe to run twice.

    1. Claim the due rows (compare-and-set, with a lease).
    2. Drop approval news about effects decided meanwhile.
    3. One e-mail per address for the rows it has not had yet; one POST for the rows
       not yet posted.
    4. A row is ``sent`` when every channel took it (for e-mail: every address it is
       meant for); otherwise it goes back to ``pending`` with back-off (a channel or
       an address that took it is not repeated), and is given up after
       ``NOTIFY_MAX_TRIES``.
    """
    now = now or timezone.now()
    report = SendReport()
    rows = claim_pending(now)
    report.claimed = len(rows)
    if not rows:
        return report
    rows, drop = _still_news(rows)
    if drop:
        Notification.objects.filter(pk__in=[r.pk for r in drop]).update(
            status=OutboxStatus.OBSOLETE
        )
        report.skipped = len(drop)

    errors: dict[int, str] = {}
    to_mail = [r for r in rows if r.email_done_at is None]
    if to_mail:
        # Each address once per row: what went is recorded message by message, and a
        # retry sends only what an address has not had.
        errors.update(_send_emails(to_mail, now, report))
        # No recipients is done too: nobody to tell is not a reason to retry.
        mailed = [r for r in to_mail if r.pk not in errors]
        Notification.objects.filter(pk__in=[r.pk for r in mailed]).update(email_done_at=now)
        for row in mailed:
            row.email_done_at = now

    url = _conf("NOTIFY_WEBHOOK_URL")
    to_post = [r for r in rows if r.webhook_done_at is None]
    if to_post and url:
        _, _, payload = compose(to_post, now=now)
        # The status and a fixed reason (startsafe/outbound.py), never the peer's body.
        outcome = outbound.post_json(
            url, payload, timeout=_conf("NOTIFY_WEBHOOK_TIMEOUT"), purpose="notify_webhook"
        )
        error = "" if outcome.delivered else f"webhook: {outcome.reason}"
        if error:
            report.webhook_failures += 1
            logger.warning(kv("notify_webhook_failed", rows=len(to_post), error=error))
            for row in to_post:
                errors[row.pk] = (errors.get(row.pk, "") + " " + error).strip()
        else:
            report.webhooks += 1
            Notification.objects.filter(pk__in=[r.pk for r in to_post]).update(webhook_done_at=now)
    elif to_post:
        Notification.objects.filter(pk__in=[r.pk for r in to_post]).update(webhook_done_at=now)

    done = [r.pk for r in rows if r.pk not in errors]
    Notification.objects.filter(pk__in=done, claim__in=[r.claim for r in rows[:1]]).update(
        status=OutboxStatus.SENT, last_error=""
    )
    report.sent = len(done)
    for row in rows:
        if row.pk not in errors:
            continue
        tries = row.tries + 1
        given_up = tries >= _conf("NOTIFY_MAX_TRIES")
        Notification.objects.filter(pk=row.pk, claim=row.claim).update(
            status=OutboxStatus.GIVEN_UP if given_up else OutboxStatus.PENDING,
            tries=tries,
            due_at=now + timedelta(seconds=min(2**tries, MAX_BACKOFF)),
            last_error=errors[row.pk],
        )
    return report


def notify(now: datetime | None = None) -> SendReport:
    """The periodic task's body: collect the news and the escalations, then send them."""
    from approvals.escalation import escalate_due  # it writes this module's rows

    now = now or timezone.now()
    started = time.monotonic()
    collected = collect_notifications(now)
    escalated = escalate_due(now)
    report = send_pending_notifications(now)
    duration = time.monotonic() - started
    logger.info(
        kv(
            "notify",
            collected=collected,
            escalated=escalated,
            claimed=report.claimed,
            sent=report.sent,
            skipped=report.skipped,
            emails=report.emails,
            webhooks=report.webhooks,
            email_failures=report.email_failures,
            webhook_failures=report.webhook_failures,
            duration=f"{duration:.4f}",
        )
    )
    record_task_run(
        "notify",
        now,
        duration,
        error="webhook or e-mail failed"
        if report.email_failures or report.webhook_failures
        else "",
        emails=report.emails,
        webhooks=report.webhooks,
        email_failures=report.email_failures,
        webhook_failures=report.webhook_failures,
        escalated=escalated,
    )
    return report
