"""The database goes away under a burst of agent calls, and comes back.

A real gunicorn server (3 workers, psycopg's connection pool, as in production)
runs against the test database while client threads record, execute and complete
keyed effects. Meanwhile:

(a) every server connection is cut, several times (``pg_terminate_backend``);
(b) PostgreSQL itself is restarted.

The client retries every failed request with its ``Idempotency-Key``. What must
hold: every thread finishes, each key is executed exactly once (a thread-safe
ledger counts executions), the journal holds each call exactly once, every effect
is done with its result, and the same server process answers again afterwards
without a 5xx (its pool threw the dead connections away).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import psycopg
import pytest
from db_helpers import connect_outside_django
from django.conf import settings as django_settings
from django.db import connections

import startsafe_client as ss
from runs.models import Call, Effect, IdempotentRequest, Run
from tests.fault_helpers import Gunicorn, database_url, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.django_db(transaction=True),
]

THREADS, CALLS = 8, 25
PG_CLUSTER = ("15", "main")


class Burst:
    """THREADS agents' runs, CALLS keyed effects each, through the real client."""

    def __init__(self, url: str, token: str, prefix: str) -> None:
        self.url, self.token, self.prefix = url, token, prefix
        self.executed: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.calls_made = 0
        self.errors: list[BaseException] = []
        self.statuses: Counter[int] = Counter()
        self.threads = [
            threading.Thread(target=self._agent, args=(i,), daemon=True) for i in range(THREADS)
        ]

    def _count_status(self, response: httpx.Response) -> None:
        with self.lock:
            self.statuses[response.status_code] += 1

    def _agent(self, number: int) -> None:
        transport = httpx.HTTPTransport()
        client = ss.Client(
            self.url,
            self.token,
            timeout=10,
            # Enough retries to outlast a PostgreSQL restart (about 2-4 s).
            max_retries=10,
            backoff=0.1,
            backoff_max=2,
            transport=transport,
        )
        client._http.event_hooks["response"].append(self._count_status)

        @client.tool(kind="effect", key=lambda a: ss.intent_key("burst", run=a["run"], n=a["n"]))
        def write(run: str, n: int) -> dict:
            with self.lock:
                self.executed[f"{run}:{n}"] += 1
            return {"wrote": n}

        run_key = f"{self.prefix}-{number}"
        try:
            with client.run(run_key, heartbeat_timeout=120) as run:
                for n in range(CALLS):
                    result = run.call(write, run=run_key, n=n)
                    assert result == {"wrote": n}
                    with self.lock:
                        self.calls_made += 1
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(exc)
        finally:
            client.close()

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def running(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.1, deadline - time.monotonic()))
        assert not self.running(), "the burst did not finish in time"


def _admin_connection() -> psycopg.Connection:
    """A connection to the maintenance database, for killing and watching the others."""
    return connect_outside_django("postgres")


def _terminate_server_connections(exclude: set[int]) -> int:
    """Cut every connection to the test database except the test's own; how many."""
    with _admin_connection() as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid() AND NOT (pid = ANY(%s))",
            [django_settings.DATABASES["default"]["NAME"], list(exclude)],
        ).fetchall()
    return sum(1 for (done,) in rows if done)


def _own_backend_pids() -> set[int]:
    pids = set()
    for conn in connections.all():
        if conn.connection is not None:
            with conn.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids.add(cursor.fetchone()[0])
    return pids


def _pg_ready() -> bool:
    return subprocess.run(["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-q"]).returncode == 0


