"""The shared protocol vectors (clients/vectors/protocol.json) through the Python clients,
``Client`` and ``AsyncClient`` (one protocol core under two transports).

Each vector scripts the server's answers to what a client does in one tool call or one
logical request: every action of a recorded call, every error code of the contract,
the retries, the reconcile outcomes and the exception rule. The TypeScript client's
tests run the same file (clients/typescript/test/vectors.test.ts), so both clients
behave alike by test, not by promise. This is client logic: the answers come from an
``httpx.MockTransport``, no server and no database is involved.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import startsafe_client as ss

ROOT = Path(__file__).resolve().parent.parent
VECTORS = json.loads((ROOT / "clients" / "vectors" / "protocol.json").read_text())
HARNESS = VECTORS["harness"]
# The TypeScript runner asserts the same number: a vector added to the file must be run
# by both (clients/vectors/README.md).
VECTOR_COUNT = 48


class ToolError(Exception):
    """What a vector's tool throws when it fails on its own."""


class LookupFailed(Exception):
    """What a vector's reconcile lookup throws."""


def lower_keys(headers: dict[str, Any]) -> dict[str, Any]:
    return {name.lower(): value for name, value in headers.items()}


class Script:
    """Answers each request with the vector's next scripted answer, after checking that
    the request is the one the vector expects; the harness answers the run's own
    requests (start, tool declarations, finish)."""

    def __init__(self, steps: list[dict[str, Any]], expected_request: dict[str, Any] | None = None):
        self.steps = [(step, step.get("times", 1)) for step in steps]
        self.expected_request = expected_request
        self.requests: list[httpx.Request] = []
        self.problems: list[str] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        harness = self.harness_answer(request.method, path)
        if harness is not None:
            return response_of(harness, request)
        self.requests.append(request)
        if not self.steps:
            self.problems.append(f"unscripted request {request.method} {path}")
            return httpx.Response(599, text="unscripted", request=request)
        step, times = self.steps[0]
        self.steps = [(step, times - 1)] + self.steps[1:] if times > 1 else self.steps[1:]
        self.check(request, path, step.get("request") or self.expected_request or {})
        return response_of(step["answer"], request)

    def harness_answer(self, method: str, path: str) -> dict[str, Any] | None:
        if method != "POST":
            return None
        if path == "/runs":
            return HARNESS["run"]["answer"]
        if path == "/tools":
            return HARNESS["tools_answer"]
        if path == f"/runs/{HARNESS['run']['answer']['body']['run']['id']}/finish":
            return {"status": 200, "body": HARNESS["run"]["answer"]["body"]}
        return None

    def check(self, request: httpx.Request, path: str, expected: dict[str, Any]) -> None:
        where = f"{request.method} {path}"
        wanted = (expected.get("method", request.method), expected.get("path", path))
        if wanted != (request.method, path):
            self.problems.append(f"{where}: expected {' '.join(wanted)}")
        headers = lower_keys(dict(request.headers))
        for name, value in lower_keys(expected.get("headers") or {}).items():
            if headers.get(name) != value:
                self.problems.append(f"{where}: header {name} {headers.get(name)!r} != {value!r}")
        if expected.get("body"):
            body = json.loads(request.content)
            for name, value in expected["body"].items():
                if body.get(name) != value:
                    self.problems.append(f"{where}: body {name} {body.get(name)!r} != {value!r}")

    def left(self) -> list[str]:
        return [f"{s.get('request', {}).get('path', '?')} x{n}" for s, n in self.steps]


def response_of(answer: dict[str, Any], request: httpx.Request) -> httpx.Response:
    if answer.get("network_error"):
        raise httpx.ReadError("connection reset after the server answered", request=request)
    status, headers = answer["status"], answer.get("headers") or {}
    if "body" in answer:
        return httpx.Response(status, json=answer["body"], headers=headers, request=request)
    return httpx.Response(status, text=answer.get("text", ""), headers=headers, request=request)


