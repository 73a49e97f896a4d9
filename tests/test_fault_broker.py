"""The broker stops during a sweep and starts again: nothing is lost, the work completes.

The test runs its own ``redis-server`` on a free loopback port (never the shared one
on 6379, which other tests use), a real Celery worker and beat on it, and a runtime
behind each run's restart URL. Two runs fall silent with an effect in flight. Then:

1. Redis stops. The worker and beat lose their broker.
2. A sweep runs anyway (``manage.py sweep``, the cron form of the schedule): it
   interrupts both runs, makes their effects ``unknown`` and writes their hand-offs,
   but cannot queue the deliveries — the broker is down.
3. Redis starts again, empty (no persistence: every queued message is gone).

What must hold: the sweep's work was kept in the database while the broker was
down; once it is back, the schedule alone delivers each hand-off, the runtime
starts each run once (attempt 2), and no run, effect or hand-off is lost.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.db import connection

from runs.calls import record_call
from runs.errors import AlreadyRunning
from runs.lifecycle import heartbeat, start_run
from runs.models import Attempt, AuditEvent, Effect, EffectStatus, RestartHandoff, Run, RunStatus
from tests.fault_helpers import ROOT, database_url, free_port, stop_process, wait_for
from tests.runtime_server import RuntimeServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(170), pytest.mark.django_db(transaction=True)]

RUNS = 2


class OwnRedis:
    """A redis-server of this test's own: no persistence, so a restart starts empty."""

    def __init__(self, tmp: Path) -> None:
        self.port = free_port()
        self.tmp = tmp
        self.url = f"redis://127.0.0.1:{self.port}/9"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        log = open(self.tmp / "redis.log", "ab")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--daemonize", "no",
                "--dir", str(self.tmp),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        wait_for(self.ping, 10, "our redis-server to answer")

    def ping(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process)
            self.process = None


class Celery:
    """The worker and beat, each in its own process group, always terminated."""

    def __init__(self, tmp: Path, broker: str) -> None:
        self.tmp = tmp
        self.env = {
            **os.environ,
            "DEBUG": "1",
            "DATABASE_URL": database_url(),
            "DATABASE_POOL": "0",
            "CELERY_BROKER_URL": broker,
            "STARTSAFE_SWEEP_INTERVAL": "1",
            "STARTSAFE_NOTIFY_INTERVAL": "60",
            "STARTSAFE_RESTART_HANDOFF_TIMEOUT": "3",
            # The loopback runtime, allowed as for a runtime on the same host.
            "STARTSAFE_OUTBOUND_ALLOW": "127.0.0.1",
            "STARTSAFE_VAR_DIR": str(tmp),
        }
        self.running: list[subprocess.Popen] = []

    def start(self, name: str, *args: str) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.running.append(
            subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "startsafe", *args, "--loglevel=info"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        for process in self.running:
            stop_process(process)

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{self.log(n)[-2500:]}" for n in ("worker", "beat"))


@pytest.fixture
def broker(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    own = OwnRedis(tmp_path)
    own.start()
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture
def celery(tmp_path, broker):
    processes = Celery(tmp_path, broker.url)
    try:
        yield processes
    finally:
        processes.stop_all()


def test_the_broker_stopped_during_a_sweep_loses_nothing_and_the_work_completes(
    agent, broker, celery
):
    starts: list[str] = []

    def runtime_starts_the_run(delivery: dict) -> int:
        """What a runtime does with a hand-off: start the run by its key."""
        try:
            start_run(agent, delivery["body"]["run_key"])
            starts.append(delivery["body"]["run_key"])
            return 200
        except AlreadyRunning:
            return 409
        finally:
            connection.close()  # this thread's own connection

    with RuntimeServer(runtime_starts_the_run) as runtime:
        runs, effects = [], []
        for i in range(RUNS):
            run = start_run(agent, f"nightly-{i}", heartbeat_timeout=5, restart_url=runtime.url).run
            effects.append(
                record_call(
                    agent, run.pk, attempt=1, tool="send_mail", kind="effect",
                    args={"to": f"team-{i}@example.com"}, key=f"digest:{i}", key_source="intent",
                ).effect
            )  # fmt: skip
            heartbeat(agent, run.pk, attempt=1)  # ...and then they fall silent
            runs.append(run)

        celery.start("worker", "worker", "--pool=solo", "-n", "fault@%h", "--without-mingle",
                     "--without-gossip")  # fmt: skip
        celery.start("beat", "beat", "-s", str(celery.tmp / "schedule"))
        wait_for(lambda: "ready" in celery.log("worker"), 40, "the worker to be ready")

        # 1. The broker goes away before the runs are stale.
        broker.stop()
        down_at = time.monotonic()
        wait_for(
            lambda: all(Run.objects.get(pk=r.pk).stale_at < _db_now() for r in runs),
            15,
            "the runs to be stale",
        )
        # Nothing could be scheduled: the runs are still as they were.
        statuses = Run.objects.filter(pk__in=[r.pk for r in runs]).values_list("status", flat=True)
        assert set(statuses) == {RunStatus.RUNNING}

        # 2. A sweep runs while the broker is down (the cron form of the schedule).
        swept = subprocess.run(
            [sys.executable, "manage.py", "sweep"],
            cwd=ROOT,
            env=celery.env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert swept.returncode == 0, swept.stderr[-3000:]
        # Its work is in the database: interrupted, unknown, the hand-offs written.
        for run, effect in zip(runs, effects, strict=True):
            run.refresh_from_db()
            effect.refresh_from_db()
            assert run.status == RunStatus.INTERRUPTED and run.restart_ready
            assert effect.status == EffectStatus.UNKNOWN
            assert RestartHandoff.objects.get(run=run).status != "sent"
        assert runtime.deliveries == []  # the broker was down: nothing delivered yet
        time.sleep(2)  # the worker and beat keep trying meanwhile

        # 3. The broker comes back, empty.
        broker.start()
        down_seconds = time.monotonic() - down_at
        back_at = time.monotonic()
        wait_for(
            lambda: RestartHandoff.objects.filter(run__in=runs, status="sent").count() == RUNS,
            60,
            "every hand-off to be delivered once the broker is back",
        )
        recovery = time.monotonic() - back_at

    # The runtime started each run exactly once, on the attempt the hand-off named.
    assert sorted(starts) == sorted(r.run_key for r in runs), celery.logs()
    keys = {d["key"] for d in runtime.deliveries}
    assert keys == {f"restart:{r.pk}:2" for r in runs}
    for run, effect in zip(runs, effects, strict=True):
        assert list(Attempt.objects.filter(run=run).values_list("number", flat=True)) == [1, 2]
        run.refresh_from_db()
        assert (run.status, run.current_attempt) == (RunStatus.RUNNING, 2)
        # The effect in flight when the run died stays unknown (never run again on its own).
        assert Effect.objects.get(pk=effect.pk).status == EffectStatus.UNKNOWN
        # The story is in the audit log: interrupted, handed off, delivered.
        verbs = set(AuditEvent.objects.filter(run=run).values_list("verb", flat=True))
        assert "handoff_try" in verbs
    print(
        f"\nbroker down {down_seconds:.1f}s during a sweep: runs interrupted {RUNS}, hand-offs "
        f"written {RUNS}, deliveries {len(runtime.deliveries)} ({len(keys)} keys), runs started "
        f"{len(starts)}, delivered {recovery:.1f}s after the broker came back"
    )


def _db_now():
    from django.utils import timezone

    return timezone.now()
