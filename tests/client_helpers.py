"""Both clients from plain test code, so a test of the protocol core runs once per client;
and a scripted peer to talk to.

A test that holds for ``Client`` and ``AsyncClient`` alike (retries, each answer,
the exception rule) takes the ``new_client`` fixture: parametrized over both, it
makes a ``Client``, or an ``AsyncClient`` wrapped in :class:`Blocking`, which runs
every coroutine the client (or its run) returns on one event loop per test and
enters ``async with`` for ``with``. The test body reads the same for both.

:class:`Peer` fakes the server for either client (``httpx.MockTransport`` serves
both), answering each ``"METHOD /path"`` from a queue.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import startsafe_client as ss

CLIENTS = ("sync", "async")


class Blocking:
    """An ``AsyncClient`` (or an ``AsyncRun`` it made) driven from plain code on ``runner``."""

    def __init__(self, target: Any, runner: asyncio.Runner) -> None:
        self._target = target
        self._runner = runner

    @property
    def target(self) -> Any:
        """The ``AsyncClient`` or ``AsyncRun`` itself."""
        return self._target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value) or isinstance(value, ss.Tool):
            return value

        @functools.wraps(value)
        def blocking(*args: Any, **kwargs: Any) -> Any:
            result = value(*args, **kwargs)
            if inspect.iscoroutine(result):
                result = self._runner.run(result)
            if isinstance(result, ss.AsyncRun):
                return Blocking(result, self._runner)
            return result

        return blocking

    def __enter__(self) -> Blocking:
        self._runner.run(self._target.__aenter__())
        return self

    def __exit__(self, *exc: Any) -> bool:
        return self._runner.run(self._target.__aexit__(*exc))


@pytest.fixture(params=CLIENTS)
def client_kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def new_client(client_kind: str) -> Iterator[Callable[..., Any]]:
    """``new_client(base_url, token, **options)``: a ``Client``, or a blocking ``AsyncClient``."""
    made: list[Any] = []
    with asyncio.Runner() as runner:

        def make(*args: Any, **options: Any) -> Any:
            if client_kind == "sync":
                client = ss.Client(*args, **options)
            else:
                client = Blocking(ss.AsyncClient(*args, **options), runner)
            made.append(client)
            return client

        yield make
        for client in made:
            client.aclose() if isinstance(client, Blocking) else client.close()


# --- A scripted peer ------------------------------------------------------------

RUN = {"id": "run-1", "run_key": "t-1", "heartbeat_timeout": 60, "status": "running"}


def started(attempt: int = 1) -> dict:
    return {
        "run": {**RUN, "current_attempt": attempt},
        "attempt": {"number": attempt, "status": "running"},
        "verdict": {"safe": True, "policy": "keyed", "blocking": [], "notes": []},
        "journal": [],
        "effects": [],
    }


def effect(status: str, **fields) -> dict:
    return {"id": "eff-1", "status": status, "args": {"text": "recorded"}, "result": None} | fields


def call_answer(action: str, eff: dict | None) -> dict:
    return {"call": {"id": "c", "seq": 1, "action": action}, "action": action, "effect": eff}


class Peer:
    """Answers by ``"METHOD /path"`` from queues (the last answer repeats); records requests."""

    def __init__(self, **routes: list) -> None:
        self.routes = {k.replace("__", " /").replace("_", "/"): v for k, v in routes.items()}
        self.seen: list[tuple[str, str, dict | None, httpx.Request]] = []

    def on(self, route: str, *answers) -> Peer:
        self.routes[route] = list(answers)
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path.removeprefix("/api/v1")
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, path, body, request))
        if f"{request.method} {path}" == "POST /tools" and "POST /tools" not in self.routes:
            # The declaration before a process's first call, answered as the registry does.
            return httpx.Response(200, json={"tools": [dict(t) for t in body["tools"]]})
        queue = self.routes[f"{request.method} {path}"]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, httpx.Response):
            return answer
        status, payload = answer
        return httpx.Response(status, json=payload)

    def bodies(self, method: str, path: str) -> list[dict | None]:
        return [b for m, p, b, _ in self.seen if (m, p) == (method, path)]


def refusal(code: str, **details) -> tuple[int, dict]:
    return 409, {"error": {"code": code, "message": code, "details": details}}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def client_options(peer: Peer, **options) -> dict:
    clock = FakeClock()
    return {
        "transport": httpx.MockTransport(peer),
        "sleep": clock.sleep,
        "clock": clock,
        "poll_interval": 1.0,
        **options,
    }


def base_peer() -> Peer:
    return (
        Peer()
        .on("POST /runs", (201, started()))
        .on("POST /runs/run-1/finish", (200, {"run": {**RUN, "status": "completed"}}))
        .on("POST /runs/run-1/heartbeat", (200, {"run": RUN}))
    )
