"""The hot writes' answers (record, complete) are rendered without pydantic's
round trip (runs/api/views.py ``_hot_answer``): each must still be exactly what its
response schema documents, as ninja's validated output would have been."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from approvals.decisions import approve_effect, reject_effect
from runs.api.schemas import EffectOnlyOut, RecordOut
from tests.api_client import Api

pytestmark = pytest.mark.django_db


def _started(agent) -> tuple[Api, str]:
    api = Api(agent.token)
    return api, api.start("ticket").body["run"]["id"]


def _json(value) -> str:
    # As JSON text, so that true, 1 and 1.0 differ (they are equal in Python).
    return json.dumps(value, sort_keys=True)


def assert_answers_schema(answer, schema: type[BaseModel], like) -> None:
    # Validated strictly and dumped again, the body is unchanged: nothing missing,
    # nothing extra, every value of the documented type. And it is served as ninja
    # serves the endpoints it validates.
    validated = schema.model_validate(answer.body, strict=True)
    assert _json(validated.model_dump()) == _json(answer.body)
    assert answer.headers["Content-Type"] == like.headers["Content-Type"]


def test_the_record_answers_of_every_action_but_review_are_their_schema(agent, operator):
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
    api.post(
        f"/effects/{executed.body['effect']['id']}/complete",
        {"run_id": run_id, "attempt": 1, "outcome": "done", "result": {"sent": 1.5}},
    )
    skipped = api.call(run_id, tool="reply", key="m-1", key_source="provider", args={"n": 1})
    refused = api.call(
        run_id, tool="post", key="post-1", key_source="intent", needs_approval=True
    ).body["effect"]
    reject_effect(operator, refused["id"], args_hash=refused["args_hash"], note="no", final=True)
    blocked = api.call(run_id, tool="post", key="post-1", key_source="intent")

    answers = (read, executed, waiting, replayed, skipped, blocked)
    assert [a.status for a in answers] == [201] * 6
    assert [a.body["action"] for a in answers] == [
        "execute",
        "execute",
        "wait",
        "execute",
        "skip",
        "blocked",
    ]
    assert read.body["effect"] is None
    assert waiting.body["effect"]["approval_expires_at"] is not None
    assert replayed.body["effect"]["decision"] is not None
    assert replayed.body["effect"]["approvals"]
    assert skipped.body["effect"]["result"] == {"sent": 1.5}
    for answer in answers:
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
