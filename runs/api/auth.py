"""Bearer-token authentication of agents, and the contract's error body.

``agent_for_request`` is the one token lookup. The API's auth class (``AgentToken``
in runs/api/views.py, django-ninja's ``HttpBearer``) returns its agent for every endpoint,
the poll included; the idempotency middleware (runs/api/idempotency.py) calls it first
for a request with a body, so that a client without a valid token cannot make it
read one. The first call asks the database (one indexed query: ``token_hash`` is
unique) and the answer is kept on the request, so a request asks once.
"""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from runs.models import Agent, hash_token

_UNSET = object()


def bearer_token(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def agent_for_request(request: HttpRequest) -> Agent | None:
    """The active agent whose token the request carries, or None (one query, kept)."""
    found = getattr(request, "_startsafe_agent", _UNSET)
    if found is _UNSET:
        found = request._startsafe_agent = _agent_for_token(bearer_token(request))
    return found


def _agent_for_token(token: str | None) -> Agent | None:
    if token is None or len(token) > 200 or not token.isprintable():
        return None
    # The lookup is by a SHA-256 of the token: comparing hashes leaks nothing
    # useful about the token, and token_matches() double-checks in constant time.
    try:
        agent = Agent.objects.get(token_hash=hash_token(token), is_active=True)
    except Agent.DoesNotExist:
        return None
    return agent if agent.token_matches(token) else None


def error_response(
    status: int, code: str, message: str, details: dict | None = None
) -> JsonResponse:
    response = JsonResponse(
        {"error": {"code": code, "message": message, "details": details or {}}}, status=status
    )
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="startsafe"'
    return response


def internal_error_response() -> JsonResponse:
    """The 500 of the API: a bug or an outage on our side, never the client's input."""
    return error_response(500, "internal_error", "Something went wrong on our side.")
