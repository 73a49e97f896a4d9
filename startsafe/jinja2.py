"""The Jinja2 environment for the console's list rows (``templates/jinja2/``).

Rows the queue renders by the hundred are Jinja2 templates: they compile to Python
functions, where the Django template language resolves and escapes each variable
through its own machinery, which was most of the queue page's time
(docs/performance.md). Pages stay Django templates; they render these rows with
``{% jinja %}`` (approvals/templatetags/console.py), and the console's actions
answer htmx with the same rows. The filters are the Django templates' own.
"""

from __future__ import annotations

from jinja2 import Environment, pass_context

from approvals.templatetags import console


@pass_context
def console_url(context, object_id, name: str) -> str:
    """The Django filter, with the script prefix ``{% jinja %}`` read once (when a
    view renders a row itself, there is none, and the filter reads it)."""
    return console.console_url(object_id, name, context.get("script_prefix"))


def environment(**options) -> Environment:
    env = Environment(**options)
    env.filters.update(
        status_badge=console.status_badge,
        reltime=console.reltime,
        pretty_json=console.pretty_json,
        short_hash=console.short_hash,
        console_url=console_url,
    )
    return env
