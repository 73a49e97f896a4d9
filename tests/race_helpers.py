"""Races between real database sessions, proven to overlap.

A race test is only worth its name if the transactions it starts really run at the
same time. Two ways to prove it, both here:

- ``run_together``: each worker is a thread holding its own connection *before* a
  barrier releases them all, so a connection pool smaller than the race cannot run
  it in turns (the pool is grown for the race; the backends are counted).
- ``row_locked`` + ``wait_for_lock_waiters``: the test holds a row lock from
  outside Django and waits until PostgreSQL shows every worker waiting on a lock
  (``pg_stat_activity``); only then does it let go, and the workers meet the row
  one after another, each in a transaction that began before any of them ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from db_helpers import connect_outside_django
from django.db import connection

WAIT = 20.0  # seconds a proof may take before the test gives up (never a timing assertion)


@contextmanager
def pool_room(workers: int) -> Iterator[None]:
    """Django's connection pool grown so ``workers`` threads each hold a connection at
    once, beside this thread's. Without a pool (``DATABASE_POOL=0``) each thread
    opens its own connection: nothing to grow."""
    pool = connection.pool if connection.vendor == "postgresql" else None
    if pool is None:
        yield
        return
    min_size, max_size = pool.min_size, pool.max_size
    pool.resize(min_size, max(max_size, workers + 2))
    try:
        yield
    finally:
        pool.resize(min_size, max_size)
        # resize() keeps the connections grown past max_size: later tests would meet a
        # pool larger than the settings say (test_dbpool counts its connections). A
        # new pool, as the settings make it, is made at the next query.
        connection.close()
        connection.close_pool()


class Worker:
    """One callable in a thread of its own, on its own connection (closed at its end)."""

    def __init__(self, work: Callable[[], Any], ready: threading.Barrier | None = None):
        self.work = work
        self.ready = ready
        self.backend: int | None = None
        self.outcome: Any = None
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            connection.ensure_connection()
            if connection.vendor == "postgresql":
                self.backend = connection.connection.info.backend_pid
            if self.ready is not None:
                self.ready.wait(timeout=WAIT)
            self.outcome = self.work()
        except Exception as exc:  # the answer under test may be an error
            self.outcome = exc
        finally:
            connection.close()
            self.finished.set()

    def result(self) -> Any:
        """What the work returned or raised; waits for it to end."""
        self.thread.join(timeout=120)
        assert not self.thread.is_alive(), "the worker never ended"
        return self.outcome


def run_together(works: list[Callable[[], Any]]) -> list:
    """Run each callable in its own thread and connection, all released at once by a
    barrier that waits for every thread to hold its connection; what each returned
    or raised, in order."""
    with pool_room(len(works)):
        barrier = threading.Barrier(len(works))
        workers = [Worker(work, barrier) for work in works]
        results = [worker.result() for worker in workers]
    if connection.vendor == "postgresql":
        # Every worker had a session of its own when the barrier let them go.
        assert len({worker.backend for worker in workers}) == len(works)
    return results


def sessions_waiting_on_a_lock() -> int:
    """How many sessions of the test database wait on a lock right now."""
    with connect_outside_django() as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()[0]


def wait_for_lock_waiters(count: int, *, unless: Callable[[], bool] = lambda: False) -> int:
    """Wait until ``count`` sessions wait on a lock (or ``unless()`` is true); return
    how many wait then. The caller asserts the number: that is the proof."""
    deadline = time.monotonic() + WAIT
    waiting = sessions_waiting_on_a_lock()
    while waiting < count and not unless() and time.monotonic() < deadline:
        time.sleep(0.02)
        waiting = sessions_waiting_on_a_lock()
    return waiting


@contextmanager
def row_locked(model, pk) -> Iterator[None]:
    """Hold ``FOR UPDATE`` on one row, from a connection outside Django, until the
    block ends (then commit: the row is unchanged)."""
    with connect_outside_django() as conn, conn.transaction():
        locked = conn.execute(
            f"SELECT 1 FROM {model._meta.db_table} WHERE id = %s FOR UPDATE", [pk]
        ).fetchone()
        assert locked is not None, f"no {model.__name__} {pk} to lock"
        yield


def start_waiting_on(model, pk, works: list[Callable[[], Any]]) -> list:
    """Start every callable in its own thread while one row of ``model`` is locked;
    once all of them wait on a lock at the same time, let go; what each returned or
    raised, in order."""
    with pool_room(len(works)):
        workers: list[Worker] = []
        try:
            with row_locked(model, pk):
                workers = [Worker(work) for work in works]
                waiting = wait_for_lock_waiters(len(works))
                ended = [w.outcome for w in workers if w.finished.is_set()]
                assert waiting == len(works), (
                    f"{waiting} of {len(works)} workers waited on the lock; ended early: {ended}"
                )
        finally:
            results = [worker.result() for worker in workers]
    return results