def _pg_ctl(action: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *PG_CLUSTER, action],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _assert_nothing_lost_or_repeated(burst: Burst, prefix: str) -> dict:
    assert not burst.errors, burst.errors[:3]
    expected = {f"{prefix}-{i}:{n}" for i in range(THREADS) for n in range(CALLS)}
    # Each key executed exactly once: no retry ran a second time.
    assert set(burst.executed) == expected
    duplicates = sum(count - 1 for count in burst.executed.values())
    assert duplicates == 0, [k for k, c in burst.executed.items() if c > 1]

    # The journal: each call recorded exactly once, in order, on one attempt per run.
    runs = Run.objects.filter(run_key__startswith=f"{prefix}-")
    assert runs.count() == THREADS
    assert set(runs.values_list("status", flat=True)) == {"completed"}
    assert set(runs.values_list("current_attempt", flat=True)) == {1}
    calls = Call.objects.filter(run__in=runs)
    assert calls.count() == burst.calls_made == THREADS * CALLS
    for run in runs:
        seqs = list(Call.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
        assert len(seqs) == CALLS and len(set(seqs)) == CALLS
    effects = Effect.objects.filter(run__in=runs)
    assert effects.count() == THREADS * CALLS
    assert set(effects.values_list("status", flat=True)) == {"done"}
    assert all(e.result == {"wrote": e.args["n"]} for e in effects)
    # No request is left claimed forever: a died request's key was freed or answered.
    stuck = IdempotentRequest.objects.filter(completed_at__isnull=True).count()
    return {
        "calls made": burst.calls_made,
        "effects executed": sum(burst.executed.values()),
        "duplicates": duplicates,
        "client saw 5xx": sum(c for s, c in burst.statuses.items() if s >= 500),
        "stuck idempotency claims": stuck,
    }


def _assert_server_recovered(server: Gunicorn, agent, prefix: str) -> float:
    """The same server process answers a fresh start and call without a 5xx; seconds."""
    began = time.monotonic()
    before = len(server.statuses())
    for i in range(2 * 3):  # more than one request per worker, so each pool is used
        answer = httpx.post(
            f"{server.url}/api/v1/runs",
            json={"run_key": f"{prefix}-after-{i}"},
            headers={"Authorization": f"Bearer {agent.token}"},
            timeout=10,
        )
        assert answer.status_code == 201, answer.text
    assert server.alive()
    after = server.statuses()[before:]
    assert all(s < 500 for s in after), after
    return time.monotonic() - began


@pytest.fixture
def server(tmp_path: Path):
    with Gunicorn(tmp_path, workers=3) as gunicorn:
        yield gunicorn


def test_connections_cut_mid_request_are_retried_and_each_call_is_recorded_once(server, agent):
    own = _own_backend_pids()
    burst = Burst(server.url, agent.token, "cut")
    began = time.monotonic()
    burst.start()
    terminated, rounds = 0, 0
    # Cut every server connection, again and again, while the burst runs.
    while burst.running() and rounds < 8:
        time.sleep(0.4)
        terminated += _terminate_server_connections(own)
        rounds += 1
    last_fault = time.monotonic()
    burst.join(120)
    figures = _assert_nothing_lost_or_repeated(burst, "cut")
    recovery = _assert_server_recovered(server, agent, "cut")
    server_5xx = sum(1 for s in server.statuses() if s >= 500)
    print(
        f"\nconnections cut: {rounds} rounds, {terminated} backends terminated; {figures}; "
        f"server 5xx {server_5xx}; burst {last_fault - began:.1f}s of faults, "
        f"total {time.monotonic() - began:.1f}s; recovered in {recovery:.2f}s"
    )
    assert terminated > 0, "no server connection was cut: the fault was not injected"
    assert figures["stuck idempotency claims"] == 0


def test_a_postgresql_restart_during_a_burst_loses_and_repeats_nothing(server, agent):
    if subprocess.run(["which", "pg_ctlcluster"], capture_output=True).returncode:
        pytest.skip("pg_ctlcluster is not available to restart PostgreSQL")
    burst = Burst(server.url, agent.token, "restart")
    began = time.monotonic()
    try:
        burst.start()
        wait_for(lambda: burst.calls_made >= THREADS * 2 or not burst.running(), 60, "calls")
        restart_began = time.monotonic()
        _pg_ctl("restart")
        wait_for(_pg_ready, 30, "PostgreSQL to accept connections again")
        restart_seconds = time.monotonic() - restart_began
        burst.join(120)
    finally:
        # Whatever happened, PostgreSQL runs again for the rest of the suite, and
        # pytest-django's own connections (dead since the restart) reconnect.
        if not _pg_ready():
            with contextlib.suppress(subprocess.SubprocessError):
                _pg_ctl("start")
            wait_for(_pg_ready, 30, "PostgreSQL to start again")
        connections.close_all()
    assert burst.calls_made > THREADS * 2 - 1
    figures = _assert_nothing_lost_or_repeated(burst, "restart")
    recovery = _assert_server_recovered(server, agent, "restart")
    server_5xx = sum(1 for s in server.statuses() if s >= 500)
    print(
        f"\nPostgreSQL restarted once ({restart_seconds:.1f}s down); {figures}; server 5xx "
        f"{server_5xx}; total {time.monotonic() - began:.1f}s; recovered in {recovery:.2f}s"
    )
    assert figures["stuck idempotency claims"] == 0
    assert database_url()  # the server ran on the test database, not a copy
