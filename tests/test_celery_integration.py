"""A real Celery worker and beat against Redis, as subprocesses, on the test database.

A run with a 5-second heartbeat timeout stops heartbeating; the schedule alone
interrupts it, makes its in-flight effect unknown and calls its restart URL with
the next attempt. The worker is then killed with SIGKILL in the middle of that
hand-off; a new worker delivers it again with the same Idempotency-Key, and the
runtime, starting the run on every delivery, gets exactly one new attempt.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection

from runs.calls import record_call
from runs.errors import AlreadyRunning
from runs.lifecycle import heartbeat, start_run
from runs.models import Attempt, AuditEvent, Effect, EffectStatus, RestartHandoff, Run, RunStatus
from tests.fault_helpers import database_url
from tests.redis_helpers import REDIS_URL, Namespace, redis_namespace, someone_elses_key
from tests.runtime_server import RuntimeServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parent.parent


def _wait(predicate, timeout: float, what: str, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"gave up after {timeout}s waiting for {what}")


class Processes:
    """Celery subprocesses, each in its own process group, always terminated.

    Their broker is the tests' shared Redis database, under a key prefix of their own
    (``namespace``): every queue, binding and channel, so nothing else there is read.
    """

    def __init__(self, tmp: Path, namespace: Namespace):
        self.tmp = tmp
        self.namespace = namespace
        self.env = {
            **os.environ,
            "DEBUG": "1",
            "DATABASE_URL": database_url(),
            "DATABASE_POOL": "0",
            "CELERY_BROKER_URL": REDIS_URL,
            "CELERY_BROKER_KEY_PREFIX": namespace.prefix,
            "STARTSAFE_SWEEP_INTERVAL": "1",
            "STARTSAFE_NOTIFY_INTERVAL": "60",
            # A short per-try timeout makes the lease of a dead try short (2*3+5 s).
            "STARTSAFE_RESTART_HANDOFF_TIMEOUT": "3",
            # The loopback runtime, allowed as for a runtime on the same host.
            "STARTSAFE_OUTBOUND_ALLOW": "127.0.0.1",
            "STARTSAFE_VAR_DIR": str(tmp),
        }
        self.running: list[subprocess.Popen] = []

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "startsafe", *args, "--loglevel=info"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.running.append(process)
        return process

    def worker(self, name: str) -> subprocess.Popen:
        # solo pool: the task runs in this very process, so SIGKILL kills it mid-task.
        return self.start(
            name,
            "worker",
            "--pool=solo",
            "-n",
            f"{name}@%h",
            "--without-mingle",
            "--without-gossip",
        )

    def kill(self, process: subprocess.Popen, sig=signal.SIGKILL) -> None:
        if process.poll() is None:
            os.killpg(process.pid, sig)
            process.wait(timeout=10)

    def stop_all(self) -> None:
        for process in self.running:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.running:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=5)

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.tmp.glob("*.log")
        )


@pytest.fixture
def someone_elses_redis_key():
    """Set up before the broker's fixture and checked after it: it must survive it."""
    with someone_elses_key() as key:
        yield key


@pytest.fixture
def celery_processes(tmp_path):
    # Never FLUSHDB: the Redis is shared. The prefix's keys alone are deleted after.
    with redis_namespace("celery") as namespace:
        processes = Processes(tmp_path, namespace)
        try:
            yield processes
        finally:
            processes.stop_all()


def test_a_silent_run_is_handed_back_and_a_killed_handoff_still_arrives_once(
    someone_elses_redis_key, transactional_db, agent, celery_processes
):
    release_first = threading.Event()
    starts: list[str] = []

    def runtime_starts_the_run(delivery: dict) -> int:
        """What a runtime does with a hand-off: start the run by its key."""
        if len(runtime.deliveries) == 1:
            # Hold the first delivery open while its worker is killed.
            release_first.wait(timeout=60)
        try:
            start_run(agent, delivery["body"]["run_key"])
            starts.append("started")
            return 200
        except AlreadyRunning:
            starts.append("already_running")
            return 409
        finally:
            connection.close()  # this thread's own connection

    with RuntimeServer(runtime_starts_the_run) as runtime:
        try:
            run = start_run(agent, "nightly-digest", heartbeat_timeout=5, restart_url=runtime.url)
            run = run.run
            effect = record_call(
                agent,
                run.pk,
                attempt=1,
                tool="send_mail",
                kind="effect",
                args={"to": "team@example.com"},
                key="digest:2026-01-05",
                key_source="intent",
            ).effect
            assert effect.status == EffectStatus.IN_FLIGHT
            last_beat = heartbeat(agent, run.pk, attempt=1).heartbeat_at  # ...then silence

            celery_processes.start("beat", "beat", "-s", str(celery_processes.tmp / "schedule"))
            first_worker = celery_processes.worker("first")

            # The schedule alone interrupts it (5 s timeout, a sweep every second).
            _wait(
                lambda: Run.objects.get(pk=run.pk).status == RunStatus.INTERRUPTED,
                40,
                "the run to be interrupted",
            )
            effect.refresh_from_db()
            assert effect.status == EffectStatus.UNKNOWN
            # The worker and beat found each other under the prefix alone.
            assert celery_processes.namespace.keys("_kombu.binding.celery")

            # The restart URL is called with the next attempt; it is held open...
            assert runtime.wait_for(1, timeout=20), celery_processes.logs()
            assert runtime.deliveries[0]["body"]["attempt"] == 2
            # ...and its worker dies mid-try.
            celery_processes.kill(first_worker)

            celery_processes.worker("second")
            # The new worker takes the dead try over once its lease has passed.
            assert runtime.wait_for(2, timeout=45), celery_processes.logs()
            _wait(lambda: "started" in starts, 10, "the second delivery to start the run")
            release_first.set()
            _wait(lambda: len(starts) == 2, 10, "the held delivery to finish")
            _wait(
                lambda: RestartHandoff.objects.get(run=run).status == "sent",
                20,
                "the hand-off to be recorded as delivered",
            )
        finally:
            release_first.set()

    keys = {d["key"] for d in runtime.deliveries}
    assert keys == {f"restart:{run.pk}:2"}
    assert {d["body"]["attempt"] for d in runtime.deliveries} == {2}
    # Exactly one new attempt, however many deliveries.
    assert sorted(starts) == ["already_running", "started"]
    assert list(Attempt.objects.filter(run=run).values_list("number", flat=True)) == [1, 2]
    run.refresh_from_db()
    assert (run.status, run.current_attempt) == (RunStatus.RUNNING, 2)
    tries = list(
        AuditEvent.objects.filter(run=run, verb="handoff_try")
        .order_by("id")
        .values_list("note", flat=True)
    )
    assert tries == ["no answer: the try stopped half-way", "delivered"]
    assert Effect.objects.get(pk=effect.pk).status == EffectStatus.UNKNOWN
    # In this order: silent past its timeout, interrupted, handed back, started again.
    silent = AuditEvent.objects.get(run=run, verb="run_interrupted")
    handed_back = AuditEvent.objects.get(run=run, verb="restart_ready")
    restarted = Attempt.objects.get(run=run, number=2)
    assert last_beat + timedelta(seconds=5) <= silent.at <= handed_back.at <= restarted.started_at
