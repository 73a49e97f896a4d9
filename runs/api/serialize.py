"""The contract's objects (api.md "Objects") as plain dicts, built without extra queries.

Each object is defined once, by its schema in ``runs/api/schemas.py`` (names, order,
types, what the OpenAPI document shows). A ``Shape`` reads that schema's fields and
takes each from the model attribute of the same name, converted as the model field's
type says (times as ISO 8601, UUIDs as strings); only a field whose value comes from
elsewhere names its source below. So a field added to a schema is in every answer,
the poll's one query included (``Shape.columns``, runs/api/poll.py).

The answers are built as dicts, not by pydantic's round trip through the schema:
the hot writes render them directly (runs/api/views.py ``_hot_answer``), and
tests/test_api_answers.py holds them to their schemas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Any

from django.db import models
from pydantic import BaseModel

from runs.api.schemas import AttemptOut, CallOut, EffectOut, RunOut
from runs.models import Attempt, Call, Effect, Run, Tool
from runs.registry import DECLARATION_FIELDS, effective_of, policy_of


@dataclass(frozen=True)
class Computed:
    """A field computed from the model's columns (``reads``: their attribute names)."""

    get: Callable[[Any], Any]
    reads: tuple[str, ...]


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _text(value) -> str | None:
    return str(value) if value is not None else None


def _converter(field: models.Field) -> Callable[[Any], Any] | None:
    """How the model field's value is written in JSON, if not as it is."""
    kind = field.target_field if field.is_relation else field
    if isinstance(kind, models.DateTimeField):
        return _time
    if isinstance(kind, models.UUIDField):
        return _text
    return None


class Shape:
    """One API object: its schema's fields, in order, each read from a model row.

    ``sources`` names, for a field that is not the model's attribute of the same
    name, either the attribute it is (``"current_approvals"``) or a ``Computed``.
    The row may be a model instance or anything with the same attributes (the
    poll's ``EffectRow``).
    """

    def __init__(self, schema: type[BaseModel], model: type[models.Model], **sources) -> None:
        getters: list[tuple[str, Callable[[Any], Any]]] = []
        reads: list[str] = []
        for name in schema.model_fields:
            source = sources.pop(name, name)
            if isinstance(source, Computed):
                getters.append((name, source.get))
                reads.extend(source.reads)
                continue
            field = model._meta.get_field(source)
            attname = field.attname
            convert = _converter(field)
            getters.append((name, _getter(attname, convert)))
            reads.append(attname)
        if sources:
            raise TypeError(f"{schema.__name__} has no field {sorted(sources)}")
        self.getters = tuple(getters)
        # The model's columns the object is made of, each once, in the schema's order.
        self.columns = tuple(dict.fromkeys(reads))

    def __call__(self, row) -> dict:
        return {name: get(row) for name, get in self.getters}


def _getter(attname: str, convert: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    if convert is None:
        return attrgetter(attname)  # C: most fields are read as they are
    return lambda row: convert(getattr(row, attname))


run_dict = Shape(RunOut, Run)
attempt_dict = Shape(AttemptOut, Attempt)
call_dict = Shape(CallOut, Call, attempt="attempt_number")
effect_dict = Shape(
    EffectOut,
    Effect,
    approvals="current_approvals",
    # Stored as "" when the agent sent none; the contract says null.
    preview=Computed(lambda effect: effect.preview or None, reads=("preview",)),
    # The model's property, applied to whatever row is given (the poll's too).
    claimed_by=Computed(Effect.claimed_by.fget, reads=("claimed_run_id", "claimed_attempt")),
)


def journal_of(run: Run) -> tuple[list[dict], list[dict]]:
    """The run's whole journal in order, and the effects it points to (two queries)."""
    calls = list(Call.objects.filter(run=run).order_by("attempt_number", "seq"))
    effect_ids = {call.effect_id for call in calls if call.effect_id}
    effects = Effect.objects.filter(pk__in=effect_ids).order_by("created_at") if effect_ids else []
    return [call_dict(c) for c in calls], [effect_dict(e) for e in effects]


def tool_dict(tool: Tool) -> dict:
    """The Tool object (api.md, "Additions in v1"; ``ToolOut``): the latest declaration,
    its state, the policy and the effective rule. ``tool.policy`` should come with
    the tool (``registry.with_policy``)."""
    declared = tool.declaration
    return {
        "name": tool.name,
        **{field: declared.get(field) for field in DECLARATION_FIELDS},
        "fingerprint": tool.fingerprint,
        "state": tool.state,
        "policy": policy_of(tool),
        "effective": effective_of(tool).as_dict(),
        "created_at": tool.created_at.isoformat(),
        "updated_at": tool.updated_at.isoformat(),
    }
