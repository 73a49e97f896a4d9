"""Bearer-token authentication of agents, and the contract's error body.

The API's one token rule: a request's agent is the active agent whose token hash
the request's token has (``token_hash_of`` and ``agents_by_token_hash``; one indexed
lookup, ``token_hash`` is unique; ``confirmed`` checks the agent found in constant
time). ``agent_for_request`` applies it for every
endpoint but the poll: the API's auth class (``AgentToken`` in runs/api/views.py,
django-ninja's ``HttpBearer``) and the idempotency middleware
(runs/api/idempotency.py), which calls it first for a request with a body, so that a
client without a valid token cannot make it read one; the answer is kept on the
request, so a request asks once. The approval poll (runs/api/poll.py) joins its
effect to the same rule's agent: token and effect in one statement.
"""

from __future__ import annotations

from django.db.models import QuerySet
from django.http import HttpRequest, JsonResponse

from runs.models import Agent, hash_token

_UNSET = object()


def bearer_token(request: HttpRequest) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_hash_of(token: str | None) -> str | None:
    """The hash an agent's token is found by, or None for a token no agent can have."""
    if token is None or len(token) > 200 or not token.isprintable():
        return None
    return hash_token(token)


def agents_by_token_hash(digest: str) -> QuerySet[Agent]:
    """The active agent whose token hash this is: at most one (``token_hash`` is
    unique). Confirm the one found with ``confirmed``."""
    return Agent.objects.filter(token_hash=digest, is_active=True)


def confirmed(agent: Agent | None, token: str) -> Agent | None:
    """The agent found by the token's hash if it is the token's, else None. The index
    compared the hashes (which tells nothing useful about a token, a SHA-256 of it);
    ``token_matches`` checks again in constant time."""
    return agent if agent is not None and agent.token_matches(token) else None


def agent_for_request(request: HttpRequest) -> Agent | None:
    """The agent of the request's bearer token, or None (one query, kept)."""
    found = getattr(request, "_startsafe_agent", _UNSET)
    if found is _UNSET:
        found = request._startsafe_agent = _agent_of(bearer_token(request))
    return found


def _agent_of(token: str | None) -> Agent | None:
    digest = token_hash_of(token)
    if digest is None:
        return None
    try:
        return confirmed(agents_by_token_hash(digest).get(), token)
    except Agent.DoesNotExist:
        return None


def error_response(
    status: int, code: str, message: str, details: dict | None = None
) -> JsonResponse:
    response = JsonResponse(
        {"error": {"code": code, "message": message, "details": details or {}}}, status=status
    )
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="startsafe"'
    return response


def unauthorized_response() -> JsonResponse:
    """The 401 of the API: no token, or none of an active agent."""
    return error_response(
        401, "unauthorized", "A valid bearer token of an active agent is required."
    )


def internal_error_response() -> JsonResponse:
    """The 500 of the API: a bug or an outage on our side, never the client's input."""
    return error_response(500, "internal_error", "Something went wrong on our side.")
