"""Small template helpers: relative times, status badges, readable JSON, short hashes."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil

from approvals.views_common import pretty

register = template.Library()

# Status → colour family. The text is always shown too: colour is never the only cue.
_TONE = {
    "awaiting_approval": "warn",
    "unknown": "warn",
    "interrupted": "warn",
    "in_flight": "info",
    "running": "info",
    "pending": "info",
    "approved": "ok",
    "done": "ok",
    "completed": "ok",
    "rejected": "bad",
    "failed": "bad",
    "expired": "bad",
    "abandoned": "muted",
    "superseded": "muted",
}


@register.filter
def status_badge(status: str) -> str:
    status = str(status or "")
    label = status.replace("_", " ")
    return format_html(
        '<span class="badge tone-{}" data-status="{}">{}</span>',
        _TONE.get(status, "muted"),
        status,
        label,
    )


@register.filter
def reltime(value: datetime | None) -> str:
    """``<time>`` with "5 minutes ago" / "in 2 hours" and the absolute UTC time on hover."""
    if not value:
        return "—"
    now = timezone.now()
    if abs((now - value).total_seconds()) < 60:
        text = "just now"
    elif value <= now:
        text = f"{timesince(value, now, depth=1)} ago"
    else:
        text = f"in {timeuntil(value, now, depth=1)}"
    text = text.replace("\xa0", " ")
    absolute = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return format_html(
        '<time datetime="{}" title="{}">{}</time>', value.isoformat(), absolute, text
    )


@register.filter
def pretty_json(value) -> str:
    return pretty(value)


@register.filter
def short_hash(value: str | None) -> str:
    return (value or "")[:12]
