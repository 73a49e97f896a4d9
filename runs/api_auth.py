"""Bearer-token authentication of agents, and the contract's error body.

One indexed query resolves the agent (``token_hash`` is unique); the result is
cached on the request so the idempotency middleware and the API share it.
"""

from __future__ import annotations

from django.db import connection
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
    """The active agent whose token the request carries, or None (one query, cached)."""
    cached = getattr(request, "_startsafe_agent", _UNSET)
    if cached is not _UNSET:
        return cached
    token = bearer_token(request)
    agent = None
    if token is not None and len(token) <= 200 and token.isprintable():
        # The lookup is by a SHA-256 of the token: comparing hashes leaks nothing
        # useful about the token, and token_matches() double-checks in constant time.
        candidate = active_agent_by_hash(hash_token(token))
        if candidate is not None and candidate.token_matches(token):
            agent = candidate
    request._startsafe_agent = agent
    return agent


def remember_agent(request: HttpRequest, agent: Agent | None) -> None:
    """Cache the request's agent, resolved elsewhere (the idempotency middleware)."""
    request._startsafe_agent = agent


_AGENT_FIELDS = [field.attname for field in Agent._meta.concrete_fields]
AGENT_COLUMNS = [field.column for field in Agent._meta.concrete_fields]
# Every API request runs it: a constant statement skips the ORM's query building,
# which cost more CPU than PostgreSQL's index lookup on the unique token_hash.
_AGENT_SQL = (
    f"SELECT {', '.join(AGENT_COLUMNS)} FROM {Agent._meta.db_table}"
    " WHERE token_hash = %s AND is_active"
)


def agent_from_row(row) -> Agent:
    """The agent of a row whose first columns are ``AGENT_COLUMNS`` (PostgreSQL)."""
    return Agent.from_db(connection.alias, _AGENT_FIELDS, row[: len(_AGENT_FIELDS)])


def active_agent_by_hash(digest: str) -> Agent | None:
    if connection.vendor != "postgresql":
        # The embedded SQLite default stores ids as hex text and times as naive
        # text: the ORM converts them, a raw row would not.
        return Agent.objects.filter(token_hash=digest, is_active=True).first()
    with connection.cursor() as cursor:
        cursor.execute(_AGENT_SQL, [digest])
        row = cursor.fetchone()
    return agent_from_row(row) if row is not None else None


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
