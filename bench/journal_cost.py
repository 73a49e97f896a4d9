"""What one journaled effect costs the database: statements, commits and rows.

    DATABASE_URL=postgres://.../startsafe_cost python -m bench.journal_cost [PAIRS]

Creates the database afresh, migrates it, starts one run and sends PAIRS (default 50)
record + complete pairs, each POST with an ``Idempotency-Key`` as the Python client
sends them, through the whole Django stack in this process (middleware included),
the way ``make bench``'s write phase sends them over HTTP. Then prints, per pair:

- statements: what Django sent (``CaptureQueriesContext``), and of them
  ``SAVEPOINT``/``RELEASE`` and the transaction's ``BEGIN``/``COMMIT`` if any;
- commits: ``pg_stat_database.xact_commit`` of this database (every transaction,
  a lone autocommit ``SELECT`` included), and the rows inserted, updated, deleted;
- WAL flushes cannot be told apart per database; each commit that wrote rows is one;
- the CPU time of this process and the wall time, over PAIRS more pairs sent without
  capturing the statements.

The same script, run on two checkouts, gives the before and after of a change to
the write path (issue 19's note). Prints one ``BENCH_JSON {...}`` line too.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import uuid

import django

COUNTERS = ("xact_commit", "tup_inserted", "tup_updated", "tup_deleted")


def _counters(cursor) -> dict[str, int]:
    # Statistics reach pg_stat_database when a backend flushes them (PostgreSQL 15:
    # at most once a second while idle); force this backend's flush, then read afresh.
    cursor.execute("SELECT pg_stat_force_next_flush()")
    cursor.execute("SELECT pg_stat_clear_snapshot()")
    columns = ", ".join(COUNTERS)
    cursor.execute(f"SELECT {columns} FROM pg_stat_database WHERE datname = current_database()")
    return dict(zip(COUNTERS, cursor.fetchone(), strict=True))


def production_setup(name: str) -> str:
    """Django as make bench serves it (production settings, no broker, no rate to
    speak of) on a fresh, migrated database at DATABASE_URL; returns the token of a
    new agent called ``name``. bench/poll_cost.py starts the same way."""
    os.environ.update(
        DJANGO_SETTINGS_MODULE="startsafe.settings",
        DEBUG="0",
        SECRET_KEY="bench-" + uuid.uuid4().hex * 2,
        ALLOWED_HOSTS="testserver",
        STARTSAFE_RATE_LIMIT="1000000000/minute",
        STARTSAFE_VAR_DIR=tempfile.mkdtemp(prefix=f"startsafe-{name}-"),
        CELERY_BROKER_URL="memory://",
        LOG_LEVEL="WARNING",
    )
    from bench.run import recreate_database

    recreate_database(os.environ["DATABASE_URL"])
    django.setup()
    from django.core.management import call_command

    from runs.models import Agent

    call_command("migrate", verbosity=0)
    agent = Agent(name=name)
    token = agent.set_new_token()
    agent.save()
    return token


def main() -> None:
    pairs = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    token = production_setup("cost-bench")
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()

    def post(path: str, body: dict, status: int) -> dict:
        response = client.post(
            "/api/v1" + path,
            json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}", "Idempotency-Key": uuid.uuid4().hex},
        )
        assert response.status_code == status, (path, response.status_code, response.content)
        return response.json()

    run_id = post("/runs", {"run_key": "cost-bench"}, 201)["run"]["id"]

    def pair(n: int) -> None:
        call = {
            "attempt": 1,
            "tool": "email.send",
            "kind": "effect",
            "key": f"cost-{n}",
            "key_source": "intent",
            "args": {"to": "customer@example.com", "n": n},
        }
        effect_id = post(f"/runs/{run_id}/calls", call, 201)["effect"]["id"]
        done = {"run_id": run_id, "attempt": 1, "outcome": "done", "result": {"sent": n}}
        post(f"/effects/{effect_id}/complete", done, 200)

    pair(-1)  # warm: imports, the connection, cached plans
    with connection.cursor() as cursor:
        # Reading the counters is itself a few transactions: measured once with
        # nothing between two readings, and taken off the pairs' count.
        first = _counters(cursor)
        before = _counters(cursor)
        reading = {k: before[k] - first[k] for k in COUNTERS}
    with CaptureQueriesContext(connection) as captured:
        for n in range(pairs):
            pair(n)
    # Read now: each request of the test client empties Django's query log.
    sqls = [q["sql"].strip().upper() for q in captured.captured_queries]
    with connection.cursor() as cursor:
        after = _counters(cursor)
    # The time of the same pairs again, without capturing (its own cost): this
    # process's CPU (Django's side of each request) and the wall clock (PostgreSQL's
    # side and the round trips too). A busy machine makes both noisy: compare
    # checkouts interleaved, not a run today with one last week.
    cpu, wall = time.process_time(), time.perf_counter()
    for n in range(pairs, 2 * pairs):
        pair(n)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall

    savepoints = sum(s.startswith(("SAVEPOINT", "RELEASE SAVEPOINT")) for s in sqls)
    result = {
        "pairs": pairs,
        "statements": len(sqls) / pairs,
        "savepoint_statements": savepoints / pairs,
        **{k: (after[k] - before[k] - reading[k]) / pairs for k in COUNTERS},
        "cpu_ms": cpu * 1000 / pairs,
        "wall_ms": wall * 1000 / pairs,
    }
    print(
        f"per record + complete pair, over {pairs} pairs with Idempotency-Key:\n"
        f"  statements sent: {result['statements']:.1f}"
        f" (of them savepoints: {result['savepoint_statements']:.1f})\n"
        f"  transactions committed: {result['xact_commit']:.2f}\n"
        f"  rows inserted {result['tup_inserted']:.2f}, updated {result['tup_updated']:.2f},"
        f" deleted {result['tup_deleted']:.2f}\n"
        f"  this process's CPU {result['cpu_ms']:.2f} ms, wall {result['wall_ms']:.2f} ms"
    )
    finish(result)


def finish(result: dict) -> None:
    """Print the machine-readable line and drop the database (bench/poll_cost.py too)."""
    from django.db import connection

    from bench.run import drop_database

    print("BENCH_JSON " + json.dumps(result))
    connection.close()
    drop_database(os.environ["DATABASE_URL"])


if __name__ == "__main__":
    main()
