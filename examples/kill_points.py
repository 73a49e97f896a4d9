"""``--kill-at POINT[:TOOL]``: the example kills itself with SIGKILL at one point of the protocol.

The fault tests (``tests/test_fault_agent_kill.py``) use it to prove that a process
dying anywhere loses nothing and repeats nothing. The points are defined by the
HTTP traffic, so they are exact whatever the model's plan:

- ``before-record:TOOL`` — just before the call to TOOL is recorded: nothing of it
  reached the server;
- ``after-record:TOOL`` — the server answered ``execute`` for TOOL's effect (it is
  claimed, in flight) and the process dies before running it;
- ``after-execute:TOOL`` — TOOL ran (it is in the ledger) and the process dies just
  before reporting it complete: the worst moment;
- ``heartbeat`` — during a heartbeat (the server got it, the answer is not read),
  once at least one effect was completed;
- ``waiting-approval`` — while polling an effect that waits for a person.

SIGKILL, not an exception or ``sys.exit``: no ``finally``, no ``atexit``, no last
report. That is what the OOM killer or a recycled machine does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any

import httpx

POINTS = ("before-record", "after-record", "after-execute", "heartbeat", "waiting-approval")
TOOL_POINTS = ("before-record", "after-record", "after-execute")


def parse_kill_point(text: str) -> tuple[str, str | None]:
    """``"after-record:send_reply"`` → ``("after-record", "send_reply")``."""
    point, _, tool = text.partition(":")
    if point not in POINTS:
        raise ValueError(f"unknown kill point {point!r}: one of {', '.join(POINTS)}")
    if point in TOOL_POINTS and not tool:
        raise ValueError(f"{point} names a tool: {point}:TOOL")
    return point, tool or None


def die(where: str) -> None:
    print(f"!! SIGKILL {where}", flush=True)
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt(httpx.BaseTransport):
    """The real transport, watching the protocol go by and dying at the chosen point."""

    def __init__(self, point: str, tool: str | None = None) -> None:
        self.inner = httpx.HTTPTransport()
        self.point, self.tool = point, tool
        self.effect_tools: dict[str, str] = {}  # effect id -> tool, from the answers
        self.completed = 0
        self.lock = threading.Lock()  # the heartbeat thread shares the transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        body: dict[str, Any] = {}
        if request.method == "POST" and request.content:
            body = json.loads(request.content)
        calls = path.endswith("/calls")
        if self.point == "before-record" and calls and body.get("tool") == self.tool:
            die(f"before recording {self.tool}")
        if self.point == "after-execute" and path.endswith("/complete"):
            effect_id = path.rstrip("/").split("/")[-2]
            if self.effect_tools.get(effect_id) == self.tool and body.get("outcome") == "done":
                die(f"after executing {self.tool}, before reporting it")

        response = self.inner.handle_request(request)
        response.read()
        answer = _json(response)
        effect = answer.get("effect") if isinstance(answer, dict) else None
        with self.lock:
            if isinstance(effect, dict) and effect.get("id"):
                self.effect_tools[effect["id"]] = effect.get("tool", "")
            if path.endswith("/complete") and response.status_code == 200:
                self.completed += 1
            completed = self.completed

        action = answer.get("action") if isinstance(answer, dict) else None
        tool = effect.get("tool") if isinstance(effect, dict) else None
        if self.point == "after-record" and action == "execute" and tool == self.tool:
            die(f"after {self.tool} was recorded and claimed, before running it")
        if self.point == "heartbeat" and path.endswith("/heartbeat") and completed >= 1:
            die("during a heartbeat (sent, answer unread)")
        polled = request.method == "GET" and "/effects/" in path
        waiting = response.status_code == 304 or action == "wait"
        if self.point == "waiting-approval" and polled and waiting:
            die("while waiting for a person's approval")
        return response

    def close(self) -> None:
        self.inner.close()


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
