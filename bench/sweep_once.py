"""make bench's sweep phase, in a fresh process like a Celery worker's.

    python -m bench.sweep_once FRACTION

1. An idle sweep (no run stale): its time must not depend on how many runs exist.
2. FRACTION of the running runs made stale, then sweeps until none is left: the
   time to interrupt all of them, and the process's peak resident memory.
Prints one ``BENCH_JSON {...}`` line.
"""

from __future__ import annotations

import json
import resource
import sys
import time

import django


def main() -> None:
    django.setup()
    from django.db import connection
    from django.utils import timezone

    import startsafe.celery  # noqa: F401 - a worker's process has the Celery app loaded
    from runs.sweep import sweep

    fraction = float(sys.argv[1])
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM runs_run WHERE status = 'running'")
        running = cur.fetchone()[0]
    sweep(timezone.now())  # warm: imports, the connection, plans
    started = time.perf_counter()
    idle = sweep(timezone.now())
    idle_seconds = time.perf_counter() - started
    assert not idle.interrupted, idle.summary()

    stale = round(running * fraction)
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE runs_run SET stale_at = now() - interval '1 minute' WHERE id IN"
            " (SELECT id FROM runs_run WHERE status = 'running' AND run_key LIKE 'run-%%'"
            " ORDER BY id LIMIT %s)",
            [stale],
        )
        cur.execute("ANALYZE runs_run")
    interrupted, sweeps = 0, 0
    started = time.perf_counter()
    while True:
        report = sweep(timezone.now())
        sweeps += 1
        interrupted += len(report.interrupted)
        if not report.interrupted or sweeps > 100:
            break
    stale_seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        "BENCH_JSON "
        + json.dumps(
            {
                "running": running,
                "stale": stale,
                "idle_seconds": idle_seconds,
                "stale_seconds": stale_seconds,
                "interrupted": interrupted,
                "sweeps": sweeps,
                "errors": len(report.errors),
                "peak_rss_mb": peak,
            }
        )
    )


if __name__ == "__main__":
    main()
