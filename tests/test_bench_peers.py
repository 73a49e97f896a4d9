"""make bench's HTTP floor (bench/peers.py): startsafe's requests, as GETs to the baseline.

The floor is the cheapest startsafe's agent could be over HTTP, so it must send as
many requests as startsafe does, where startsafe sends them, and be in the table.
"""

from __future__ import annotations

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench import peers

DELAY = 0.02  # seconds the stand-in takes to answer


@pytest.fixture
def baseline(tmp_path, monkeypatch):
    """A loopback stand-in for the baseline's view; the paths it was asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            asked.append(self.path)
            time.sleep(DELAY)  # so that a step's milliseconds show its requests
            body = json.dumps({"id": self.path.rsplit("/", 1)[1], "status": "x", "revision": 1})
            self.send_response(200 if self.path.startswith("/baseline/") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    targets = tmp_path / "targets.txt"  # as bench/run.py writes it for read.lua
    targets.write_text('id-a "etag-a"\nid-b "etag-b"\nid-c "etag-c"\n')
    monkeypatch.setenv("BENCH_PEER_URL", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("BENCH_TARGETS", str(targets))
    yield asked
    server.shutdown()
    server.server_close()


def test_the_floor_sends_startsafes_requests_one_read_and_two_per_effect(baseline):
    agent, close = peers.SETUP["floor"]()
    try:
        calls: list[int] = []
        agent("t-1")
        calls.append(len(baseline))
        ms, steps = agent("t-2")
        calls.append(len(baseline) - calls[0])
    finally:
        close()
    # Start, the read, record + complete of each of three effects, finish.
    assert calls == [9, 9]
    # The read's request in its step, an effect's two in its; all nine in the agent.
    assert len(steps) == 4
    # Lower bounds only: a shared machine can make any request slower, never faster.
    assert steps[0] >= DELAY * 1000 and min(steps[1:]) >= 2 * DELAY * 1000
    assert ms >= 9 * DELAY * 1000
    # The load phase's ids, in turn.
    assert baseline[:4] == ["/baseline/id-a", "/baseline/id-b", "/baseline/id-c", "/baseline/id-a"]


def test_the_floors_steps_are_one_request_for_the_read_and_two_per_effect(baseline, monkeypatch):
    counts: list[int] = []
    tools = []
    for tool in peers.TOOLS:

        def counted(ticket, tool=tool):
            counts.append(len(baseline))  # requests sent before the tool is called
            return tool(ticket)

        tools.append(counted)
    monkeypatch.setattr(peers, "TOOLS", tuple(tools))
    agent, close = peers.SETUP["floor"]()
    try:
        agent("t-1")
    finally:
        close()
    # The run's start and the read's request before the read; then each effect's
    # record before its tool and its complete after it.
    assert counts == [2, 3, 5, 7]
    assert len(baseline) == 9


def test_a_floor_that_gets_no_row_fails_rather_than_measuring_a_404(baseline, monkeypatch):
    import httpx

    monkeypatch.setenv("BENCH_PEER_URL", os.environ["BENCH_PEER_URL"] + "/elsewhere")
    agent, close = peers.SETUP["floor"]()
    try:
        with pytest.raises(httpx.HTTPStatusError):
            agent("t-1")
    finally:
        close()
    assert baseline == ["/elsewhere/baseline/id-a"]


def _answers(effect: list[float]) -> dict:
    """A round's answer from a peer's worker: two agents of four steps."""
    return {"agents": [sum(effect) * 2, sum(effect) * 2], "steps": [[1.0, *effect]] * 2}


def test_the_peer_table_has_the_floor_and_its_ratios():
    got = {
        "startsafe": [_answers([20.0] * 3), _answers([24.0] * 3)],
        "floor": [_answers([10.0] * 3), _answers([8.0] * 3)],
        "dbos": [_answers([2.0] * 3), _answers([4.0] * 3)],
        "langgraph": [_answers([1.0] * 3), _answers([2.0] * 3)],
    }
    lines = peers.render(peers.summarize(got), rounds=2)
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in lines if line.startswith("| ")}
    floor = rows["HTTP floor: a minimal Django view"]
    assert floor[1] == "9.0"  # effect step p50 over both rounds
    assert floor[8] == f"{22.0 / 9.0:.2f}"  # startsafe's effect step ÷ the floor's
    assert rows["DBOS"][8] == f"{22.0 / 3.0:.2f}"
    assert rows["startsafe (HTTP)"][8] == "1.00"
    text = "\n".join(lines)
    assert "(startsafe, HTTP floor, DBOS, LangGraph)" in text
    # Round by round: startsafe over each peer, then the floor over each library.
    assert "HTTP floor 2.00, 3.00; DBOS 10.00, 6.00; LangGraph 20.00, 12.00." in text
    assert "DBOS 5.00, 2.00; LangGraph 10.00, 4.00." in text
