"""What the fault and load tests share: the test database's URL, free loopback ports,
a real gunicorn server as a subprocess, and a bounded wait.

Subprocesses run in their own process group and are always terminated by the
fixture or ``with`` block that started them, whatever the test did.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings as django_settings

ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    """The URL of pytest-django's test database, for servers started as subprocesses."""
    db = django_settings.DATABASES["default"]
    auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"gave up after {timeout}s waiting for {what}")


def stop_process(process: subprocess.Popen, grace: float = 10) -> None:
    """SIGTERM the process group, then SIGKILL it if it lingers."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=5)


class Gunicorn:
    """``gunicorn startsafe.wsgi`` on a free loopback port against the test database.

    The access log goes to a file so the tests can count every status the server
    gave, retried or not (``statuses()``).
    """

    def __init__(self, tmp: Path, *, workers: int = 3, threads: int = 1, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.access_log = tmp / f"gunicorn-{self.port}-access.log"
        self.error_log = tmp / f"gunicorn-{self.port}-error.log"
        self.command = [
            sys.executable,
            "-m",
            "gunicorn",
            "startsafe.wsgi:application",
            "--bind",
            f"127.0.0.1:{self.port}",
            "--workers",
            str(workers),
            "--threads",
            str(threads),
            "--timeout",
            "60",
            "--graceful-timeout",
            "5",
            "--access-logfile",
            str(self.access_log),
            "--access-logformat",
            '%(s)s %(m)s "%(U)s"',
            "--error-logfile",
            str(self.error_log),
        ]
        self.env = {
            **os.environ,
            "DEBUG": "1",
            "DATABASE_URL": database_url(),
            "LOG_LEVEL": "WARNING",
            # Not under test here, and one token makes hundreds of calls a second.
            "STARTSAFE_RATE_LIMIT": "0",
            "STARTSAFE_VAR_DIR": str(tmp),
            **env,
        }
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Gunicorn:
        self.process = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for(self._answers, 30, f"gunicorn on {self.url}", every=0.2)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"gunicorn exited: {self.errors()}")
        try:
            return httpx.get(f"{self.url}/api/v1/openapi.json", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            stop_process(self.process)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def statuses(self) -> list[int]:
        """Every status in the access log (one line per request the server answered)."""
        if not self.access_log.exists():
            return []
        text = self.access_log.read_text(errors="replace")
        return [int(m) for m in re.findall(r"^(\d{3}) ", text, flags=re.MULTILINE)]

    def errors(self) -> str:
        return self.error_log.read_text(errors="replace")[-4000:] if self.error_log.exists() else ""
