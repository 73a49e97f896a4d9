"""Small template helpers: relative times, status badges, readable JSON, short hashes,
and ``{% jinja %}`` for the rows that are Jinja2 templates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache

from django import template
from django.template import engines
from django.template.backends.utils import csrf_input
from django.urls import get_script_prefix, reverse
from django.utils import timezone
from django.utils.html import escape, format_html
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
    seconds = int((now - value).total_seconds())
    if abs(seconds) < 60:
        text = "just now"
    elif abs(seconds) < _TEXT_BY_WHOLE_MINUTES_BELOW and not value.utcoffset():
        text = _relative_text(seconds // 60 if seconds > 0 else -(-seconds // 60))
    else:
        text = escape(_relative(value, now))
    absolute = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    # Both times are digits, dashes, colons, a "T", a "+" and "UTC": nothing to escape.
    return mark_safe(f'<time datetime="{value.isoformat()}" title="{absolute}">{text}</time>')


# Under four weeks, ``timesince`` at depth 1 depends on nothing but the whole
# minutes between the two times (no month or year is involved): the queue shows a
# relative time or two on each of its 100 rows, and ``timesince`` costs ~25 µs a
# call (its strings are lazy translations), so each distinct text is made once.
# Only for UTC values (the database gives nothing else): timesince counts the
# wall-clock time of the value's own zone, which a daylight-saving change makes
# differ from the real minutes. Not per language: the console is English (the words
# around it are; there is no LocaleMiddleware), so the text is LANGUAGE_CODE's.
_TEXT_BY_WHOLE_MINUTES_BELOW = 28 * 24 * 3600


@lru_cache(maxsize=4096)
def _relative_text(minutes: int) -> str:
    """The escaped words for a distance of ``minutes`` (negative: in the future)."""
    now = datetime(2000, 1, 1, tzinfo=UTC)
    return escape(_relative(now - timedelta(minutes=minutes), now))


def _relative(value: datetime, now: datetime) -> str:
    if value <= now:
        text = f"{timesince(value, now, depth=1)} ago"
    else:
        text = f"in {timeuntil(value, now, depth=1)}"
    return text.replace("\xa0", " ")


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
def console_url(object_id, name: str, prefix: str | None = None) -> str:
    """``{{ effect.pk|console_url:"approve" }}`` = ``{% url 'console:approve' effect.pk %}``.

    ``prefix``: the script prefix, when the caller has it (``{% jinja %}`` reads it
    once per call: each ``get_script_prefix()`` is a context-local lookup, and a
    queue page makes a thousand addresses)."""
    if prefix is None:
        prefix = get_script_prefix()
    return _address_pattern(name, prefix).replace(_PLACEHOLDER, str(object_id))


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
    flat["script_prefix"] = get_script_prefix()  # for console_url, once per call
    return mark_safe(template.render(flat))
