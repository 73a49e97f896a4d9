"""Slack: each effect awaiting approval as ONE message with Approve / Reject buttons.

The messages are an outbox (``SlackMessage``, one row per effect and purpose):
``collect_slack_messages`` writes a row for each effect that started awaiting
approval or was escalated, from the audit log as ``collect_notifications`` does, and
marks a posted message due again when its effect changed; ``send_slack_messages``
posts each new row once and updates a posted one in place (chat.update). Each post
carries message metadata naming its row, so a post whose answer was lost (a timeout,
a worker that died) is found in the channel's history and adopted, not posted again.
Any change of an effect that a message shows queues the ``slack`` task after its
commit, so the message follows the console within seconds; the periodic run catches
what that missed. The buttons carry the effect's id and the ``args_hash`` they showed;
``approvals/views_slack.py`` decides with them through ``approvals/decisions.py``.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import checks
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.urls import reverse
from django.utils import timezone
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from approvals.models import SlackMessage, SlackPurpose, SlackUserMapping
from approvals.outbox import claim_due
from runs.models import (
    AuditEvent,
    Effect,
    EffectStatus,
    OutboxStatus,
    record_task_run,
)
from startsafe.logs import kv

logger = logging.getLogger("startsafe.slack")

# Messages sent per run of the task. Slack allows about one message a second per
# channel: a burst beyond that is answered 429 and waits its Retry-After.
BATCH = 50
# Rows written per collect (as approvals/notifications.py's BATCH).
COLLECT = 2000
# Characters of the arguments' JSON shown; the console shows them whole.
ARGS_SHOWN = 1500
PREVIEW_SHOWN = 500
MAX_BACKOFF = 600
# Seconds one Web API call may take.
TIMEOUT = 10
# The message metadata's event type; its payload names the row (``message_id``).
EVENT_TYPE = "startsafe_approval"
# Looking a post up: the history from this many seconds before its last try to as
# many after its TIMEOUT (our clock against Slack's), read newest first, at most
# LOOKUP_PAGES pages of LOOKUP_PAGE.
LOOKUP_SKEW = 60
LOOKUP_PAGE = 200
LOOKUP_PAGES = 5
# What conversations.history answers when it can never look: the app lacks the
# channels:history / groups:history scope, or posts where it is no member.
CANNOT_LOOK = {"missing_scope", "not_in_channel"}
# A channel's id (C…, G…); a channel given by name cannot be looked up.
CHANNEL_ID = re.compile(r"[CGD][A-Z0-9]{2,}")

APPROVE = "approve"
REJECT = "reject"
# The reject modal's callback_id, and its note's block and action id.
REJECT_MODAL = "startsafe_reject"
NOTE = "note"


def _conf(name: str):
    return settings.STARTSAFE[name]


def slack_enabled() -> bool:
    return bool(_conf("SLACK_BOT_TOKEN") and _conf("SLACK_SIGNING_SECRET"))


@checks.register()
def check_channels_are_ids(app_configs, **kwargs) -> list[checks.Warning]:
    """A channel given by name (``#approvals``) works for posting, but a post whose
    answer was lost cannot be looked up (conversations.history takes only an id), so
    it may be posted twice (``find_posted``; docs/slack.md, "Delivery")."""
    if not slack_enabled():
        return []
    names = [
        f"STARTSAFE_{name}={_conf(name)}"
        for name in ("SLACK_CHANNEL", "SLACK_ESCALATION_CHANNEL")
        if _conf(name) and not CHANNEL_ID.fullmatch(_conf(name))
    ]
    if not names:
        return []
    return [
        checks.Warning(
            f"Slack channel not given by its id ({', '.join(names)}): a post whose answer "
            "was lost cannot be found in the channel's history, and may be posted twice.",
            hint="Give the channel's id instead (in Slack: the channel's details, About, "
            "at the bottom; it looks like C0123ABCD).",
            id="startsafe.W002",
        )
    ]


def web_client() -> WebClient:
    # No retry handlers: a worker must not sleep through a 429's Retry-After, so a
    # rate-limited or failed message goes back to its row with a due time instead.
    return WebClient(
        token=_conf("SLACK_BOT_TOKEN"),
        base_url=_conf("SLACK_API_URL"),
        timeout=TIMEOUT,
        retry_handlers=[],
    )


# --- What a message shows -----------------------------------------------------------


def button_value(effect: Effect) -> str:
    """What a button carries: the effect and the arguments it showed."""
    return f"{effect.pk}:{effect.args_hash}"


def parse_button_value(value: str) -> tuple[uuid.UUID, str] | None:
    effect_id, _, args_hash = (value or "").partition(":")
    try:
        return uuid.UUID(effect_id), args_hash
    except ValueError:
        return None


def escape(text: str) -> str:
    """Slack's mrkdwn escaping: an agent's ``<!channel>`` is shown, never sent."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def console_url(effect_id) -> str:
    base = _conf("PUBLIC_URL")
    if not base:
        return ""
    return base.rstrip("/") + reverse("console:effect", kwargs={"effect_id": effect_id})


def _args_text(args) -> str:
    shown = json.dumps(args, ensure_ascii=False, sort_keys=True)
    if len(shown) > ARGS_SHOWN:
        more = len(shown) - ARGS_SHOWN
        shown = f"{shown[:ARGS_SHOWN]}… ({more} more characters: see the console)"
    # A ``` inside the arguments would end the code block early.
    return "```" + escape(shown).replace("```", "`\u200b``") + "```"


def _deadline(at: datetime | None) -> str:
    if at is None:
        return "none"
    # Shown in each reader's own time zone; the fallback where Slack cannot.
    fallback = at.strftime("%Y-%m-%d %H:%M UTC")
    return f"<!date^{int(at.timestamp())}^{{date_short_pretty}} {{time}}|{fallback}>"


def outcome_line(effect: Effect) -> str:
    """Who decided what, as the message says once the buttons are gone."""
    if effect.status == EffectStatus.EXPIRED:
        return ":hourglass: Expired: nobody decided before the deadline"
    decision = effect.decision or {}
    verb = decision.get("verb", "")
    by = escape(str(decision.get("by", "")))
    said, status_it_leaves = {
        "approved": (f":white_check_mark: Approved by {by}", EffectStatus.APPROVED),
        "rejected": (f":x: Rejected by {by}", EffectStatus.REJECTED),
        "marked_done": (f":heavy_check_mark: Marked done by {by}", EffectStatus.DONE),
        "released": (f":leftwards_arrow_with_hook: Released by {by}", effect.status),
    }.get(verb, (f"Now {effect.status}", effect.status))
    if effect.status != status_it_leaves:
        said += f" (now {effect.status})"  # the agent went on: in flight, done, failed
    note = escape(str(decision.get("note") or "")) if verb else ""
    return said + (f": {note}" if note else "")


def render_message(effect: Effect, purpose: str) -> tuple[str, list[dict]]:
    """The fallback text and the Block Kit blocks of an effect's message."""
    awaiting = effect.status == EffectStatus.AWAITING_APPROVAL
    tool = escape(effect.tool)
    head = f"*{tool}* awaits approval" if awaiting else f"*{tool}*"
    if purpose == SlackPurpose.ESCALATION:
        head = f":rotating_light: Escalated: {head}" + ("" if awaiting else " (was escalated)")
    preview = escape(effect.preview[:PREVIEW_SHOWN])
    blocks: list[dict] = [
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": head + (f"\n{preview}" if preview else "")},
        },
        {
            "type": "section",
            "fields": [
                {"type": "mrkdwn", "text": f"*Tool*\n{tool}"},
                {"type": "mrkdwn", "text": f"*Run*\n{escape(effect.run.run_key)}"},
                {"type": "mrkdwn", "text": f"*Deadline*\n{_deadline(effect.approval_expires_at)}"},
                {
                    "type": "mrkdwn",
                    "text": f"*Approvals*\n{len(effect.current_approvals or [])} of "
                    f"{effect.approvals_required}",
                },
            ],
        },
        {"type": "section", "text": {"type": "mrkdwn", "text": _args_text(effect.args)}},
        {
            "type": "context",
            "elements": [
                {
                    "type": "mrkdwn",
                    "text": f"effect {effect.pk} · args_hash {effect.args_hash[:12]} "
                    f"· version {effect.args_versions}",
                }
            ],
        },
    ]
    approved_by = ", ".join(escape(a["by"]) for a in effect.current_approvals or [])
    if awaiting and approved_by:
        blocks.append(
            {"type": "section", "text": {"type": "mrkdwn", "text": f"Approved by {approved_by}"}}
        )
    if not awaiting:
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": outcome_line(effect)}})
    buttons: list[dict] = []
    if awaiting:
        value = button_value(effect)
        buttons = [
            {
                "type": "button",
                "action_id": APPROVE,
                "style": "primary",
                "text": {"type": "plain_text", "text": "Approve"},
                "value": value,
            },
            {
                "type": "button",
                "action_id": REJECT,
                "style": "danger",
                "text": {"type": "plain_text", "text": "Reject…"},
                "value": value,
            },
        ]
    if url := console_url(effect.pk):
        buttons.append(
            {
                "type": "button",
                "action_id": "open_console",
                "text": {"type": "plain_text", "text": "Open in console"},
                "url": url,
            }
        )
    if buttons:
        blocks.append({"type": "actions", "block_id": "decide", "elements": buttons})
    state = "awaits approval" if awaiting else outcome_line(effect)
    text = f"{effect.tool} {state}" + (f": {effect.preview[:150]}" if effect.preview else "")
    return escape(text), blocks


