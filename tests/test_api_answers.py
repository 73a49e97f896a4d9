"""The hot writes' answers (record, complete) are rendered without pydantic's
round trip (runs/api.py ``_hot_answer``): each must still be exactly what its
response schema documents, as ninja's validated output would have been."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from approvals.decisions import approve_effect
from runs.api_schemas import EffectOnlyOut, RecordOut
from tests.api_client import Api

pytestmark = pytest.mark.django_db


def _started(agent) -> tuple[Api, str]:
    api = Api(agent.token)
    return api, api.start("ticket").body["run"]["id"]


def assert_answers_schema(answer, schema: type[BaseModel], like) -> None:
    # Validated and dumped again, the body is unchanged: nothing missing, nothing
    # extra, every value of the documented type. And it is served as ninja serves
    # the endpoints it validates.
    assert schema.model_validate(answer.body).model_dump() == answer.body
    assert answer.headers["Content-Type"] == like.headers["Content-Type"]


def test_every_kind_of_record_answer_is_its_schema(agent, operator):
    api, run_id = _started(agent)
    validated = api.get(f"/runs/{run_id}")  # rendered by ninja after validation

    read = api.call(run_id, tool="lookup", kind="read", args={"id": "c-1"})
    executed = api.call(run_id, tool="reply", key="m-1", key_source="provider", args={"n": 1})
    waiting = api.call(
        run_id,
        tool="campaign.send",
        key="campaign-7",
        key_source="intent",
        args={"segment": "all"},
        needs_approval=True,
        preview="Send to everyone",
    )
    effect = waiting.body["effect"]
    approve_effect(operator, effect["id"], args_hash=effect["args_hash"], note="fine")
    replayed = api.call(
        run_id, tool="campaign.send", key="campaign-7", key_source="intent", args={"segment": "all"}
    )

    assert [a.status for a in (read, executed, waiting, replayed)] == [201] * 4
    assert [a.body["action"] for a in (read, executed, waiting, replayed)] == [
        "execute",
        "execute",
        "wait",
        "execute",
    ]
    assert read.body["effect"] is None
    assert waiting.body["effect"]["approval_expires_at"] is not None
    assert replayed.body["effect"]["decision"] is not None
    assert replayed.body["effect"]["approvals"]
    for answer in (read, executed, waiting, replayed):
        assert_answers_schema(answer, RecordOut, like=validated)


@pytest.mark.parametrize(
    ("report", "status"),
    [
        ({"outcome": "done", "result": {"sent": True, "ids": [1, 2]}}, "done"),
        ({"outcome": "failed", "error": "smtp: mailbox full"}, "failed"),
    ],
)
def test_every_kind_of_complete_answer_is_its_schema(agent, report, status):
    api, run_id = _started(agent)
    validated = api.get(f"/runs/{run_id}")
    effect = api.call(run_id, tool="reply", key="m-1", key_source="provider").body["effect"]

    answer = api.post(
        f"/effects/{effect['id']}/complete", {"run_id": run_id, "attempt": 1, **report}
    )

    assert answer.status == 200 and answer.body["effect"]["status"] == status
    assert_answers_schema(answer, EffectOnlyOut, like=validated)
