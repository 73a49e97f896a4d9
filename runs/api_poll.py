"""The approval poll's fast path (``GET /api/v1/effects/{id}``, api.md).

Thousands of waiting agents poll all day, so the poll is built to cost little more
than reading one row by primary key (``make bench`` measures it against exactly
that, see docs/performance.md):

1. One SQL statement resolves the token and the effect together: the agent by
   ``token_hash`` (unique index), LEFT JOIN its effect by primary key. No row:
   ``401``; an agent without the effect: ``404`` (another agent's id answers
   exactly like a missing one). The statement is a constant string: building it
   with the ORM cost more CPU than PostgreSQL spent answering it.
2. The ETag (id, revision, action) is decided from the row; a match is ``304``
   before any body is built.
3. The body is built with orjson, and the JSON columns go in as the text
   PostgreSQL sent (Django loads ``jsonb`` as text) wrapped in ``orjson.Fragment``:
   never parsed into Python objects only to be serialised again.

The answer is the same ``effect_dict`` the rest of the API serialises, so the
contract has one definition.
"""

from __future__ import annotations

import hmac
from datetime import datetime
from uuid import UUID

import orjson
from django.db import connection, models
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from runs import rowsql
from runs.api_auth import active_agent_by_hash, bearer_token, error_response
from runs.lifecycle import action_for
from runs.models import Agent, Effect, hash_token
from runs.ratelimit import check_rate_limit
from runs.serialize import effect_dict

# The effect's columns as its API shape reads them (runs/serialize.py), and those
# ``action_for`` and the ETag read.
_EFFECT_COLUMNS = tuple(
    dict.fromkeys((*effect_dict.columns, "status", "approval_expires_at", "revision"))
)
_JSON_COLUMNS = frozenset(
    column
    for column in _EFFECT_COLUMNS
    if isinstance(Effect._meta.get_field(column), models.JSONField)
)

# The agent by its token's hash (runs_agent.token_hash is unique), with its effect
# by primary key if it owns it: an index lookup on each side, one round trip.
POLL_SQL = (
    "SELECT a.id, a.name, a.token_hash, "
    + ", ".join(f"e.{Effect._meta.get_field(column).column}" for column in _EFFECT_COLUMNS)
    + " FROM runs_agent a LEFT JOIN runs_effect e ON e.agent_id = a.id AND e.id = %s"
    " WHERE a.token_hash = %s AND a.is_active"
)


class EffectRow:
    """An effect read by the poll: the attributes ``effect_dict`` and ``action_for`` use.

    ``json_as_text``: the JSON columns are the database's own text (PostgreSQL's
    ``jsonb`` output), passed through to the answer as they are.
    """

    __slots__ = (*_EFFECT_COLUMNS, "pk")

    def __init__(self, values, *, json_as_text: bool) -> None:
        for column, value in zip(_EFFECT_COLUMNS, values, strict=True):
            if json_as_text and column in _JSON_COLUMNS and value is not None:
                value = orjson.Fragment(value)
            setattr(self, column, value)
        self.pk = self.id


def etag_for(effect_id, revision: int, action: str) -> str:
    return f'"{effect_id}.{revision}.{action}"'


def poll_response(request: HttpRequest, effect_id: UUID, now: datetime | None = None):
    """The whole poll: 401, 429, 404, 304 or 200 with ``{"effect", "action"}``."""
    token = bearer_token(request)
    if token is None or len(token) > 200 or not token.isprintable():
        return _unauthorized()
    digest = hash_token(token)
    row, json_as_text = _poll_row(effect_id, digest)
    # The lookup is by the hash; the constant-time comparison is the same
    # double check agent_for_request makes.
    if row is None or not hmac.compare_digest(row[2], digest):
        request._startsafe_agent = None
        return _unauthorized()
    agent = Agent(id=row[0], name=row[1], token_hash=row[2], is_active=True)
    request._startsafe_agent = agent
    check_rate_limit(request, agent)  # raises RateLimited: the API's handler answers 429
    if row[3] is None:
        return error_response(404, "not_found", "No such object for this agent.")
    effect = EffectRow(row[3:], json_as_text=json_as_text)
    action = action_for(effect, now or timezone.now())
    etag = etag_for(effect.id, effect.revision, action)
    if request.headers.get("If-None-Match") == etag:
        response = HttpResponse(status=304)
    else:
        body = orjson.dumps({"effect": effect_dict(effect), "action": action})
        response = HttpResponse(body, content_type="application/json")
    response["ETag"] = etag
    return response


def _poll_row(effect_id: UUID, digest: str) -> tuple[tuple | None, bool]:
    """(agent id, name, token hash, *the effect's columns or Nones), or None for no
    such active agent; and whether the JSON columns came back as text.

    On PostgreSQL, the constant statement above: one round trip, no ORM. Elsewhere
    (the embedded SQLite default, where ids are stored as hex text and times as
    naive text) the ORM reads the same columns and converts them: two queries.
    """
    if connection.vendor == "postgresql":
        with rowsql.cursor() as cursor:
            cursor.execute(POLL_SQL, [effect_id, digest])
            return cursor.fetchone(), True
    agent = active_agent_by_hash(digest)
    if agent is None:
        return None, False
    effect = Effect.objects.filter(pk=effect_id, agent=agent).values_list(*_EFFECT_COLUMNS).first()
    row = (agent.pk, agent.name, agent.token_hash)
    return (*row, *(effect or (None,) * len(_EFFECT_COLUMNS))), False


def _unauthorized() -> HttpResponse:
    return error_response(
        401, "unauthorized", "A valid bearer token of an active agent is required."
    )