# --- Which changes a message shows --------------------------------------------------
#
# A change into, out of or within awaiting approval, any person's decision, and an
# escalation; not the agent's claims and results after an approval, which would cost
# an update each and change nothing a decider needs. One table, read two ways: in
# Python by the receiver of each new audit event, as a query by the periodic collect.
SHOWN_CHANGES = {
    "old_status": EffectStatus.AWAITING_APPROVAL,
    "new_status": EffectStatus.AWAITING_APPROVAL,
    "actor_kind": "operator",
    "verb": "escalated",
}


def changes_a_message(event: AuditEvent) -> bool:
    return event.effect_id is not None and any(
        getattr(event, field) == value for field, value in SHOWN_CHANGES.items()
    )


CHANGES_A_MESSAGE = Q(effect__isnull=False) & Q(*SHOWN_CHANGES.items(), _connector=Q.OR)


def sync_after_commit(sender, instance: AuditEvent, created: bool, **kwargs) -> None:
    """``post_save`` of every audit event: queue the ``slack`` task after the commit of
    a change a message shows, once per transaction (a sweep expires hundreds)."""
    if not created or not slack_enabled() or not changes_a_message(instance):
        return
    # Django keeps the callbacks of the open transaction here; there is no public way
    # to ask whether one is already queued.
    if any(func is enqueue_sync for _, func, _ in connection.run_on_commit):
        return
    transaction.on_commit(enqueue_sync)


