"""make bench: seed a database at scale, serve it with gunicorn, measure, report.

    python -m bench.run [--scale 1] [--duration 5] [--rounds 6] [--keep]

1. Creates its own database (``startsafe_bench``, or the one ``DATABASE_URL``
   names), migrates it and seeds it (``bench/seed.py``).
2. Starts gunicorn as in production (sync workers, ``DEBUG=0``, a ``SECRET_KEY``)
   on loopback, and beside it, with the same flags on the same database, the
   baseline: a separate minimal Django project (``bench/baseline/``).
3. Loads them with ``wrk`` (``bench/lua/``): the baseline, the poll (200), the poll
   with ``If-None-Match`` (304), and record + complete; interleaved in rounds, so
   the noise of a shared machine hits all of them alike, and reported as ratios.
4. Runs the same four-step agent through startsafe (over HTTP, on that server),
   its HTTP floor (the same requests to the baseline), DBOS and LangGraph (each on
   a database of its own on the same PostgreSQL), in interleaved rounds
   (``bench/peers.py``).
5. Times the console's pages in-process (Django's test client) with their query
   counts, then the sweep in a fresh process with its peak memory.
6. Writes the table into ``docs/performance.md`` and drops the databases.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench import peers

ROOT = Path(__file__).resolve().parent.parent
LUA = Path(__file__).resolve().parent / "lua"
VENV_BIN = Path(sys.executable).parent
DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/startsafe_bench"
REPORT = ROOT / "docs" / "performance.md"
START, END = "<!-- bench:results:start -->", "<!-- bench:results:end -->"


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- The database --------------------------------------------------------------


def _admin_dsn(url: str) -> tuple[str, str]:
    """A DSN for the server's ``postgres`` database, and the bench database's name."""
    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    if not name or name in ("postgres", "template1"):
        raise SystemExit(f"refusing to use {name!r} as the bench database")
    admin = urlunsplit(parts._replace(scheme="postgresql", path="/postgres"))
    return admin, name


def recreate_database(url: str) -> None:
    import psycopg

    admin, name = _admin_dsn(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def drop_database(url: str) -> None:
    import psycopg

    admin, name = _admin_dsn(url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def psycopg_dsn(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(scheme="postgresql"))


# --- The server ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def peak_rss_mb(pid: int) -> float:
    """The process's high-water mark of resident memory (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def start_server(env: dict, port: int, workers: int, app: str) -> subprocess.Popen:
    """gunicorn serving ``app``; the project and the baseline get the same flags."""
    server = subprocess.Popen(
        [
            str(VENV_BIN / "gunicorn"),
            app,
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--worker-class",
            "sync",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
    )
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            # Any answer will do (the baseline answers /healthz with a 404).
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code < 600:
                return server
        except httpx.HTTPError:
            time.sleep(0.3)
    server.terminate()
    raise SystemExit("gunicorn did not start")


# --- Load --------------------------------------------------------------------------


def wrk(script: str, base: str, duration: float, threads: int, conns: int, env: dict) -> dict:
    command = [
        "wrk",
        f"-t{threads}",
        f"-c{conns}",
        f"-d{max(1, round(duration))}s",
        "--timeout",
        "10s",
        "-s",
        str(LUA / script),
        base,
    ]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    match = re.search(r"^BENCH_JSON (.*)$", out, re.M)
    if match is None:
        raise SystemExit(f"wrk gave no summary:\n{out}")
    result = json.loads(match.group(1))
    failed = result["errors"] + result.get("failures", 0)
    if failed:
        # Throughput counts every answer: a refused or failed request must not count.
        raise SystemExit(f"{script}: {failed} requests failed or were refused:\n{out}")
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def ensure_wrk() -> None:
    if shutil.which("wrk"):
        return
    if os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True)
        return
    raise SystemExit("make bench needs wrk: sudo apt-get install -y wrk")


# --- The console and the sweep (in-process / in a fresh process) ----------------


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[index]


