"""The client's HTTP layer: retries with back-off, one Idempotency-Key per logical POST,
and a typed exception for every error code of the contract.

Every test runs for ``Client`` and for ``AsyncClient`` (``new_client``): the rules
are the protocol core's, written once. The server is faked with
``httpx.MockTransport`` (a scripted HTTP peer, which serves both clients); the live
behaviour is in ``test_client_live.py``.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest
from startsafe_client.errors import ERRORS_BY_CODE

import startsafe_client as ss


class Script:
    """A fake peer that answers from a list, and records every request it saw."""

    def __init__(self, *answers: httpx.Response | Exception | Callable) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if callable(answer):
            return answer(request)
        return answer

    @property
    def keys(self) -> list[str | None]:
        return [r.headers.get("Idempotency-Key") for r in self.requests]


def error(status: int, code: str, **details) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"code": code, "message": f"{code}.", "details": details}}
    )


@pytest.fixture
def scripted(new_client):
    """``scripted(script, **options)``: a client of either kind talking to ``script``, and
    the list of the pauses it took (its ``sleep``)."""

    def make(script: Script, **options) -> tuple[ss.Client, list[float]]:
        slept: list[float] = []
        client = new_client(
            "http://startsafe.test/",
            "sst_secret",
            transport=httpx.MockTransport(script),
            sleep=slept.append,
            **options,
        )
        return client, slept

    return make


def test_a_post_carries_an_idempotency_key_and_the_bearer_token(scripted):
    script = Script(httpx.Response(201, json={"ok": True}))
    client, _ = scripted(script)

    assert client.post("/runs", {"run_key": "t-1"}) == {"ok": True}

    request = script.requests[0]
    assert request.url == "http://startsafe.test/api/v1/runs"
    assert request.headers["Authorization"] == "Bearer sst_secret"
    assert len(request.headers["Idempotency-Key"]) == 36  # a uuid4
    assert json.loads(request.content) == {"run_key": "t-1"}


def test_a_base_url_ending_in_the_api_prefix_is_accepted(scripted, new_client):
    script = Script(httpx.Response(200, json={}))
    client, _ = scripted(script)
    client2 = new_client(
        "http://startsafe.test/api/v1/", "t", transport=httpx.MockTransport(script)
    )

    client2.get("/runs")

    assert client.base_url == client2.base_url == "http://startsafe.test"
    assert script.requests[0].url.path == "/api/v1/runs"


def test_a_get_carries_no_idempotency_key(scripted):
    script = Script(httpx.Response(200, json={"items": [], "next_cursor": None}))
    client, _ = scripted(script)

    client.list_runs(run_key="t-1", status=None)

    assert script.keys == [None]
    assert dict(script.requests[0].url.params) == {"run_key": "t-1"}


def test_a_network_error_is_retried_with_the_same_idempotency_key(scripted):
    script = Script(
        httpx.ConnectError("refused"),
        httpx.ReadTimeout("lost the answer"),
        httpx.Response(201, json={"ok": True}),
    )
    client, slept = scripted(script)

    assert client.post("/runs/r/calls", {"attempt": 1}) == {"ok": True}

    # One logical request: every try repeats its key, so the server records it once.
    assert len(script.requests) == 3
    assert len(set(script.keys)) == 1
    assert len(slept) == 2


def test_a_5xx_is_retried_and_two_logical_posts_get_two_keys(scripted):
    script = Script(
        httpx.Response(502, text="bad gateway"),
        httpx.Response(200, json={"n": 1}),
        httpx.Response(200, json={"n": 2}),
    )
    client, _ = scripted(script)

    client.post("/runs/r/heartbeat", {"attempt": 1})
    client.post("/runs/r/heartbeat", {"attempt": 1})

    assert script.keys[0] == script.keys[1]
    assert script.keys[1] != script.keys[2]


def test_back_off_grows_exponentially_up_to_its_cap(scripted):
    script = Script(*[httpx.ConnectError("down")] * 6)
    client, slept = scripted(script, max_retries=5, backoff=1.0, backoff_max=4.0)

    with pytest.raises(ss.ServiceUnavailable):
        client.post("/runs", {"run_key": "t"})

    # Jitter keeps each delay between half and all of 1, 2, 4, 4, 4 seconds.
    for delay, ceiling in zip(slept, [1, 2, 4, 4, 4], strict=True):
        assert ceiling / 2 <= delay <= ceiling


def test_retries_running_out_raise_service_unavailable_with_the_last_status(scripted):
    script = Script(*[httpx.Response(503, text="down")] * 3)
    client, _ = scripted(script, max_retries=2)

    with pytest.raises(ss.ServiceUnavailable) as raised:
        client.get("/runs")

    assert raised.value.status == 503
    assert raised.value.code == "unavailable"
    assert len(script.requests) == 3


def test_a_4xx_is_never_retried(scripted):
    script = Script(error(409, "key_conflict", tool="send_reply"))
    client, slept = scripted(script)

    with pytest.raises(ss.KeyConflict) as raised:
        client.post("/runs/r/calls", {"attempt": 1})

    assert len(script.requests) == 1
    assert slept == []
    assert raised.value.tool == "send_reply"
    assert raised.value.status == 409


def test_request_in_progress_is_retried_after_a_pause_with_the_same_key(scripted):
    script = Script(
        error(409, "request_in_progress"),
        httpx.Response(201, json={"ok": True}),
    )
    client, slept = scripted(script)

    assert client.post("/runs", {"run_key": "t"}) == {"ok": True}
    assert script.keys[0] == script.keys[1]
    assert len(slept) == 1


def test_request_in_progress_is_raised_when_retries_run_out(scripted):
    script = Script(*[error(409, "request_in_progress")] * 2)
    client, _ = scripted(script, max_retries=1)

    with pytest.raises(ss.RequestInProgress):
        client.post("/runs", {"run_key": "t"})


def rate_limited(retry_after: int) -> httpx.Response:
    answer = error(429, "rate_limited", limit=600, period=60, retry_after=retry_after)
    answer.headers["Retry-After"] = str(retry_after)
    return answer


def test_a_429_is_retried_after_the_servers_retry_after_with_the_same_key(scripted):
    script = Script(rate_limited(7), httpx.Response(201, json={"ok": True}))
    client, slept = scripted(script, backoff=0.1, backoff_max=30)

    assert client.post("/runs", {"run_key": "t"}) == {"ok": True}
    assert script.keys[0] == script.keys[1]
    # Retry-After, not the 0.1 s back-off: coming back sooner would be refused again.
    assert slept == [7.0]


def test_a_429_wait_is_capped_by_backoff_max(scripted):
    script = Script(rate_limited(3600), httpx.Response(200, json={"ok": True}))
    client, slept = scripted(script, backoff_max=5)

    client.get("/runs")
    assert slept == [5.0]


def test_rate_limited_is_raised_with_the_advice_when_retries_run_out(scripted):
    script = Script(*[rate_limited(2)] * 3)
    client, slept = scripted(script, max_retries=2, backoff=0.01)

    with pytest.raises(ss.RateLimited) as raised:
        client.post("/runs", {"run_key": "t"})
    assert raised.value.retry_after == 2.0 and raised.value.status == 429
    assert slept == [2.0, 2.0]
    assert len(set(script.keys)) == 1


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "invalid_request", ss.InvalidRequest),
        (401, "unauthorized", ss.Unauthorized),
        (404, "not_found", ss.NotFound),
        (409, "already_running", ss.AlreadyRunning),
        (409, "restart_blocked", ss.RestartBlocked),
        (409, "run_finished", ss.RunFinished),
        (409, "attempt_superseded", ss.AttemptSuperseded),
        (409, "key_conflict", ss.KeyConflict),
        (409, "claim_conflict", ss.ClaimConflict),
        (422, "idempotency_key_reused", ss.IdempotencyKeyReused),
        (413, "payload_too_large", ss.PayloadTooLarge),
    ],
)
def test_every_error_code_of_the_contract_has_its_exception(status, code, cls, scripted):
    script = Script(error(status, code, field="x"))
    client, _ = scripted(script)

    with pytest.raises(cls) as raised:
        client.post("/runs", {"run_key": "t"})

    assert isinstance(raised.value, ss.StartsafeError)
    assert (raised.value.code, raised.value.status) == (code, status)
    assert raised.value.details == {"field": "x"}
    assert ERRORS_BY_CODE[code] is cls


def test_the_typed_details_are_at_hand():
    verdict = {"safe": False, "policy": "keyed", "blocking": [], "notes": []}
    blocked = ss.errors.error_from_answer(
        409,
        {"error": {"code": "restart_blocked", "message": "no", "details": {"verdict": verdict}}},
    )
    running = ss.errors.error_from_answer(
        409,
        {
            "error": {
                "code": "already_running",
                "message": "busy",
                "details": {"attempt": 2, "heartbeat_at": "2026-01-01T00:00:00+00:00"},
            }
        },
    )
    invalid = ss.errors.error_from_answer(
        400,
        {"error": {"code": "invalid_request", "message": "bad", "details": {"fields": {"a": 1}}}},
    )

    assert blocked.verdict == verdict
    assert (running.attempt, running.heartbeat_at) == (2, "2026-01-01T00:00:00+00:00")
    assert invalid.fields == {"a": 1}
    assert isinstance(
        ss.errors.error_from_answer(409, {"error": {"code": "run_finished"}}), ss.AttemptStopped
    )


def test_an_answer_without_the_error_body_is_still_a_startsafe_error(scripted):
    script = Script(httpx.Response(404, text="<html>not here</html>"))
    client, _ = scripted(script)

    with pytest.raises(ss.StartsafeError) as raised:
        client.get("/nowhere")

    assert raised.value.code == "unexpected"
    assert raised.value.status == 404


def test_a_poll_sends_if_none_match_and_reads_a_304_as_unchanged(scripted):
    script = Script(
        httpx.Response(
            200, json={"effect": {"id": "e"}, "action": "wait"}, headers={"ETag": '"7"'}
        ),
        httpx.Response(304),
    )
    client, _ = scripted(script)

    first, etag = client.poll_effect("e", None)
    second, etag2 = client.poll_effect("e", etag)

    assert first == {"effect": {"id": "e"}, "action": "wait"}
    assert second is None
    assert etag == etag2 == '"7"'
    assert "If-None-Match" not in script.requests[0].headers
    assert script.requests[1].headers["If-None-Match"] == '"7"'
