"""Rate limiting of the agent API, per token: a fixed-window counter in Django's cache.

``STARTSAFE_RATE_LIMIT`` (``600/minute`` by default; ``0`` or empty turns it off)
counts every authenticated request of an agent in the current window; past the
limit the answer is ``429 rate_limited`` with ``Retry-After`` (the seconds left in
the window). A fixed window is the simplest counter that is exact under any number
of web processes when the cache is shared (Redis): each window has its own
counter, incremented atomically, which expires a little after the window. A burst
of up to twice the limit across a window boundary is the known price of that
simplicity.

Every API request counts, the poll too, so counting is one round trip to Redis:
``INCR`` and ``EXPIRE`` in one ``MULTI``/``EXEC``. Django's ``cache.add`` then
``cache.incr`` would be three (its Redis ``incr`` asks ``EXISTS`` first). In
local memory the counter is incremented first, and created only when that fails.

The counter is taken once per request (kept on it), before the idempotency
middleware takes an ``Idempotency-Key``, so a refused request never stores its
429 as the key's answer: the client's retry with the same key goes through.
"""

from __future__ import annotations

import math
import time

from django.conf import settings
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.http import HttpRequest, JsonResponse

from runs.api.auth import error_response
from runs.models import Agent
from startsafe.env import parse_rate

CACHE_ALIAS = "default"
_UNSET = object()


class RateLimited(Exception):
    """Over the rate. An exception because the API's auth class raises it, the way
    django-ninja lets an auth class answer: its handler (runs/api/views.py) gives the 429."""

    def __init__(self, retry_after: int, limit: int, period: int):
        super().__init__(f"over {limit} requests per {period} s")
        self.retry_after = retry_after
        self.limit = limit
        self.period = period


def _count(agent: Agent, limit: int, period: int, now: float) -> int | None:
    """Count this request; returns the seconds to wait when over the limit, else None."""
    window = int(now // period)
    key = f"startsafe:rate:{agent.pk}:{period}:{window}"
    # The counter outlives its window a little, so a late incr never recreates it.
    used = _incr_window(caches[CACHE_ALIAS], key, timeout=period + 5)
    if used <= limit:
        return None
    return max(1, math.ceil((window + 1) * period - now))


def _incr_window(cache, key: str, timeout: int) -> int:
    """The window's counter after adding this request, created at 0 if absent."""
    if isinstance(cache, RedisCache):
        # Django's own key (prefix, version), as cache.add and cache.incr would use.
        redis_key = cache.make_and_validate_key(key)
        # INCR creates a missing counter at 1; EXPIRE in the same MULTI/EXEC gives it
        # its expiry whatever happened before, so no counter is ever left without one
        # (setting it on every request only moves a past window's end a little).
        client = cache._cache.get_client(redis_key, write=True)
        with client.pipeline(transaction=True) as pipe:
            pipe.incr(redis_key)
            pipe.expire(redis_key, timeout)
            used, _ = pipe.execute()
        return used
    try:
        return cache.incr(key)  # the window's counter exists but for its first request
    except ValueError:
        pass
    cache.add(key, 0, timeout=timeout)
    try:
        return cache.incr(key)
    except ValueError:  # evicted between add and incr: this request opens it again
        cache.set(key, 1, timeout=timeout)
        return 1


def rate_limit_refusal(request: HttpRequest, agent: Agent) -> RateLimited | None:
    """The refusal when ``agent`` is over its rate, else None.

    Counted once per request: the idempotency middleware asks before the work and
    the API's auth class asks again; the second answer is the first one, kept on
    the request."""
    seen = getattr(request, "_startsafe_rate", _UNSET)
    if seen is _UNSET:
        rate = parse_rate(settings.STARTSAFE.get("RATE_LIMIT"))
        seen = None
        if rate is not None:
            retry_after = _count(agent, rate[0], rate[1], time.time())
            if retry_after is not None:
                seen = RateLimited(retry_after, *rate)
        request._startsafe_rate = seen
    return seen


def rate_limited_response(exc: RateLimited) -> JsonResponse:
    response = error_response(
        429,
        "rate_limited",
        f"Too many requests for this token: retry after {exc.retry_after} s.",
        {"limit": exc.limit, "period": exc.period, "retry_after": exc.retry_after},
    )
    response["Retry-After"] = str(exc.retry_after)
    return response
