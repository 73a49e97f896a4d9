"""What one approval poll (``GET /api/v1/effects/{id}``) costs in this process.

    DATABASE_URL=postgres://.../startsafe_poll_cost python -m bench.poll_cost [POLLS] [ROUNDS]

Creates the database afresh, migrates it, records one effect and polls it through the
whole Django stack (middleware included) with Django's test client, under production
settings as bench/journal_cost.py sets them. Prints the statements one poll sends
(200, 304, 404 and 401), then, over ROUNDS (default 15) rounds of POLLS (default 200)
polls answered 200 and POLLS answered 304, the median per poll of this process's CPU
and of the wall clock. The same script, run on two checkouts interleaved, gives the
before and after of a change to the poll. Prints one ``BENCH_JSON {...}`` line too.
"""

from __future__ import annotations

import json
import runpy
import statistics
import sys
import time
import uuid
from pathlib import Path

# The same start as bench/journal_cost.py's, read from the file beside this one: run
# on another checkout (runpy, its directory first on the path), this script's bench/
# is not the one that imports as ``bench``.
_journal_cost = runpy.run_path(str(Path(__file__).with_name("journal_cost.py")))
production_setup, finish = _journal_cost["production_setup"], _journal_cost["finish"]


def main() -> None:
    polls = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 15
    token = production_setup("poll-bench")
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(headers={"Authorization": f"Bearer {token}"})

    def post(path: str, body: dict) -> dict:
        response = client.post("/api/v1" + path, json.dumps(body), content_type="application/json")
        assert response.status_code in (200, 201), (path, response.status_code, response.content)
        return response.json()

    run_id = post("/runs", {"run_key": "poll-bench"})["run"]["id"]
    call = {
        "attempt": 1,
        "tool": "email.send",
        "kind": "effect",
        "key": "poll-1",
        "key_source": "intent",
        "args": {"to": "customer@example.com", "body": "x" * 200},
        "preview": "Send a mail",
    }
    effect_id = post(f"/runs/{run_id}/calls", call)["effect"]["id"]
    path = f"/api/v1/effects/{effect_id}"
    etag = client.get(path)["ETag"]

    def poll(status: int, headers: dict) -> None:
        response = client.get(path, headers=headers)
        assert response.status_code == status, (status, response.status_code, response.content)

    statements = {}
    for name, target, headers, status in (
        ("200", path, {}, 200),
        ("304", path, {"If-None-Match": etag}, 304),
        ("404", f"/api/v1/effects/{uuid.uuid4()}", {}, 404),
        ("401", path, {"Authorization": "Bearer no-such-token"}, 401),
    ):
        with CaptureQueriesContext(connection) as captured:
            response = client.get(target, headers=headers)
        assert response.status_code == status, (name, response.status_code)
        statements[name] = len(captured.captured_queries)

    for _ in range(100):  # warm: imports, the connection, cached plans
        poll(200, {})
        poll(304, {"If-None-Match": etag})
    per_poll: dict[str, list[tuple[float, float]]] = {"200": [], "304": []}
    for _ in range(rounds):
        for name, headers in (("200", {}), ("304", {"If-None-Match": etag})):
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(polls):
                poll(int(name), headers)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            per_poll[name].append((cpu * 1000 / polls, wall * 1000 / polls))

    result = {"polls": polls, "rounds": rounds, "statements": statements}
    for name, samples in per_poll.items():
        result[f"cpu_ms_{name}"] = statistics.median(cpu for cpu, _ in samples)
        result[f"wall_ms_{name}"] = statistics.median(wall for _, wall in samples)
    print(
        f"statements per poll: {statements}\n"
        f"per poll, median of {rounds} rounds of {polls}:\n"
        f"  200: CPU {result['cpu_ms_200']:.3f} ms, wall {result['wall_ms_200']:.3f} ms\n"
        f"  304: CPU {result['cpu_ms_304']:.3f} ms, wall {result['wall_ms_304']:.3f} ms"
    )
    finish(result)


if __name__ == "__main__":
    main()