def enqueue_sync() -> None:
    from approvals.tasks import slack

    try:
        slack.apply_async(expires=60)
    except Exception:
        # The broker is down: the periodic run finds the change in the audit log.
        logger.exception(kv("slack_enqueue_failed"))


# --- Collecting ---------------------------------------------------------------------


def collect_slack_messages(now: datetime) -> int:
    """Write a row for each effect newly awaiting approval or escalated, and mark due
    again each posted message whose effect changed since; returns rows touched.

    1. Audit events of the last ``NOTIFY_LOOKBACK`` seconds (a time window, as
       ``collect_notifications`` reads them: ids are not committed in order).
    2. Into ``awaiting_approval`` with no approval row yet: a row for the channel.
       ``escalated`` with no escalation row yet: a row for the escalation channel.
       The unique (effect, purpose) makes a second collect, or a second worker, a
       no-op, and an effect that awaits approval again gets its message updated.
    3. A change the message shows, on an effect whose revision passed the one its
       sent (or skipped as no longer news) message shows: that row is due again.
    """
    since = now - timedelta(seconds=_conf("NOTIFY_LOOKBACK"))
    recent = AuditEvent.objects.filter(at__gte=since, effect__isnull=False).order_by()
    awaiting = Q(new_status=EffectStatus.AWAITING_APPROVAL)
    news = [
        (SlackPurpose.APPROVAL, _conf("SLACK_CHANNEL"), awaiting),
        (SlackPurpose.ESCALATION, _conf("SLACK_ESCALATION_CHANNEL"), Q(verb="escalated")),
    ]
    rows = []
    for purpose, channel, which in news:
        if not channel:
            continue
        posted = SlackMessage.objects.filter(effect=OuterRef("effect_id"), purpose=purpose)
        effect_ids = (
            recent.filter(which)
            .filter(~Exists(posted))
            .values_list("effect_id", flat=True)
            .distinct()[:COLLECT]
        )
        rows += [
            SlackMessage(
                effect_id=effect_id, purpose=purpose, channel=channel, due_at=now, created_at=now
            )
            for effect_id in effect_ids
        ]
    if rows:
        SlackMessage.objects.bulk_create(rows, ignore_conflicts=True)
    changed = SlackMessage.objects.filter(
        effect_id__in=recent.filter(CHANGES_A_MESSAGE).values("effect_id"),
        status__in=(OutboxStatus.SENT, OutboxStatus.OBSOLETE),
        effect__revision__gt=F("shown_revision"),
    ).update(status=OutboxStatus.PENDING, due_at=now)
    return len(rows) + changed


