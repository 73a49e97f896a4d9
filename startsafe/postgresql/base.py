"""Django's PostgreSQL backend, with a pool that recovers at once from a restart.

psycopg's pool checks a connection as it hands it out; a dead one is thrown away
and the next one checked, with an exponential back-off between failures (1 s,
2 s, 4 s, ...). After PostgreSQL restarts, or its backends are terminated, every
idle connection of the pool is dead at once: a request then meets them one by one
and the back-off alone outlasts the pool's timeout, so it fails although the
server is back (measured: 10 dead idle connections, a 10 s timeout, no connection;
``tests/test_dbpool.py``).

So here the first dead connection found checks all the others straight away
(``ConnectionPool.check``: each dead one is replaced in the background, each live
one goes back), and the pool's next try gets a live or a fresh connection.

Django builds the pool itself and passes psycopg's plain check when
``CONN_HEALTH_CHECKS`` is on, with no setting to choose another (a ``check`` in
the pool's OPTIONS would be passed twice: a TypeError), and psycopg's pool has no
public way to change its check once built. So this backend puts ours in its
place, through the pool's ``_check`` attribute, once the pool exists, and finds
a connection's pool by its ``_pool``: psycopg's only private names used here,
kept because the recovery they buy (``tests/test_dbpool.py``) has no public route.

Its cursor also leaves the console's statements unprepared (``plans.py``).
Everything else is Django's.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.backends.postgresql import base

from startsafe.postgresql.plans import may_prepare

logger = logging.getLogger(__name__)


def check_pooled_connection(conn: Any) -> None:
    """The pool's ``check`` callback: psycopg's own check, plus the sweep on failure."""
    from psycopg_pool import ConnectionPool

    try:
        ConnectionPool.check_connection(conn)
    except Exception:
        # The pool marks a connection it hands out with itself (``_pool``); a
        # connection from elsewhere has none, and there is nothing to sweep.
        pool = getattr(conn, "_pool", None)
        if pool is not None:
            logger.warning("A pooled database connection was dead: checking the idle ones")
            pool.check()
        raise


class ServerBindingCursor(base.ServerBindingCursor):
    """Django's cursor for server-side binding, which prepares nothing inside
    ``unprepared()`` (startsafe/postgresql/plans.py says why)."""

    def execute(self, query, params=None, *, prepare=None, binary=None):
        if prepare is None and not may_prepare.get():
            prepare = False
        return super().execute(query, params, prepare=prepare, binary=binary)


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict:
        params = super().get_connection_params()
        if params.get("cursor_factory") is base.ServerBindingCursor:
            params["cursor_factory"] = ServerBindingCursor
        return params

    @property
    def pool(self):
        pool = super().pool
        # psycopg keeps the callback as ``_check``; Django set it only when checks
        # are on, and so do we (once: this property is read for every connection).
        if pool is not None and getattr(pool, "_check", None) not in (
            None,
            check_pooled_connection,
        ):
            pool._check = check_pooled_connection
        return pool
