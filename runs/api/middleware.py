"""Only the middleware the agent API needs, for ``/api/`` requests.

The console's middleware (sessions, CSRF, authentication, messages, htmx, static
files) does nothing for a bearer-token JSON API, yet each layer costs every poll
a little: ``make bench`` measured the whole stack at about a sixth of a poll's
server time. This middleware, first in ``MIDDLEWARE``, sends ``/api/`` requests
through a second chain built from the same ``MIDDLEWARE`` list minus
``CONSOLE_ONLY_MIDDLEWARE``, so the API keeps everything else (security headers,
host validation, the idempotency middleware, and any middleware added later).
"""

from __future__ import annotations

from django.conf import settings
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpResponse
from django.urls import Resolver404, resolve
from django.utils.module_loading import import_string
from django.views import defaults

from runs.api.auth import error_response, internal_error_response

API_PREFIX = "/api/"
THIS = f"{__name__}.ApiMiddleware"


class ApiMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response
        skipped = {THIS, *getattr(settings, "CONSOLE_ONLY_MIDDLEWARE", ())}
        handler = convert_exception_to_response(_call_view)
        for path in reversed(settings.MIDDLEWARE):
            if path not in skipped:
                handler = convert_exception_to_response(import_string(path)(handler))
        self.api_chain = handler

    def __call__(self, request):
        if request.path_info.startswith(API_PREFIX):
            return self.api_chain(request)
        return self.get_response(request)


def _call_view(request):
    """What Django's handler does after the middleware, for the API's plain views:
    resolve the address and call the view. ninja turns the view's errors into the
    contract's bodies itself; what Django answers alone (an unknown address, a
    method no endpoint takes) gets that body here: errors always have it (api.md).
    Here, inside the idempotency middleware, so a kept answer is the contract's."""
    try:
        match = resolve(request.path_info)
    except Resolver404:
        return error_response(404, "not_found", "No such address in this API.")
    request.resolver_match = match
    response = match.func(request, *match.args, **match.kwargs)
    if response.status_code == 405 and not response.get("Content-Type", "").startswith(
        "application/json"
    ):
        return _method_not_allowed(response.get("Allow", ""))
    return response


def _method_not_allowed(allowed: str) -> HttpResponse:
    answer = error_response(
        405,
        "method_not_allowed",
        "This address does not take this method.",
        {"allowed": sorted(m.strip() for m in allowed.split(",") if m.strip())},
    )
    if allowed:
        answer["Allow"] = allowed
    return answer


# Django's own error pages (startsafe/urls.py: handler400, handler500), for what fails
# outside the API's handlers: a Host not in ALLOWED_HOSTS, or the database gone while
# a middleware (the idempotency key's statement) asks it. HTML for the console; the
# contract's body for an agent's client, which never has to parse a page.


def bad_request(request, exception):
    if request.path_info.startswith(API_PREFIX):
        return error_response(400, "invalid_request", "The request is not valid.")
    return defaults.bad_request(request, exception)


def server_error(request):
    if request.path_info.startswith(API_PREFIX):
        return internal_error_response()
    return defaults.server_error(request)