class Clock:
    """A clock that moves only when the client sleeps: waits are bounded exactly."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def make_client(kind: str, script: Script, clock: Clock, told: list) -> Any:
    """The sync or the async client: the one protocol core under both transports."""
    return CLIENTS[kind](
        HARNESS["base_url"],
        HARNESS["token"],
        transport=httpx.MockTransport(script.handle),
        sleep=clock.sleep,
        clock=lambda: clock.now,
        max_retries=HARNESS["max_retries"],
        backoff=HARNESS["backoff_ms"] / 1000,
        backoff_max=HARNESS["backoff_max_ms"] / 1000,
        poll_interval=HARNESS["poll_interval_ms"] / 1000,
        poll_max_interval=HARNESS["poll_max_interval_ms"] / 1000,
        approval_timeout=HARNESS["approval_timeout_ms"] / 1000,
        on_wait=told.append,
    )


def the_tool(behaviour: dict[str, Any], ran: list):
    def perform(args: dict[str, Any]) -> Any:
        ran.append(args)
        if behaviour.get("throws") == "not_performed":
            raise ss.NotPerformed("the mail server refused the connection")
        if behaviour.get("throws"):
            raise ToolError("timed out reading the answer")
        return behaviour["returns"]

    return perform


def the_lookup(behaviour: dict[str, Any] | None, looked: list):
    if behaviour is None:
        return None

    def lookup(args: dict[str, Any], key: str | None) -> ss.Reconciliation | None:
        looked.append(args)
        if behaviour.get("throws"):
            raise LookupFailed("the provider's search is down")
        if behaviour["returns"] == "done":
            return ss.Reconciliation.done(behaviour["evidence"], behaviour.get("result"))
        if behaviour["returns"] == "not_done":
            return ss.Reconciliation.not_done(behaviour["evidence"])
        return None

    return lookup


def spec_of(call: dict[str, Any], looked: list) -> ss.ToolSpec:
    if call["kind"] == "read":
        return ss.read()
    # The harness's key rule: intent key "order" of the field id (order:<id>).
    return ss.effect(
        key=lambda a: ss.intent_key("order", id=a.get("id")),
        reconcile=the_lookup(call["reconcile"], looked),
    )


def assert_outcome(expect: dict[str, Any], raised: BaseException | None, result: Any) -> None:
    """The vector's result, or its error."""
    if "error" not in expect:
        assert raised is None, repr(raised)
        assert result == expect["result"]
        return
    assert raised is not None, f"expected {expect['error']['class']}, got {result!r}"
    assert_error(raised, expect["error"])


def assert_error(raised: BaseException, expected: dict[str, Any]) -> None:
    own = {"the tool's own": ToolError, "the lookup's own": LookupFailed}
    if expected["class"] in own:
        assert type(raised) is own[expected["class"]], raised
        return
    assert type(raised).__name__ == expected["class"], repr(raised)
    for name in ("code", "status", "details"):
        if name in expected:
            assert getattr(raised, name) == expected[name], (name, raised)
    if "for_model" in expected:
        assert raised.for_model == expected["for_model"]


CLIENTS = {"sync": ss.Client, "async": ss.AsyncClient}


def call_spec(kind: str, client: Any, run_key: str, *call: Any) -> Any:
    """``run.call_spec`` inside a run, in the client's own way."""
    if kind == "sync":
        with client.run(run_key) as run:
            return run.call_spec(*call)

    async def in_a_run() -> Any:
        async with client.run(run_key) as run:
            return await run.call_spec(*call)

    return asyncio.run(in_a_run())


def send(kind: str, client: Any, method: str, path: str, body: Any) -> httpx.Response:
    """One logical request, in the client's own way."""
    answer = client.request(method, path, json=body)
    return answer if kind == "sync" else asyncio.run(answer)


def test_every_vector_is_run_here():
    assert len(VECTORS["calls"]) + len(VECTORS["requests"]) == VECTOR_COUNT


@pytest.mark.parametrize("vector", VECTORS["calls"], ids=[v["name"] for v in VECTORS["calls"]])
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_tool_call_does_what_the_answers_say(kind, vector):
    call, expect = vector["call"], vector["expect"]
    script, clock, told, ran, looked = Script(vector["script"]), Clock(), [], [], []
    client = make_client(kind, script, clock, told)
    spec, perform = spec_of(call, looked), the_tool(call["tool"], ran)
    raised: BaseException | None = None
    result = None

    try:
        name, run_key = HARNESS["tool"]["name"], HARNESS["run"]["run_key"]
        result = call_spec(kind, client, run_key, name, spec, call["args"], perform)
    except Exception as error:  # noqa: BLE001 (the vector says which)
        raised = error

    assert (script.problems, script.left()) == ([], [])
    assert_outcome(expect, raised, result)
    assert ran == expect["tool_ran_with"]
    assert looked == expect.get("lookups", [])
    assert len(told) == expect.get("waiting_told", 0)
    # Every POST carried an Idempotency-Key; each logical request its own.
    posts = [r.headers.get("Idempotency-Key") for r in script.requests if r.method == "POST"]
    assert all(posts) and len(set(posts)) == len(posts)


@pytest.mark.parametrize(
    "vector", VECTORS["requests"], ids=[v["name"] for v in VECTORS["requests"]]
)
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_request_is_retried_or_raised_as_the_answers_say(kind, vector):
    expect = vector["expect"]
    request = vector["request"]
    script, clock = Script(vector["script"], expected_request=request), Clock()
    client = make_client(kind, script, clock, [])
    raised: BaseException | None = None
    result = None

    try:
        answer = send(kind, client, request["method"], request["path"], request["body"])
        result = answer.json()
    except ss.StartsafeError as error:
        raised = error

    assert (script.problems, script.left()) == ([], [])
    tries = expect.get("tries") or (HARNESS["max_retries"] + 1 if expect["retried"] else 1)
    assert len(script.requests) == tries
    assert len(clock.sleeps) == tries - 1
    if "sleeps_at_least_ms" in expect:
        assert min(clock.sleeps) >= expect["sleeps_at_least_ms"] / 1000
    if expect.get("one_idempotency_key"):
        keys = {r.headers.get("Idempotency-Key") for r in script.requests}
        assert len(keys) == 1 and None not in keys
    assert_outcome(expect, raised, result)