def measure_console(seeded, repeat: int) -> list[dict]:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from startsafe.startup import freeze_startup_objects

    # As a web worker does when it loads the app (startsafe/wsgi.py): before any
    # console page has compiled its templates.
    freeze_startup_objects()
    user_model = get_user_model()
    operator, _ = user_model.objects.get_or_create(username="bench-operator")
    group = Group.objects.filter(name="operators").first()
    if group is not None:
        operator.groups.add(group)
    client = Client()
    client.force_login(operator)
    html = client.get("/").content.decode()
    fingerprint = html.split("?fp=")[1].split('"')[0] if "?fp=" in html else ""
    pages = [
        ("queue", "/", {}),
        ("queue poll, unchanged (htmx)", f"/?fp={fingerprint}", {"HX-Request": "true"}),
        ("runs list", "/runs/", {}),
        ("runs list, page 50", "/runs/?page=50", {}),
        ("runs, filtered: interrupted", "/runs/?status=interrupted", {}),
        ("runs, filtered: verdict blocked", "/runs/?verdict=blocked", {}),
        ("runs, searched: 'task 4242'", "/runs/?q=task+4242", {}),
        ("runs, filtered by agent + searched", "/runs/?agent=bench-agent-00&q=refund", {}),
        ("run page (30 calls)", f"/runs/{seeded.detail_run}/", {}),
        ("effect page (awaiting)", f"/effects/{seeded.detail_effect}/", {}),
        ("insights, last 30 days", "/insights/", {}),
    ]
    for _, path, headers in pages:
        client.get(path, headers=headers)  # warm: templates compiled, caches filled
    # Round robin over the pages, as the load phase interleaves its paths: a busy
    # second of the shared machine lands on every page alike, not on one.
    times: dict[str, list[float]] = {name: [] for name, _, _ in pages}
    counts: dict[str, set] = {name: set() for name, _, _ in pages}
    statuses: dict[str, int] = {}
    for _ in range(repeat):
        for name, path, headers in pages:
            # The log keeps 9,000 queries; once full, a capture would count none.
            connection.queries_log.clear()
            with CaptureQueriesContext(connection) as ctx:
                started = time.perf_counter()
                response = client.get(path, headers=headers)
                times[name].append((time.perf_counter() - started) * 1000)
            counts[name].add(len(ctx))
            statuses[name] = response.status_code
    results = []
    for name, path, _ in pages:
        results.append(
            {
                "page": name,
                "path": path,
                "status": statuses[name],
                "p50_ms": statistics.median(times[name]),
                "p99_ms": percentile(times[name], 99),
                "max_ms": max(times[name]),
                "queries": sorted(counts[name]),
            }
        )
        log(f"  {name}: p50 {results[-1]['p50_ms']:.1f} ms, queries {sorted(counts[name])}")
    return results


def measure_sweep(env: dict, stale_fraction: float) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "bench.sweep_once", str(stale_fraction)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    match = re.search(r"^BENCH_JSON (.*)$", out.stdout, re.M)
    if match is None:
        raise SystemExit(f"the sweep failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(match.group(1))


# --- The report ----------------------------------------------------------------------


def machine(url: str) -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024 // 1024
    import psycopg

    admin, _ = _admin_dsn(url)
    with psycopg.connect(admin) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0].split()[0]
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, PostgreSQL {server} "
        "on the same machine"
    )


