"""200 agents × 20 calls each, concurrently, through the client, against gunicorn.

The 200 agents are 50 agent identities (tokens) with 4 replicas each, like four
workers of one bot woken by the same messages: each replica runs its own run, and
some of its calls name keys that its three siblings name too (a reply to the same
inbound message). Those keys must execute once, whoever gets there first; the
others wait for it and skip. 50 client threads at a time against 3 gunicorn
workers on the test database.

What must hold: zero 5xx (counted by a response hook on every client and in the
server's access log), zero duplicate executions (each key executed once, counted
in a thread-safe ledger), and the journal complete (Call rows = calls made).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

import startsafe_client as ss
from runs.models import Agent, Call, Effect, Run
from tests.fault_helpers import Gunicorn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.django_db(transaction=True),
]

IDENTITIES, REPLICAS, CALLS = 50, 4, 20
READS, SHARED = 2, 4  # per agent; the rest are keys of its own
CONCURRENCY = 50


class Ledger:
    """Every execution of every tool, counted under a lock; and every status seen."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.executed: Counter[str] = Counter()
        self.reads = 0
        self.calls_made = 0
        self.statuses: Counter[int] = Counter()

    def execute(self, key: str) -> None:
        with self.lock:
            self.executed[key] += 1

    def status(self, response: httpx.Response) -> None:
        with self.lock:
            self.statuses[response.status_code] += 1


def _agent_process(url: str, token: str, identity: int, replica: int, ledger: Ledger) -> None:
    """One agent: a run of CALLS tool calls (reads, its own keys, keys its siblings share)."""
    client = ss.Client(
        url, token, timeout=30, backoff=0.1, poll_interval=0.05, poll_max_interval=0.5,
        approval_timeout=90,
    )  # fmt: skip
    client._http.event_hooks["response"].append(ledger.status)

    @client.tool(kind="read")
    def look_up(n: int) -> dict:
        with ledger.lock:
            ledger.reads += 1
        return {"n": n}

    @client.tool(kind="effect", key=lambda a: ss.intent_key("own", run=a["run"], n=a["n"]))
    def write_own(run: str, n: int) -> dict:
        ledger.execute(f"{identity}:own:{run}:{n}")
        return {"n": n}

    @client.tool(
        kind="effect",
        key=lambda a: ss.provider_key("mail", "message", f"{identity}-{a['n']}"),
    )
    def reply(n: int, by: int) -> dict:
        ledger.execute(f"{identity}:reply:{n}")
        return {"n": n, "by": by}

    run_key = f"load-{identity}-{replica}"
    try:
        with client.run(run_key, heartbeat_timeout=300) as run:
            for n in range(CALLS):
                if n < READS:
                    run.call(look_up, n=n)
                elif n < READS + SHARED:
                    # Siblings reach the shared keys in a different order.
                    shared = (n - READS + replica) % SHARED
                    assert run.call(reply, n=shared, by=replica)["n"] == shared
                else:
                    assert run.call(write_own, run=run_key, n=n) == {"n": n}
                with ledger.lock:
                    ledger.calls_made += 1
    finally:
        client.close()


def test_200_agents_making_20_calls_each_at_once_execute_each_key_once(tmp_path, transactional_db):
    agents = []
    for i in range(IDENTITIES):
        agent = Agent(name=f"load-bot-{i}")
        agent.token = agent.set_new_token()
        agent.save()
        agents.append(agent)
    ledger = Ledger()

    with Gunicorn(tmp_path, workers=3, threads=4) as server:
        began = time.monotonic()
        with ThreadPoolExecutor(max_workers=CONCURRENCY) as pool:
            futures = [
                pool.submit(_agent_process, server.url, agent.token, i, replica, ledger)
                for replica in range(REPLICAS)
                for i, agent in enumerate(agents)
            ]
            errors = [f.exception() for f in futures if f.exception() is not None]
        seconds = time.monotonic() - began
        server_statuses = Counter(server.statuses())
        assert server.alive()

    agents_run = IDENTITIES * REPLICAS
    client_5xx = sum(c for s, c in ledger.statuses.items() if s >= 500)
    server_5xx = sum(c for s, c in server_statuses.items() if s >= 500)
    duplicates = sum(c - 1 for c in ledger.executed.values())
    expected_keys = agents_run * (CALLS - READS - SHARED) + IDENTITIES * SHARED
    print(
        f"\nload: {agents_run} agents x {CALLS} calls, {CONCURRENCY} at a time, gunicorn 3x4: "
        f"calls made {ledger.calls_made}, effects executed {sum(ledger.executed.values())} "
        f"({len(ledger.executed)} keys), reads {ledger.reads}, duplicates {duplicates}, "
        f"5xx client {client_5xx} / server {server_5xx}, requests {sum(server_statuses.values())}"
        f" ({dict(sorted(server_statuses.items()))}), {seconds:.1f}s "
        f"({sum(server_statuses.values()) / seconds:.0f} req/s)"
    )

    assert not errors, errors[:3]
    # Zero 5xx, whether or not a retry hid it from the agent.
    assert client_5xx == 0 and server_5xx == 0, (ledger.statuses, server_statuses)
    # Zero duplicate executions: every key once, the shared ones included.
    assert duplicates == 0, [k for k, c in ledger.executed.items() if c > 1][:10]
    assert len(ledger.executed) == expected_keys
    # The journal is complete: one Call row per call made, each run completed.
    assert ledger.calls_made == agents_run * CALLS
    runs = Run.objects.filter(run_key__startswith="load-")
    assert runs.count() == agents_run
    assert set(runs.values_list("status", flat=True)) == {"completed"}
    assert Call.objects.filter(run__in=runs).count() == ledger.calls_made
    effects = Effect.objects.filter(agent__in=agents)
    assert effects.count() == expected_keys
    assert set(effects.values_list("status", flat=True)) == {"done"}