# --- Sending ------------------------------------------------------------------------


@dataclass
class SlackReport:
    collected: int = 0
    posted: int = 0
    updated: int = 0
    failures: int = 0
    # Effects decided before their message went out: not posted.
    skipped: int = 0
    # Rows put back until a 429's Retry-After passes.
    deferred: int = 0
    # Posts whose answer was lost, found in the channel's history and not posted again.
    found: int = 0
    # Rows whose lease passed before this sender called Slack: another one holds them.
    lost: int = 0


def claim_due_messages(now: datetime) -> list[SlackMessage]:
    """The due messages this sender holds now (approvals/outbox.py), each with its
    effect and run (the message shows them)."""
    return claim_due(SlackMessage, now, batch=BATCH, related=("effect", "effect__run"))


def retry_after(response) -> int:
    """Seconds a 429 asks us to wait (Slack always sends Retry-After; 60 if not)."""
    headers = {k.lower(): v for k, v in (response.headers or {}).items()}
    try:
        return max(int(headers.get("retry-after", 60)), 1)
    except (TypeError, ValueError):
        return 60


def send_slack_messages(now: datetime) -> SlackReport:
    """Post each claimed new row once; update each posted one in place.

    1. Claim the due rows.
    2. A row without ``ts`` whose post was tried before (``post_tried_at``) may be
       in Slack already: it is looked up first (``find_posted``). Found, its channel
       and ts are saved and it is a posted row from then on (updated if its effect
       changed since that post). A lookup that fails counts as a failed try, never
       as "not there"; one Slack will never answer (no history scope, a channel
       given by name) lets the row be posted as before, with a warning.
    3. A row without ``ts`` whose effect no longer awaits approval is not news:
       ``obsolete``, not posted. Any other row without ``ts`` is posted
       (chat.postMessage, its effect and purpose named in the message's metadata),
       by this sender only if it still holds the row (``_still_held``: the lease
       renewed and ``post_tried_at`` saved in one statement before the call; a lease
       that passed mid-batch leaves the row to the sender that claimed it since);
       the answer's channel and ts are saved at once, whoever holds the claim, so
       it is never posted again. A row with ``ts`` is
       updated (chat.update).
    4. A 429 puts this row and the rest of the batch back until its Retry-After
       passes, without counting a try: Slack limits the app, not one message.
       Any other failure goes back with back-off; after ``NOTIFY_MAX_TRIES``,
       ``given_up`` with its last error (shown in the admin).
    """
    report = SlackReport()
    rows = claim_due_messages(now)
    if not rows:
        return report
    client = web_client()
    # Why a lookup could not be made, each logged once per run.
    warned: set[str] = set()
    for index, row in enumerate(rows):
        try:
            shown = _deliver(client, row, now, warned, report)
        except SlackApiError as exc:
            if exc.response.status_code == 429:
                wait = retry_after(exc.response)
                rest = [r.pk for r in rows[index:]]
                SlackMessage.objects.filter(pk__in=rest, claim=row.claim).update(
                    status=OutboxStatus.PENDING,
                    due_at=now + timedelta(seconds=wait),
                    last_error=f"slack: rate limited for {wait} s",
                )
                report.deferred = len(rest)
                logger.warning(kv("slack_rate_limited", retry_after=wait, deferred=len(rest)))
                break
            _failed(row, f"slack: {exc.response.get('error') or exc.response.status_code}", now)
            report.failures += 1
            continue
        except (OSError, LookupUnsettled) as exc:  # OSError: could not connect, timed out
            reason = type(exc).__name__ if isinstance(exc, OSError) else str(exc)
            _failed(row, f"slack: {reason}", now)
            report.failures += 1
            continue
        if shown:
            SlackMessage.objects.filter(
                pk=row.pk, claim=row.claim, status=OutboxStatus.SENDING
            ).update(
                status=OutboxStatus.SENT,
                shown_revision=row.effect.revision,
                tries=0,
                last_error="",
                sent_at=now,
            )
    return report


