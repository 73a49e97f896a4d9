"""Sign-in throttling: django-axes, with a lock that grows with the failures.

django-axes counts the failed sign-ins of every form that calls ``authenticate()``
(the console's and the admin's) per username and, apart, per client address, in
its ``AccessAttempt`` table, and its backend refuses a locked username or address
before the password is checked. What startsafe adds, through axes' own hooks:

1. ``cool_off``: the lock's length. The first lock lasts ``LOGIN_COOLOFF``. Axes
   keeps a running count per (username, address, user agent) row, so past the
   limit every further failure locks again at once; the lock doubles with each
   further ``LOGIN_FAILURE_LIMIT`` failures, up to ``LOGIN_COOLOFF_MAX``. A person
   who mistyped waits a few minutes; a guesser gets one try per lock, fewer and
   fewer a day.
2. ``ThrottleHandler``: axes' database handler, with two rules changed. Failures
   are forgotten ``LOGIN_COOLOFF_MAX`` after the last one, not after the cool-off
   of whichever request happens to clean up (a short one would end another
   client's longer lock). A sign-in clears that account's failures only: with
   axes' default it would also clear every failure from its address, and anyone
   with an account of their own could then reset the count between guesses at
   other accounts.
3. ``lockout_response``: the page that says how long to wait (429, Retry-After).
"""

from __future__ import annotations

from datetime import timedelta

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Q, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone


def _now(request: HttpRequest | None):
    # Axes reads the clock once per request (axes_attempt_time); so do we.
    return getattr(request, "axes_attempt_time", None) or timezone.now()


def cool_off(request: HttpRequest | None) -> timedelta:
    """How long a lock lasts for this request's username and address (AXES_COOLOFF_TIME).

    1. Sum the failures still remembered (younger than LOGIN_COOLOFF_MAX) for the
       username and for the address, apart; take the larger.
    2. One limit's worth of failures (or fewer: below the limit nothing is locked
       anyway) is the first lock, LOGIN_COOLOFF; each further limit's worth doubles it.
    """
    config = settings.STARTSAFE
    base, longest = config["LOGIN_COOLOFF"], config["LOGIN_COOLOFF_MAX"]
    failures = 0
    if request is not None:
        username = get_client_username(request)
        address = getattr(request, "axes_ip_address", None)
        remembered = AccessAttempt.objects.filter(
            Q(username=username) | Q(ip_address=address),
            attempt_time__gte=_now(request) - timedelta(seconds=longest),
        ).aggregate(
            by_username=Sum("failures_since_start", filter=Q(username=username)),
            by_address=Sum("failures_since_start", filter=Q(ip_address=address)),
        )
        failures = max(remembered["by_username"] or 0, remembered["by_address"] or 0)
    doublings = max(failures // settings.AXES_FAILURE_LIMIT - 1, 0)
    # 2**64 seconds outlasts any LOGIN_COOLOFF_MAX; the cap keeps a count of
    # millions from making a huge integer.
    return timedelta(seconds=min(base * 2 ** min(doublings, 64), longest))


class ThrottleHandler(AxesDatabaseHandler):
    def clean_expired_user_attempts(self, request=None, credentials=None) -> int:
        """Forget failures LOGIN_COOLOFF_MAX after the last one (axes: after this
        request's own cool-off, which may be shorter than another client's lock)."""
        longest = timedelta(seconds=settings.STARTSAFE["LOGIN_COOLOFF_MAX"])
        count, _ = AccessAttempt.objects.filter(attempt_time__lt=_now(request) - longest).delete()
        return count

    def reset_user_attempts(self, request, credentials=None) -> int:
        """On a sign-in, clear that account's failures, from every address, and no
        others (axes: also every failure from this address, for any username)."""
        username = get_client_username(request, credentials)
        count, _ = AccessAttempt.objects.filter(username=username).delete()
        return count


def lockout_response(
    request: HttpRequest, original_response: HttpResponse | None, credentials: dict | None
) -> HttpResponse:
    """The lockout page (AXES_LOCKOUT_CALLABLE): what happened and how long to wait.

    The refused try itself counted as a failure and started the lock again, so the
    wait is the whole cool-off from now (an upper bound: another address's failures
    that helped lock a username may age out sooner).
    """
    wait = get_cool_off(request)
    locked_at = _now(request)
    response = render(
        request,
        "registration/locked_out.html",
        {"locked_at": locked_at, "retry_at": locked_at + wait, "sign_in_url": request.path},
        status=429,
    )
    response["Retry-After"] = str(int(wait.total_seconds()))
    return response
