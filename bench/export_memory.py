"""The audit export's memory against its row count: it must stay flat.

    DATABASE_URL=postgres://.../startsafe_export_bench python -m bench.export_memory [SMALL LARGE]

Creates the database afresh (bench/journal_cost.py's production setup), fills the
audit log with SMALL rows (default 200,000), streams ``/history/export.csv`` and
``.ndjson`` through the view as an admin and measures, while the response is
consumed: the peak of Python's allocations (tracemalloc, its own pass) and the growth
of the process's resident set (/proc/self/statm, a pass without tracemalloc, which
also gives the time). Then fills up to LARGE rows (default 1,000,000) and measures
again. Flat means the LARGE peak is about the SMALL one. Prints ``BENCH_JSON {...}``.
tests/test_export.py runs the same measurement at a size that fits a test.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import tracemalloc

# INSERT ... SELECT over generate_series: the database makes the rows itself, a
# million in seconds (bulk_create would send each one from Python). Every tenth row
# names the run and effect given, so the export's joins have rows to find; notes and
# data vary in length, as real ones do.
FILL_SQL = """
INSERT INTO runs_auditevent
    (at, actor, actor_kind, verb, agent_id, run_id, attempt_number, effect_id,
     old_status, new_status, note, data)
SELECT now() - make_interval(secs => n),
       'agent:bench', 'agent', 'recorded', %(agent)s,
       CASE WHEN n %% 10 = 0 THEN %(run)s::uuid END,
       CASE WHEN n %% 10 = 0 THEN 1 END,
       CASE WHEN n %% 10 = 0 THEN %(effect)s::uuid END,
       'requested', 'in_flight',
       repeat('a note, "quoted"; ', (n %% 5)::int),
       jsonb_build_object('n', n, 'tags', jsonb_build_array('x', (n %% 7)::int))
FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS n
"""


def fill_audit(count: int, *, agent, run, effect, first: int = 1) -> None:
    """Insert audit rows numbered ``first`` .. ``first + count - 1`` (one statement)."""
    from django.db import connection

    params = {
        "agent": agent.pk,
        "run": str(run.pk),
        "effect": str(effect.pk),
        "first": first,
        "last": first + count - 1,
    }
    with connection.cursor() as cursor:
        cursor.execute(FILL_SQL, params)
        cursor.execute("ANALYZE runs_auditevent")


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def consume(fmt: str, user, *, trace: bool) -> dict:
    """Stream the export as ``user`` to its end; bytes, lines, seconds, and either the
    tracemalloc peak (``trace``) or the resident set's growth, in bytes."""
    from django.test import RequestFactory

    from approvals.views_export import history_export

    request = RequestFactory().get(f"/history/export.{fmt}")
    request.user = user
    size = lines = 0
    base = _rss()
    grown = 0
    if trace:
        tracemalloc.start()
        tracemalloc.reset_peak()
    started = time.perf_counter()
    response = history_export(request, fmt)
    for n, chunk in enumerate(response.streaming_content):
        size += len(chunk)
        lines += chunk.count(b"\n")
        if not trace and n % 50 == 0:
            grown = max(grown, _rss() - base)
    seconds = time.perf_counter() - started
    result = {"bytes": size, "lines": lines, "seconds": round(seconds, 2)}
    if trace:
        result["tracemalloc_peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    else:
        result["rss_growth"] = max(grown, _rss() - base)
    return result


def main() -> None:
    small, large = (
        (int(arg) for arg in sys.argv[1:3]) if len(sys.argv) > 2 else (200_000, 1_000_000)
    )
    from bench.journal_cost import production_setup

    production_setup("export-bench")
    from django.contrib.auth.models import Group, User
    from lifecycle_helpers import send, start  # tests/ on sys.path, see below

    from runs.models import Agent

    agent = Agent.objects.get(name="export-bench")
    run = start(agent, "bench-run").run
    effect = send(agent, run, key="bench:1").effect
    admin = User.objects.create_user("bench-admin")
    admin.groups.add(Group.objects.get(name="admins"))
    results = {}
    done = 0
    for target in (small, large):
        fill_audit(target - done, agent=agent, run=run, effect=effect, first=done + 1)
        done = target
        for fmt in ("csv", "ndjson"):
            traced = consume(fmt, admin, trace=True)
            plain = consume(fmt, admin, trace=False)
            results[f"{fmt}_{target}"] = {**plain, "tracemalloc_peak": traced["tracemalloc_peak"]}
            print(fmt, target, results[f"{fmt}_{target}"], flush=True)
    for fmt in ("csv", "ndjson"):
        ratio = (
            results[f"{fmt}_{large}"]["tracemalloc_peak"]
            / results[f"{fmt}_{small}"]["tracemalloc_peak"]
        )
        results[f"{fmt}_peak_ratio"] = round(ratio, 3)
    print("BENCH_JSON " + json.dumps(results))


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    main()
