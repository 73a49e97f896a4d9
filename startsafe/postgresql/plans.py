"""Console requests run unprepared statements, so PostgreSQL plans each for its values.

With ``DATABASE_PREPARE`` on (the default), psycopg prepares a statement the fifth
time a connection sends it, and after five more executions PostgreSQL may keep a
*generic* plan, made without the parameters' values. That is what the API's hot
statements want: constant SQL, looked up by primary key, one plan fits every value.
The console's queries are the opposite: built from an operator's filters and
search, their best plan depends on the values. The runs page's search (a trigram
index for a rare word) went from 30 ms to 190 ms on the eleventh request of a
connection, when the generic plan (walk every run newest first, filter by the
pattern) took over (docs/performance.md).

So everything outside ``/api/`` (``ConsoleQueriesMiddleware`` is in
``CONSOLE_ONLY_MIDDLEWARE``) runs inside ``unprepared()``: psycopg then sends each
statement unnamed, still bound by the server, and PostgreSQL plans it with the
values at hand. The cursor that obeys it is in ``startsafe/postgresql/base.py``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

# False while statements must not be prepared (the console's requests).
may_prepare: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "startsafe_may_prepare", default=True
)


@contextmanager
def _preparing(allowed: bool) -> Iterator[None]:
    token = may_prepare.set(allowed)
    try:
        yield
    finally:
        may_prepare.reset(token)


def unprepared() -> AbstractContextManager[None]:
    """Statements sent inside this block are planned with their values, every time."""
    return _preparing(False)


def prepared() -> AbstractContextManager[None]:
    """psycopg's threshold applies again inside this block, as it does for the API."""
    return _preparing(True)


class ConsoleQueriesMiddleware:
    """Every request this middleware sees (the console's: not ``/api/``) is unprepared."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        with unprepared():
            return self.get_response(request)
