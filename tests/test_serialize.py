"""The API's objects are defined once, by their schemas: runs/api/serialize.py builds each
answer from its schema's fields, and the poll reads the columns those fields need."""

from __future__ import annotations

import pytest
from django.core.exceptions import FieldDoesNotExist

from runs.api import poll as api_poll
from runs.api.schemas import AttemptOut, CallOut, EffectOut, RunOut
from runs.api.serialize import Shape, attempt_dict, call_dict, effect_dict, run_dict
from runs.calls import record_call
from runs.lifecycle import start_run
from runs.models import EffectStatus, Run

pytestmark = pytest.mark.django_db


def test_every_answer_has_its_schemas_fields_in_their_order(agent):
    started = start_run(agent, "ticket")
    recorded = record_call(
        agent, started.run.pk, attempt=1, tool="reply", kind="effect", args={"n": 1},
        key="m-1", key_source="provider",
    )  # fmt: skip

    assert list(run_dict(started.run)) == list(RunOut.model_fields)
    assert list(attempt_dict(started.attempt)) == list(AttemptOut.model_fields)
    assert list(call_dict(recorded.call)) == list(CallOut.model_fields)
    assert list(effect_dict(recorded.effect)) == list(EffectOut.model_fields)


def test_the_schemas_status_values_are_the_models():
    # Taken from the TextChoices, so a new status cannot be forgotten in the contract.
    status = EffectOut.model_json_schema()["properties"]["status"]
    assert status["enum"] == EffectStatus.values


def test_the_poll_reads_every_column_the_effects_shape_reads():
    assert set(effect_dict.columns) <= set(api_poll._EFFECT_COLUMNS)
    assert {"current_approvals", "claimed_run_id", "claimed_attempt"} <= set(effect_dict.columns)


def test_a_schema_field_the_model_does_not_have_needs_a_source():
    class Extra(RunOut):
        colour: str

    with pytest.raises(FieldDoesNotExist):
        Shape(Extra, Run)
    with pytest.raises(TypeError, match="colour"):
        Shape(RunOut, Run, colour="title")
