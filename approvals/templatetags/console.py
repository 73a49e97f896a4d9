"""Small template helpers: what an operator may do (``{% effect_actions %}``,
``{% run_actions %}``), relative times, status badges, readable JSON, short hashes."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe
from django.utils.timesince import timesince, timeuntil

from approvals.decisions import allowed_actions, allowed_run_actions
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
    # A tool's state (runs/models.py ToolState): a change waits for an admin's eye.
    "registered": "info",
    "confirmed": "ok",
    "changed": "warn",
}


def _badge(status: str) -> str:
    return format_html(
        '<span class="badge tone-{}" data-status="{}">{}</span>',
        _TONE.get(status, "muted"),
        status,
        status.replace("_", " "),
    )


# Made once: the queue shows a badge on each of its hundred rows.
_BADGES = {status: _badge(status) for status in _TONE}


@register.filter
def status_badge(status: str) -> str:
    status = str(status or "")
    return _BADGES.get(status) or _badge(status)


@register.simple_tag(takes_context=True)
def effect_actions(context, effect) -> frozenset[str]:
    """``{% effect_actions effect as actions %}``: what the signed-in user may do with
    ``effect`` (``decisions.allowed_actions``), at the request's ``now``."""
    return allowed_actions(effect, context["user"], context.get("now") or timezone.now())


@register.simple_tag(takes_context=True)
def run_actions(context, run) -> frozenset[str]:
    """``{% run_actions run as actions %}``: ``decisions.allowed_run_actions``."""
    return allowed_run_actions(run, context["user"])


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
    absolute = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    # Both times are digits, dashes, colons, a "T", a "+" and "UTC": nothing to escape
    # (format_html would escape them again, on each of the queue's ~200 times).
    text = escape(text.replace("\xa0", " "))
    return mark_safe(f'<time datetime="{value.isoformat()}" title="{absolute}">{text}</time>')


@register.filter
def pretty_json(value) -> str:
    return pretty(value)


@register.filter
def short_hash(value: str | None) -> str:
    return (value or "")[:12]