def _deliver(
    client: WebClient, row: SlackMessage, now: datetime, warned: set[str], report: SlackReport
) -> bool:
    """Bring ``row``'s message in Slack up to its effect (steps 2 and 3 above),
    counting what happened in ``report``; True when the message now shows the
    effect (the row is sent). Slack's and the lookup's errors propagate."""
    effect = row.effect
    if not row.ts and row.post_tried_at is not None:
        if not _still_held(row, now):
            report.lost += 1
            return False
        found = find_posted(client, row, warned)
        if found is not None:
            row.channel, row.ts, shown = found
            SlackMessage.objects.filter(pk=row.pk).update(channel=row.channel, ts=row.ts)
            logger.info(kv("slack_post_found", effect=row.effect_id, purpose=row.purpose))
            report.found += 1
            if shown == effect.revision:
                return True
    if not row.ts and effect.status != EffectStatus.AWAITING_APPROVAL:
        # Decided before its message went out: no longer news (as e-mail's
        # _still_news). Should it await approval again, it is posted then. A post
        # tried before was just looked up and is not there: asked again one day, the
        # row is posted with no lookup of that old try.
        SlackMessage.objects.filter(pk=row.pk, claim=row.claim).update(
            status=OutboxStatus.OBSOLETE, shown_revision=effect.revision, post_tried_at=None
        )
        report.skipped += 1
        return False
    text, blocks = render_message(effect, row.purpose)
    if row.ts:
        client.chat_update(channel=row.channel, ts=row.ts, text=text, blocks=blocks)
        report.updated += 1
        return True
    if not _still_held(row, now, posting=True):
        report.lost += 1
        return False
    answer = client.chat_postMessage(
        channel=row.channel, text=text, blocks=blocks, metadata=metadata(row, effect)
    )
    SlackMessage.objects.filter(pk=row.pk).update(channel=answer["channel"], ts=answer["ts"])
    report.posted += 1
    return True


def _still_held(row: SlackMessage, now: datetime, *, posting: bool = False) -> bool:
    """Renew this sender's lease on ``row`` just before it calls Slack for it; False
    when the lease passed and another sender claimed the row (it is theirs now: a
    post by both would be two messages). With ``posting``, the time of the post is
    saved in the same statement, before the call (``post_tried_at``: the lookup's
    window, should its answer be lost). The real clock: a batch takes time, and
    Slack's ``ts`` is real time; the lease never ends before the run's clock says."""
    real_now = timezone.now()
    changes = {"due_at": max(now, real_now) + timedelta(seconds=_conf("NOTIFY_LEASE"))}
    if posting:
        changes["post_tried_at"] = row.post_tried_at = real_now
    held = SlackMessage.objects.filter(pk=row.pk, claim=row.claim, status=OutboxStatus.SENDING)
    return held.update(**changes) == 1


def metadata(row: SlackMessage, effect: Effect) -> dict:
    """The message metadata a post carries: the effect and purpose it is the message
    of (one row each; globally unique, unlike the row's id, which another install
    posting to the same channel could share), its row, and the revision it shows."""
    return {
        "event_type": EVENT_TYPE,
        "event_payload": {
            "effect_id": str(effect.pk),
            "purpose": row.purpose,
            "message_id": str(row.pk),
            "revision": effect.revision,
        },
    }


def _is_post_of(message: dict, row: SlackMessage) -> bool:
    meta = message.get("metadata") or {}
    payload = meta.get("event_payload") or {}
    return (
        meta.get("event_type") == EVENT_TYPE
        and payload.get("effect_id") == str(row.effect_id)
        and payload.get("purpose") == row.purpose
    )


class LookupUnsettled(Exception):
    """The history was read as far as a lookup goes, and the post was neither found
    nor shown absent: retried later, never posted blind."""


