"""The Idempotency-Key header on every POST (api.md, "Request idempotency")."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from runs.api.idempotency import prune_idempotent_requests
from runs.models import Call, IdempotentRequest, Run
from tests.api_client import Api

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(agent) -> Api:
    return Api(agent.token)


def test_a_repeated_request_gets_the_first_answer_and_changes_nothing(api):
    first = api.post("/runs", {"run_key": "t"}, headers={"Idempotency-Key": "start-1"})
    # Same body with other whitespace and key order: compared as canonical JSON.
    again = api.post("/runs", raw=b'{ "run_key" : "t" }', headers={"Idempotency-Key": "start-1"})
    assert first.status == again.status == 201
    assert again.body == first.body
    assert again.headers["Idempotent-Replayed"] == "true"
    assert Run.objects.count() == 1


def test_a_retried_call_is_recorded_once(api):
    run_id = api.start("t").body["run"]["id"]
    body = {
        "attempt": 1,
        "tool": "reply",
        "kind": "effect",
        "args": {"b": 1},
        "key": "m",
        "key_source": "provider",
    }
    first = api.post(f"/runs/{run_id}/calls", body, headers={"Idempotency-Key": "call-1"})
    again = api.post(f"/runs/{run_id}/calls", body, headers={"Idempotency-Key": "call-1"})
    assert first.body["action"] == again.body["action"] == "execute"
    assert Call.objects.filter(run_id=run_id).count() == 1


def test_an_error_answer_is_kept_too(api):
    first = api.post("/runs", {"run_key": 5}, headers={"Idempotency-Key": "bad-1"})
    again = api.post("/runs", {"run_key": 5}, headers={"Idempotency-Key": "bad-1"})
    assert first.status == again.status == 400 and again.body == first.body


def test_the_same_key_with_another_body_is_idempotency_key_reused(api):
    api.post("/runs", {"run_key": "t"}, headers={"Idempotency-Key": "k"})
    answer = api.post("/runs", {"run_key": "u"}, headers={"Idempotency-Key": "k"})
    assert answer.status == 422 and answer.code == "idempotency_key_reused"
    assert Run.objects.count() == 1


def test_a_claim_row_of_the_earlier_design_is_request_in_progress_within_its_lease(api, agent):
    """Rows the earlier design claimed before the work still count as in progress
    until their lease lapses (runs/api/idempotency.py). Two real concurrent requests:
    tests/test_api_idempotency_lock.py."""
    now = timezone.now()
    IdempotentRequest.objects.create(
        agent=agent,
        key="busy",
        method="POST",
        path="/api/v1/runs",
        request_hash=_fingerprint({"run_key": "t"}),
        created_at=now,
        locked_until=now + timedelta(seconds=60),
    )
    answer = api.post("/runs", {"run_key": "t"}, headers={"Idempotency-Key": "busy"})
    assert answer.status == 409 and answer.code == "request_in_progress"
    assert Run.objects.count() == 0


def test_a_request_that_died_frees_its_key_after_its_lease(api, agent):
    past = timezone.now() - timedelta(seconds=61)
    IdempotentRequest.objects.create(
        agent=agent,
        key="dead",
        method="POST",
        path="/api/v1/runs",
        request_hash=_fingerprint({"run_key": "t"}),
        created_at=past,
        locked_until=past,
    )
    answer = api.post("/runs", {"run_key": "t"}, headers={"Idempotency-Key": "dead"})
    assert answer.status == 201
    assert IdempotentRequest.objects.get(key="dead").response_status == 201


def test_keys_are_per_agent(api, other_agent):
    api.post("/runs", {"run_key": "t"}, headers={"Idempotency-Key": "shared"})
    other = Api(other_agent.token)
    answer = other.post("/runs", {"run_key": "other"}, headers={"Idempotency-Key": "shared"})
    assert answer.status == 201


def test_an_invalid_key_is_invalid_request(api):
    answer = api.post("/runs", {"run_key": "t"}, headers={"Idempotency-Key": "x" * 256})
    assert answer.status == 400 and answer.code == "invalid_request"


def test_answers_older_than_a_day_are_pruned(api, agent):
    api.post("/runs", {"run_key": "t"}, headers={"Idempotency-Key": "old"})
    assert prune_idempotent_requests(timezone.now() + timedelta(hours=23)) == 0
    assert prune_idempotent_requests(timezone.now() + timedelta(hours=25)) == 1


def _fingerprint(body: dict) -> str:
    import json

    from runs.api.idempotency import request_fingerprint

    return request_fingerprint("POST", "/api/v1/runs", json.dumps(body).encode())


class _UnreadBody:
    """A request body that fails the test if anyone reads it (wsgi.input)."""

    def __init__(self) -> None:
        self.read_from = False

    def read(self, *args):
        self.read_from = True
        raise AssertionError("the body was read")

    readline = read


def _post_unread(path: str, headers: dict) -> tuple[int, bool]:
    """POST ``path`` with a 100-byte body that must not be read: (status, was it read)."""
    body = _UnreadBody()
    response = Client(raise_request_exception=False).post(
        "/api/v1" + path,
        data=b"{" + b" " * 98 + b"}",
        content_type="application/json",
        headers=headers,
        **{"wsgi.input": body},
    )
    return response.status_code, body.read_from


@pytest.mark.parametrize("token", [None, "ss_wrong"])
@pytest.mark.parametrize("key", [None, "start-1"])
def test_without_a_valid_token_the_answer_is_401_before_the_body_is_read(agent, token, key):
    # A client that sends its body slowly holds a sync worker only while the body is
    # read: a client without a token must not get that far (issue 15, item 2).
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if key is not None:
        headers["Idempotency-Key"] = key
    assert _post_unread("/runs", headers) == (401, False)


@pytest.mark.parametrize("key", [None, "start-1"])
def test_with_a_valid_token_the_body_is_read(agent, key):
    # The harness above sees a read when there is one.
    headers = {"Authorization": f"Bearer {agent.token}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    _, read_from = _post_unread("/runs", headers)
    assert read_from
