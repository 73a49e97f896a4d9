"""The approval poll (``GET /api/v1/effects/{id}``; api.md: "one indexed lookup, no
writes"), the agent API's one read-only fast path.

Thousands of waiting agents poll all day, so a poll is one statement and little
Python around it:

1. The token's agent, as the API's one token rule selects it (runs/api/auth.py: the
   active agent by the unique ``token_hash``), LEFT JOIN its effect by primary key.
   No row: ``401``. The agent without the effect: ``404`` (another agent's id
   answers exactly like a missing one). In between, the agent's request is counted
   for the rate limit, as every authenticated request is (runs/api/ratelimit.py).
2. The ETag (id, revision, action) is decided from the row; a match is ``304``
   before any body is built.
3. The body is built with orjson, and the JSON columns go in as the text
   PostgreSQL sent (Django loads ``jsonb`` as text) wrapped in ``orjson.Fragment``:
   never parsed into Python objects only to be serialised again.

The answer is the same ``effect_dict`` the rest of the API serialises, so the
contract has one definition.
"""

from __future__ import annotations

import functools
from datetime import datetime
from uuid import UUID

import orjson
from django.db import connection, models
from django.db.models import FilteredRelation, Q
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from runs.api.auth import (
    agents_by_token_hash,
    bearer_token,
    confirmed,
    error_response,
    token_hash_of,
    unauthorized_response,
)
from runs.api.ratelimit import rate_limit_refusal, rate_limited_response
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
_DIGEST = "<the token's hash>"


@functools.cache
def poll_sql() -> str:
    """The poll's statement on PostgreSQL: the agent's id and token hash, and the
    effect's columns; its parameters: the token's hash, the effect's id.

    Plain SQL: the ORM's form of the same join (``_poll_row`` runs it elsewhere) costs
    about 0.8 ms of CPU to build, each poll, twice what a whole poll costs with this
    constant statement (bench/poll_cost.py). Its token condition is not written here:
    it is the rule's queryset (``agents_by_token_hash``) as Django compiles it, once.
    """
    agents = agents_by_token_hash(_DIGEST).order_by().values("pk", "token_hash")
    agent_sql, params = agents.query.sql_with_params()
    if params != (_DIGEST,):  # a rule with another parameter would be frozen here
        raise RuntimeError(f"the token rule's parameters are {params!r}, not the hash alone")
    field = Effect._meta.get_field
    columns = ", ".join(f"e.{field(column).column}" for column in _EFFECT_COLUMNS)
    return (
        f"SELECT a.pk, a.token_hash, {columns} FROM ({agent_sql}) a"
        f" LEFT JOIN {Effect._meta.db_table} e"
        f" ON e.{field('agent').column} = a.pk AND e.{field('id').column} = %s"
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
    digest = token_hash_of(token)
    row, json_as_text = (None, False) if digest is None else _poll_row(digest, effect_id)
    # The agent as far as the row tells it: confirmed, its id counts the rate.
    agent = None if row is None else confirmed(Agent(id=row[0], token_hash=row[1]), token)
    if agent is None:
        return unauthorized_response()
    refusal = rate_limit_refusal(request, agent)
    if refusal is not None:
        return rate_limited_response(refusal)
    if row[2] is None:
        return error_response(404, "not_found", "No such object for this agent.")
    effect = EffectRow(row[2:], json_as_text=json_as_text)
    action = action_for(effect, now or timezone.now())
    etag = etag_for(effect.id, effect.revision, action)
    if request.headers.get("If-None-Match") == etag:
        response = HttpResponse(status=304)
    else:
        body = orjson.dumps({"effect": effect_dict(effect), "action": action})
        response = HttpResponse(body, content_type="application/json")
    response["ETag"] = etag
    return response


def _poll_row(digest: str, effect_id: UUID) -> tuple[tuple | None, bool]:
    """(the agent's id and token hash, *the effect's columns, or Nones when the agent
    has no such effect), or None when the hash is no active agent's token's; and
    whether the JSON columns came back as text.

    On PostgreSQL, ``poll_sql()``. Elsewhere (the embedded SQLite default, where ids
    are stored as hex text and times as naive text) the ORM's form of the same join,
    which converts them.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(poll_sql(), [digest, effect_id])
            return cursor.fetchone(), True
    polled = FilteredRelation("effects", condition=Q(effects__pk=effect_id))
    rows = agents_by_token_hash(digest).annotate(polled=polled)
    columns = (f"polled__{column}" for column in _EFFECT_COLUMNS)
    return rows.order_by().values_list("pk", "token_hash", *columns).first(), False