def render(results: dict) -> str:
    load = results["load"]
    base = load["baseline"]
    lines = [
        f"Measured {results['date']} with `{results['command']}` "
        f"(scale {results['scale']}: {results['seeded']['runs']:,} runs, "
        f"{results['seeded']['effects']:,} effects, {results['seeded']['calls']:,} calls, "
        f"{results['seeded']['awaiting']:,} awaiting approval; seeded in "
        f"{results['seed_seconds']:.0f} s).",
        "",
        f"Machine: {results['machine']}. gunicorn {results['workers']} sync workers, "
        f"wrk {results['wrk']}, {results['rounds']} interleaved rounds of "
        f"{results['duration']:.0f} s per path (medians of the rounds). Load average of "
        f"the machine after the load phase: {results['loadavg'][0]:.1f} (1 min), "
        f"{results['loadavg'][1]:.1f} (5 min): other work shared the 2 cores.",
        "",
        "| path | req/s | ratio to baseline | p50 ms | p99 ms | p99 ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    names = {
        "baseline": "baseline: a minimal Django project, one row by primary key",
        "poll": "poll `GET /api/v1/effects/{id}` → 200",
        "poll304": "poll with `If-None-Match` → 304",
        "write": "record a keyed call + complete it (requests)",
        "write_bare": "record + complete without `Idempotency-Key` headers (requests)",
    }

    def row(label: str, rps: float, p50_us: float | None = None, p99_us: float | None = None):
        latency = (
            f"{p50_us / 1000:.1f} | {p99_us / 1000:.1f} | {p99_us / base['p99_us']:.2f}"
            if p50_us is not None
            else " | | "
        )
        return f"| {label} | {rps:,.0f} | {rps / base['rps']:.2f} | {latency} |"

    for key in ("baseline", "poll", "poll304", "write", "write_bare"):
        got = load.get(key)  # write_bare: measured since 2026-12-03
        if got is not None:
            lines.append(row(names[key], got["rps"], got["p50_us"], got["p99_us"]))
        if key == "write":
            lines.append(row("… the same as record + complete pairs", got["pairs_per_s"]))
    lines.append("")
    short = {
        "poll": "poll (200)",
        "poll304": "poll (304)",
        "write": "record + complete",
        "write_bare": "without the header",
    }
    if results.get("round_ratios"):
        lines += [
            "Round by round, each path's throughput over the baseline's of the same round: "
            + "; ".join(
                f"{short[name]} " + ", ".join(f"{ratio:.2f}" for ratio in ratios)
                for name, ratios in results["round_ratios"].items()
            )
            + ".",
            "",
        ]
    if results.get("peers"):
        lines += peers.render(results["peers"], results["rounds"])
        lines += [
            f"Load average after the peers: {results['peers_loadavg'][0]:.1f} (1 min), "
            f"{results['peers_loadavg'][1]:.1f} (5 min).",
            "",
        ]
    lines += [
        f"Peak RSS of a web worker after the load: {results['web_rss_mb']:.0f} MiB "
        f"(max of {results['workers']} workers).",
        "",
        f"| console page (server time, in-process, {results.get('console_repeat', 40)} requests "
        "each) | p50 ms | p99 ms | max ms | queries |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for page in results["console"]:
        queries = ", ".join(str(q) for q in page["queries"])
        lines.append(
            f"| {page['page']} | {page['p50_ms']:.1f} | {page['p99_ms']:.1f} | "
            f"{page.get('max_ms', page['p99_ms']):.1f} | {queries} |"
        )
    sweep = results["sweep"]
    lines += [
        "",
        "| sweep | seconds | runs interrupted | peak RSS of the process |",
        "| --- | ---: | ---: | ---: |",
        f"| idle ({sweep['running']:,} running runs, none stale) | {sweep['idle_seconds']:.3f} "
        f"| 0 | |",
        f"| {sweep['stale']:,} stale of {sweep['running']:,} running | "
        f"{sweep['stale_seconds']:.2f} | {sweep['interrupted']:,} | "
        f"{sweep['peak_rss_mb']:.0f} MiB |",
    ]
    return "\n".join(lines)


def write_report(text: str) -> None:
    current = REPORT.read_text() if REPORT.exists() else "# Performance\n\n"
    block = f"{START}\n{text}\n{END}"
    if START in current and END in current:
        head, rest = current.split(START, 1)
        current = head + block + rest.split(END, 1)[1]
    else:
        current = current.rstrip() + "\n\n" + block + "\n"
    REPORT.write_text(current)


# --- Main ----------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="1 = 100,000 running runs")
    # Six rounds of 5 s rather than three of 10 s: the same load time, but the
    # shared machine's slow and fast minutes fall more evenly on every path, and
    # each round's ratios compare paths measured seconds apart.
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=6, help="interleaved rounds of each path")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn sync workers")
    parser.add_argument("--connections", type=int, default=8, help="wrk connections (reads)")
    # 200, so that p99 is a percentile: of 40 requests it was the slowest one.
    parser.add_argument("--console-repeat", type=int, default=200)
    # Per peer and round: 40 agents, 120 effect steps (about 5 s for startsafe).
    parser.add_argument(
        "--peer-agents", type=int, default=40, help="agents per peer and round (0: no peers)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the bench database")
    parser.add_argument("--no-report", action="store_true", help="do not touch docs/")
    args = parser.parse_args()

    ensure_wrk()
    url = os.environ.get("BENCH_DATABASE_URL") or os.environ.get("DATABASE_URL") or DEFAULT_URL
    var_dir = Path(tempfile.mkdtemp(prefix="startsafe-bench-"))
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "DEBUG": "0",
        "SECRET_KEY": "bench-" + uuid.uuid4().hex * 2,
        "ALLOWED_HOSTS": "127.0.0.1,localhost,testserver",
        # Counted as in production, but too high to refuse: the bench is one token.
        "STARTSAFE_RATE_LIMIT": "1000000000/minute",
        # The sweep's hand-offs and notifications must not reach a shared broker folder.
        "STARTSAFE_VAR_DIR": str(var_dir),
        "CELERY_BROKER_URL": "memory://",
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "startsafe.settings",
        "PYTHONPATH": str(ROOT),
    }
    os.environ.update(env)
    results: dict = {
        "scale": args.scale,
        "duration": args.duration,
        "rounds": args.rounds,
        "workers": args.workers,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": f"make bench BENCH_ARGS='--scale {args.scale:g}'"
        if args.scale != 1
        else "make bench",
        "machine": machine(url),
    }
    wrk_version = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    results["wrk"] = (wrk_version.stdout + wrk_version.stderr).split()[1]

    log(f"database {urlsplit(url).path.lstrip('/')}: recreate, migrate")
    recreate_database(url)
    # DBOS's and LangGraph's own databases, on the same server (bench/peers.py).
    peer_urls = {
        peer: urlunsplit(urlsplit(url)._replace(path=f"{urlsplit(url).path}_{peer}"))
        for peer in ("dbos", "langgraph")
    }
    servers: list[subprocess.Popen] = []
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from bench.seed import BENCH_TOKEN, seed

        log(f"seeding at scale {args.scale:g}")
        started = time.monotonic()
        seeded = seed(psycopg_dsn(url), args.scale, log=log)
        results["seed_seconds"] = time.monotonic() - started
        results["seeded"] = {
            k: getattr(seeded, k) for k in ("runs", "effects", "calls", "awaiting", "unknown")
        }
        log(f"seeded in {results['seed_seconds']:.0f} s: {results['seeded']}")
        from runs.models import Run
        from runs.verdict import blocked_runs_filter

        # The seed writes the verdict column itself: it must say what the rules say.
        blocked = Run.objects.filter(verdict_blocked=True).count()
        if blocked != Run.objects.filter(blocked_runs_filter()).count():
            raise SystemExit("the seed's verdict_blocked disagrees with runs/verdict.py")

        port, baseline_port = free_port(), free_port()
        servers.append(start_server(env, port, args.workers, "startsafe.wsgi:application"))
        # The baseline: its own settings module, the same flags and database.
        baseline_env = {**env, "DJANGO_SETTINGS_MODULE": "bench.baseline.settings"}
        servers.append(
            start_server(
                baseline_env, baseline_port, args.workers, "bench.baseline.wsgi:application"
            )
        )
        base = f"http://127.0.0.1:{port}"
        baseline_base = f"http://127.0.0.1:{baseline_port}"
        import httpx

        headers = {"Authorization": f"Bearer {BENCH_TOKEN}"}
        targets = var_dir / "targets.txt"
        with httpx.Client(base_url=base, headers=headers) as http, targets.open("w") as out:
            for effect_id in seeded.poll_effects:
                answer = http.get(f"/api/v1/effects/{effect_id}")
                assert answer.status_code == 200, answer.text
                out.write(f"{effect_id} {answer.headers['ETag']}\n")
            first = seeded.poll_effects[0]
            etag = http.get(f"/api/v1/effects/{first}").headers["ETag"]
            assert (
                http.get(f"/api/v1/effects/{first}", headers={"If-None-Match": etag}).status_code
                == 304
            )
            baseline_answer = httpx.get(f"{baseline_base}/baseline/{first}")
            assert baseline_answer.status_code == 200, baseline_answer.text
            runs_file = var_dir / "runs.txt"
            with runs_file.open("w") as runs_out:
                for n in range(args.connections):  # one run per write connection
                    started_run = http.post(
                        "/api/v1/runs",
                        json={"run_key": f"bench-writer-{n}", "heartbeat_timeout": 86400},
                    )
                    assert started_run.status_code == 201, started_run.text
                    runs_out.write(started_run.json()["run"]["id"] + "\n")
        wrk_env = {
            **env,
            "BENCH_TOKEN": BENCH_TOKEN,
            "BENCH_TARGETS": str(targets),
            "BENCH_RUNS": str(runs_file),
        }
        plans = {
            "baseline": (
                baseline_base,
                "read.lua",
                {"BENCH_MODE": "baseline"},
                2,
                args.connections,
            ),
            "poll": (base, "read.lua", {"BENCH_MODE": "poll"}, 2, args.connections),
            "poll304": (base, "read.lua", {"BENCH_MODE": "poll304"}, 2, args.connections),
            # As many connections as the reads (a path measured with fewer would leave
            # workers idle between its requests): one wrk thread per connection,
            # since each owns a run and the effect it just recorded.
            "write": (base, "write.lua", {}, args.connections, args.connections),
            # The same writes without request idempotency, as a client that sends no
            # Idempotency-Key would make them: what that protection costs (the
            # target is judged on the row above, as the Python client writes).
            "write_bare": (
                base,
                "write.lua",
                {"BENCH_IDEMPOTENCY": "0"},
                args.connections,
                args.connections,
            ),
        }
        log("warming up")
        for name, (target, script, extra, threads, conns) in plans.items():
            wrk(script, target, 2, threads, conns, {**wrk_env, **extra, "BENCH_STAMP": f"w{name}"})
        rounds: dict[str, list[dict]] = {name: [] for name in plans}
        for r in range(args.rounds):
            for name, (target, script, extra, threads, conns) in plans.items():
                stamp = f"{r}-{uuid.uuid4().hex[:6]}"
                got = wrk(
                    script,
                    target,
                    args.duration,
                    threads,
                    conns,
                    {**wrk_env, **extra, "BENCH_STAMP": stamp},
                )
                if name.startswith("write"):
                    got["pairs_per_s"] = got["completed"] / (got["duration_us"] / 1e6)
                rounds[name].append(got)
                log(
                    f"  round {r + 1} {name}: {got['rps']:,.0f} req/s, p50 "
                    f"{got['p50_us'] / 1000:.1f} ms, p99 {got['p99_us'] / 1000:.1f} ms, "
                    f"errors {got['errors']}"
                )
        load = {}
        for name, runs_of in rounds.items():
            load[name] = {
                key: statistics.median(r[key] for r in runs_of)
                for key in runs_of[0]
                if isinstance(runs_of[0][key], int | float)
            }
        results["load"] = load
        # Each round's throughput of a path over the baseline's of the same round.
        results["round_ratios"] = {
            name: [
                got["rps"] / base["rps"]
                for got, base in zip(runs_of, rounds["baseline"], strict=True)
            ]
            for name, runs_of in rounds.items()
            if name != "baseline"
        }
        results["loadavg"] = os.getloadavg()
        results["web_rss_mb"] = max(peak_rss_mb(pid) for pid in children_of(servers[0].pid))

        if args.peer_agents:  # the baseline serves on: the peers' HTTP floor
            log(f"peers: {', '.join(peers.SHORT[name] for name in peers.PEERS)}")
            for peer_url in peer_urls.values():
                recreate_database(peer_url)
            peer_env = {**env, "BENCH_TOKEN": BENCH_TOKEN}
            envs = {
                "startsafe": {**peer_env, "BENCH_PEER_URL": base},
                # The ids the load phase's baseline reads (read.lua's BENCH_TARGETS).
                "floor": {
                    **peer_env,
                    "BENCH_PEER_URL": baseline_base,
                    "BENCH_TARGETS": str(targets),
                },
                **{
                    name: {**peer_env, "BENCH_PEER_URL": psycopg_dsn(peer_url)}
                    for name, peer_url in peer_urls.items()
                },
            }
            results["peers"] = peers.measure(envs, args.rounds, args.peer_agents, log=log)
            results["peers_loadavg"] = os.getloadavg()
        for server in servers:
            server.terminate()
            server.wait(timeout=30)
        servers.clear()

        log("console pages")
        results["console"] = measure_console(seeded, args.console_repeat)
        results["console_repeat"] = args.console_repeat
        from django.db import connections

        connections.close_all()
        log("sweep")
        results["sweep"] = measure_sweep(env, 0.01)
        log(f"  {results['sweep']}")
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=30)
        try:
            from django.db import connections

            for conn in connections.all():
                conn.close()
                if hasattr(conn, "close_pool"):
                    conn.close_pool()
        except Exception:  # noqa: BLE001 - cleaning up after a failure
            pass
        if not args.keep:
            drop_database(url)
            for peer_url in peer_urls.values():
                drop_database(peer_url)
            log("bench databases dropped")
        shutil.rmtree(var_dir, ignore_errors=True)

    text = render(results)
    print(text)
    raw = ROOT / "var" / "bench" / f"results-{args.scale:g}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(results, indent=2, default=str))
    if not args.no_report:
        write_report(text)
        log(f"results written to {REPORT.relative_to(ROOT)} (raw: {raw.relative_to(ROOT)})")


if __name__ == "__main__":
    main()