def find_posted(client: WebClient, row: SlackMessage, warned: set[str]):
    """Where an earlier post of ``row`` is in Slack: (channel, ts, the revision it
    showed), or None when no post of it is there.

    The channel's history around the row's last post (``post_tried_at``, saved before
    it): from ``LOOKUP_SKEW`` seconds before to the call's ``TIMEOUT`` and the skew
    after, with every message's metadata (conversations.history,
    ``include_all_metadata``), newest first, page by page up to ``LOOKUP_PAGES``; a
    message whose metadata names the row's effect and purpose is its post. A channel
    given by name, or an app without the history scopes (``missing_scope``) or
    outside the channel (``not_in_channel``), cannot look: None (the row is posted,
    at the old risk of a second message), with a warning once per run. Any other
    failure raises (a failed try, or a 429)."""
    cannot = "" if CHANNEL_ID.fullmatch(row.channel) else "channel_given_by_name"
    tried = row.post_tried_at.timestamp()
    oldest, latest = f"{tried - LOOKUP_SKEW:.6f}", f"{tried + TIMEOUT + LOOKUP_SKEW:.6f}"
    cursor = None
    for _ in range(LOOKUP_PAGES if not cannot else 0):
        try:
            page = client.conversations_history(
                channel=row.channel,
                oldest=oldest,
                latest=latest,
                include_all_metadata=True,
                limit=LOOKUP_PAGE,
                cursor=cursor,
            )
        except SlackApiError as exc:
            cannot = exc.response.get("error") or ""
            if cannot not in CANNOT_LOOK:
                raise
            break
        for message in page.get("messages") or []:
            if _is_post_of(message, row):
                revision = (message["metadata"].get("event_payload") or {}).get("revision")
                return row.channel, message["ts"], revision
        cursor = (page.get("response_metadata") or {}).get("next_cursor")
        if not cursor:
            return None
    if not cannot:
        raise LookupUnsettled(f"not found in the last {LOOKUP_PAGES * LOOKUP_PAGE} messages")
    if cannot not in warned:
        warned.add(cannot)
        logger.warning(
            kv(
                "slack_lookup_impossible",
                reason=cannot,
                channel=row.channel,
                then="posted unlooked",
            )
        )
    return None


def _failed(row: SlackMessage, error: str, now: datetime) -> None:
    tries = row.tries + 1
    given_up = tries >= _conf("NOTIFY_MAX_TRIES")
    logger.warning(kv("slack_failed", effect=row.effect_id, purpose=row.purpose, error=error))
    SlackMessage.objects.filter(pk=row.pk, claim=row.claim).update(
        status=OutboxStatus.GIVEN_UP if given_up else OutboxStatus.PENDING,
        tries=tries,
        due_at=now + timedelta(seconds=min(2**tries, MAX_BACKOFF)),
        last_error=error[:500],
    )


def sync_slack(now: datetime | None = None) -> SlackReport:
    """The ``slack`` task's body: collect, then send. Nothing when Slack is off."""
    if not slack_enabled():
        return SlackReport()
    now = now or timezone.now()
    started = time.monotonic()
    collected = collect_slack_messages(now)
    report = send_slack_messages(now)
    report.collected = collected
    duration = time.monotonic() - started
    counts = {
        "collected": collected,
        "posted": report.posted,
        "updated": report.updated,
        "skipped": report.skipped,
        "failures": report.failures,
        "deferred": report.deferred,
        "found": report.found,
        "lost": report.lost,
    }
    logger.info(kv("slack", **counts, duration=f"{duration:.4f}"))
    error = "Slack refused or failed" if report.failures else ""
    record_task_run("slack", now, duration, error=error, **counts)
    return report


# --- Who clicked --------------------------------------------------------------------


def console_user(slack_user_id: str, client: WebClient | None = None):
    """The console user a Slack member decides as, or None (they decide nothing).

    1. An admin's ``SlackUserMapping`` wins; one naming a deactivated user maps to
       nobody (no falling back to e-mail past an admin's word).
    2. Else Slack's users.info: a member who is not deleted, not a bot, and whose
       profile e-mail Slack says is confirmed (``is_email_confirmed``), matched
       case-insensitively to exactly one active user's e-mail. Under SSO Slack may
       not mark e-mails confirmed: map those members explicitly (docs/slack.md).
    """
    mapping = (
        SlackUserMapping.objects.select_related("user").filter(slack_user_id=slack_user_id).first()
    )
    if mapping is not None:
        return mapping.user if mapping.user.is_active else None
    try:
        member = (client or web_client()).users_info(user=slack_user_id).get("user") or {}
    except (SlackApiError, OSError) as exc:
        logger.warning(kv("slack_users_info_failed", user=slack_user_id, error=str(exc)[:200]))
        return None
    email = ((member.get("profile") or {}).get("email") or "").strip()
    if (
        not email
        or member.get("is_email_confirmed") is not True
        or member.get("deleted")
        or member.get("is_bot")
    ):
        return None
    users = list(get_user_model().objects.filter(email__iexact=email, is_active=True)[:2])
    return users[0] if len(users) == 1 else None
