"""Small template helpers: relative times, status badges, readable JSON, short hashes,
and ``{% jinja %}`` for the rows that are Jinja2 templates."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache

from django import template
from django.template import engines
from django.template.backends.utils import csrf_input
from django.urls import get_script_prefix, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe
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


# The console's per-object addresses, reversed once per name and script prefix and
# then filled in by string replacement. The queue renders a dozen addresses per row
# for up to 300 rows; ``{% url %}`` (a full ``reverse`` each) was a third of its
# render time (docs/performance.md).
_PLACEHOLDER = "00000000-0000-0000-0000-00000000abcd"


@lru_cache(maxsize=64)
def _address_pattern(name: str, prefix: str) -> str:
    return reverse(f"console:{name}", args=[_PLACEHOLDER])


@register.filter
def console_url(object_id, name: str) -> str:
    """``{{ effect.pk|console_url:"approve" }}`` = ``{% url 'console:approve' effect.pk %}``."""
    return _address_pattern(name, get_script_prefix()).replace(_PLACEHOLDER, str(object_id))


@register.simple_tag(takes_context=True)
def jinja(context, template_name: str, **values) -> str:
    """``{% jinja "approvals/_effect_rows.html" effects=awaiting %}``: render a Jinja2
    template (``templates/jinja2/``, startsafe/jinja2.py says why) with this template's context
    and ``values``, as ``{% include ... with %}`` would."""
    template = engines["jinja2"].get_template(template_name)
    flat = context.flatten()
    flat.update(values)
    request = flat.get("request")
    if request is not None:
        # Once per call: given the request, the backend would pass a lazy
        # ``csrf_input`` that masks the token anew at each of a row's forms (300
        # times a queue page, 32 random choices each).
        flat["csrf_input"] = csrf_input(request)
    return mark_safe(template.render(flat))
