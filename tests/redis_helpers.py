"""Redis for the tests, on a machine whose Redis others use too.

``STARTSAFE_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) names the server
and database. A test never flushes it: it works under a key prefix of its own,
``startsafe-test:<purpose>:<random>:``, unique to each use (the rate limit's cache
through Django's ``KEY_PREFIX``, the Celery worker through the broker's
``CELERY_BROKER_KEY_PREFIX``), and deletes only the keys under that prefix when it
ends. A run killed half-way leaves its keys under ``startsafe-test:`` and nothing else.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis

REDIS_URL = os.environ.get("STARTSAFE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@dataclass(frozen=True)
class Namespace:
    """A client on the tests' Redis database and the prefix of this use's keys."""

    server: redis.Redis
    prefix: str

    def keys(self, pattern: str = "*") -> list[bytes]:
        """This namespace's keys matching ``pattern`` (after the prefix); SCAN, not KEYS."""
        match = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix) + pattern
        return list(self.server.scan_iter(match=match, count=1000))

    def clear(self) -> int:
        """Delete this namespace's keys, and only them; returns how many."""
        keys = self.keys()
        if keys:
            self.server.delete(*keys)
        return len(keys)


@contextmanager
def redis_namespace(purpose: str) -> Iterator[Namespace]:
    """A fresh prefix on the tests' Redis database; its keys are deleted on the way out."""
    server = redis.Redis.from_url(REDIS_URL)
    namespace = Namespace(server, f"startsafe-test:{purpose}:{uuid.uuid4().hex[:12]}:")
    try:
        yield namespace
    finally:
        namespace.clear()
        server.close()


@contextmanager
def someone_elses_key() -> Iterator[str]:
    """A key another user of the same Redis database wrote: the tests must leave it be.

    Raises ``AssertionError`` on the way out if it is gone (then deletes it)."""
    server = redis.Redis.from_url(REDIS_URL)
    key = f"someone-else:{uuid.uuid4().hex}"
    server.set(key, "not the tests' to delete", ex=3600)
    try:
        yield key
        assert server.get(key) == b"not the tests' to delete", f"{key} was deleted"
    finally:
        server.delete(key)
        server.close()
