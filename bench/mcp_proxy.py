"""What startsafe-mcp adds to a tool call: a forwarded call against a direct one.

    .venv/bin/python -m bench.mcp_proxy [--calls 200] [--base-url URL --token TOKEN]

Run from the test environment (``make install-test``: the client's ``[mcp]`` extra);
not part of ``make test``. Without ``--base-url`` it makes its own server: a fresh
PostgreSQL database (``BENCH_DATABASE_URL``, else ``startsafe_bench_mcp`` on
127.0.0.1), migrated, one agent, gunicorn on loopback; the database is dropped at
the end.

One MCP client of the SDK talks to the example's CRM server directly (stdio), another
to the proxy in front of the same server (stdio), in one run. Calls alternate between
the two, so the machine's noise falls on both alike:

- a read (``lookup_customer``): the proxy records it (one round trip), then forwards;
- a keyed effect (``send_campaign``, a new campaign id each time, no approval): the
  proxy records it, forwards it, reports its result (two round trips).

The same round trips are timed on their own through the protocol core
(``AsyncRun.call_spec`` with a tool that does nothing), so the report says what the
proxy adds beside them. Medians and 90th percentiles, in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters

from bench.run import drop_database, free_port, log, percentile, recreate_database, start_server

ROOT = Path(__file__).resolve().parent.parent
CRM = ROOT / "examples" / "mcp" / "crm_server.py"
PROXY = Path(sys.executable).parent / "startsafe-mcp"
DEFAULT_DATABASE = "postgres://postgres@127.0.0.1:5432/startsafe_bench_mcp"

CONFIG = """\
[startsafe]
url = "{url}"
approval_timeout = 60

[servers.crm]
command = ["{python}", "{crm}"]
env = {{ LEDGER = "{ledger}" }}

[tools."crm.lookup_customer"]
kind = "read"

[tools."crm.send_campaign"]
key = "campaign:{{campaign_id}}"
key_source = "intent"
"""


async def measure(base_url: str, token: str, calls: int, folder: Path) -> dict[str, list[float]]:
    """Time each kind of call ``calls`` times (after a warm-up); milliseconds."""
    from startsafe_client import AsyncClient, effect, intent_key, read

    ledger = folder / "ledger.jsonl"
    config = folder / "startsafe-mcp.toml"
    config.write_text(
        CONFIG.format(url=base_url, python=sys.executable, crm=CRM, ledger=ledger),
        encoding="utf-8",
    )
    direct = StdioServerParameters(
        command=sys.executable, args=[str(CRM)], env={"LEDGER": str(ledger)}
    )
    run_key = f"bench-mcp-{uuid.uuid4().hex[:8]}"
    proxied = StdioServerParameters(
        command=str(PROXY),
        args=["--config", str(config), "--run-key", run_key],
        env={"STARTSAFE_TOKEN": token},
    )
    times: dict[str, list[float]] = {}

    async def timed(name: str, call: Any) -> None:
        started = time.perf_counter()
        result = await call
        if getattr(result, "is_error", False):
            raise SystemExit(f"{name}: {result.content}")
        times.setdefault(name, []).append((time.perf_counter() - started) * 1000)

    campaign = {"segment": "EU", "subject": "Winter", "recipients": 1}
    core_read, core_effect = read(), effect(key=lambda a: intent_key("c", id=a["id"]))

    async def nothing(args: dict[str, Any]) -> dict[str, Any]:
        return {}

    async with (
        Client(direct, cache=None) as straight,
        Client(proxied, cache=None) as through,
        AsyncClient(base_url, token) as startsafe,
        startsafe.run(f"{run_key}-core") as core,
    ):
        for i in range(calls + 10):
            lookup = {"email": "ana.silva@example.eu"}
            await timed("read, direct", straight.call_tool("lookup_customer", lookup))
            await timed("read, through the proxy", through.call_tool("lookup_customer", lookup))
            await timed("read, round trip alone", core.call_spec("r", core_read, {}, nothing))
            direct_args = {**campaign, "campaign_id": f"direct-{i}"}
            proxy_args = {**campaign, "campaign_id": f"proxied-{i}"}
            await timed("effect, direct", straight.call_tool("send_campaign", direct_args))
            await timed("effect, through the proxy", through.call_tool("send_campaign", proxy_args))
            await timed(
                "effect, round trips alone",
                core.call_spec("e", core_effect, {"id": f"core-{i}"}, nothing),
            )
    return {name: values[10:] for name, values in times.items()}  # without the warm-up


def report(times: dict[str, list[float]], calls: int) -> str:
    lines = [f"{'call':<28} {'median ms':>10} {'p90 ms':>8}   ({calls} calls each)"]
    for name, values in times.items():
        lines.append(
            f"{name:<28} {statistics.median(values):>10.2f} {percentile(values, 90):>8.2f}"
        )
    for kind, trips in (("read", "round trip"), ("effect", "round trips")):
        added = (
            statistics.median(times[f"{kind}, through the proxy"])
            - statistics.median(times[f"{kind}, direct"])
            - statistics.median(times[f"{kind}, {trips} alone"])
        )
        lines.append(f"{kind}: the proxy adds {added:.2f} ms (median) beside its {trips}")
    return "\n".join(lines)


def _own_server() -> tuple[str, str, Any]:
    """A migrated database with one agent, served by gunicorn; returns (url, token, stop)."""
    database = os.environ.get("BENCH_DATABASE_URL") or DEFAULT_DATABASE
    env = {
        **os.environ,
        "DATABASE_URL": database,
        "DEBUG": "0",
        "SECRET_KEY": "bench-" + uuid.uuid4().hex * 2,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "STARTSAFE_RATE_LIMIT": "1000000000/minute",  # one token makes every call
        "STARTSAFE_VAR_DIR": tempfile.mkdtemp(prefix="startsafe-bench-mcp-"),
        "CELERY_BROKER_URL": "memory://",
        "LOG_LEVEL": "WARNING",
        "DJANGO_SETTINGS_MODULE": "startsafe.settings",
        "PYTHONPATH": str(ROOT),
    }
    os.environ.update(env)
    log("database: recreate, migrate")
    recreate_database(database)
    import django

    django.setup()
    from django.core.management import call_command

    from runs.models import Agent

    call_command("migrate", verbosity=0)
    agent = Agent(name="bench-mcp")
    token = agent.set_new_token()
    agent.save()
    port = free_port()
    server = start_server(env, port, workers=2)

    def stop() -> None:
        server.terminate()
        server.wait(timeout=30)
        drop_database(database)

    return f"http://127.0.0.1:{port}", token, stop


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200, help="timed calls of each kind")
    parser.add_argument("--base-url", help="a running startsafe server (else its own)")
    parser.add_argument("--token", default=os.environ.get("STARTSAFE_TOKEN"))
    options = parser.parse_args()
    if options.base_url and not options.token:
        parser.error("--base-url needs --token (or STARTSAFE_TOKEN)")
    stop = None
    if options.base_url:
        base_url, token = options.base_url, options.token
    else:
        base_url, token, stop = _own_server()
    try:
        log(f"{options.calls} calls of each kind against {base_url}")
        with tempfile.TemporaryDirectory(prefix="startsafe-bench-mcp-") as folder:
            times = anyio.run(measure, base_url, token, options.calls, Path(folder))
        print(report(times, options.calls))
    finally:
        if stop is not None:
            stop()


if __name__ == "__main__":
    main()
