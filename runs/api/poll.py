"""The approval poll's fast path (``GET /api/v1/effects/{id}``, api.md).

Thousands of waiting agents poll all day, so the poll is built to cost little more
than reading one row by primary key (``make bench`` measures it against exactly
that, see docs/performance.md):

1. The token is the API's as for every endpoint (``AgentToken``, runs/api/views.py:
   ``401`` and ``429`` before this runs). The effect is read by primary key and
   agent in one constant statement: building it with the ORM cost more CPU than
   PostgreSQL spent answering it. No row: ``404`` (another agent's id answers
   exactly like a missing one).
2. The ETag (id, revision, action) is decided from the row; a match is ``304``
   before any body is built.
3. The body is built with orjson, and the JSON columns go in as the text
   PostgreSQL sent (Django loads ``jsonb`` as text) wrapped in ``orjson.Fragment``:
   never parsed into Python objects only to be serialised again.

The answer is the same ``effect_dict`` the rest of the API serialises, so the
contract has one definition.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

import orjson
from django.db import connection, models
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from runs.api.auth import error_response
from runs.api.serialize import effect_dict
from runs.lifecycle import action_for
from runs.models import Agent, Effect

# The effect's columns as its API shape reads them (runs/api/serialize.py), and those
# ``action_for`` and the ETag read.
_EFFECT_COLUMNS = tuple(
    dict.fromkeys((*effect_dict.columns, "status", "approval_expires_at", "revision"))
)
_JSON_COLUMNS = frozenset(
    column
    for column in _EFFECT_COLUMNS
    if isinstance(Effect._meta.get_field(column), models.JSONField)
)

# The agent's effect by primary key: one index lookup. Raw SQL: the one read-only
# fast path of the API (the module's docstring says why).
POLL_SQL = (
    "SELECT "
    + ", ".join(Effect._meta.get_field(column).column for column in _EFFECT_COLUMNS)
    + f" FROM {Effect._meta.db_table} WHERE id = %s AND agent_id = %s"
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
    """The poll of the request's agent (``request.auth``, set by the API's auth class):
    404, 304 or 200 with ``{"effect", "action"}``."""
    row, json_as_text = _poll_row(effect_id, request.auth)
    if row is None:
        return error_response(404, "not_found", "No such object for this agent.")
    effect = EffectRow(row, json_as_text=json_as_text)
    action = action_for(effect, now or timezone.now())
    etag = etag_for(effect.id, effect.revision, action)
    if request.headers.get("If-None-Match") == etag:
        response = HttpResponse(status=304)
    else:
        body = orjson.dumps({"effect": effect_dict(effect), "action": action})
        response = HttpResponse(body, content_type="application/json")
    response["ETag"] = etag
    return response


def _poll_row(effect_id: UUID, agent: Agent) -> tuple[tuple | None, bool]:
    """The effect's columns, or None when the agent has no such effect; and whether
    the JSON columns came back as text.

    On PostgreSQL, the constant statement above. Elsewhere (the embedded SQLite
    default, where ids are stored as hex text and times as naive text) the ORM
    reads the same columns and converts them.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(POLL_SQL, [effect_id, agent.pk])
            return cursor.fetchone(), True
    effect = Effect.objects.filter(pk=effect_id, agent=agent).values_list(*_EFFECT_COLUMNS)
    return effect.first(), False
