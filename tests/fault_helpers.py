"""What the fault and load tests share: the test database's URL, free loopback ports,
a real gunicorn server as a subprocess (with docker-compose.yml's flags if asked),
nginx with the repository's config in front of it, and a bounded wait.

Subprocesses run in their own process group and are always terminated by the
fixture or ``with`` block that started them, whatever the test did.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml
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

    def __init__(
        self,
        tmp: Path,
        *,
        workers: int = 3,
        threads: int = 1,
        compose_flags: bool = False,
        **env: str,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.access_log = tmp / f"gunicorn-{self.port}-access.log"
        self.error_log = tmp / f"gunicorn-{self.port}-error.log"
        self.command = [sys.executable, "-m", "gunicorn"]
        if compose_flags:
            # Production's command line: no access log of ours, no statuses().
            self.command += compose_gunicorn_args(port=self.port, workers=workers)
        else:
            self.command += self._flags(workers, threads)
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

    def _flags(self, workers: int, threads: int) -> list[str]:
        return [
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


COMPOSE_FILE = ROOT / "docker-compose.yml"
NGINX_CONF = ROOT / "deploy" / "nginx.conf"


def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose_gunicorn_args(*, port: int, workers: int) -> list[str]:
    """The web service's gunicorn arguments in docker-compose.yml, as they are, but
    bound to a loopback port and with ``workers`` in place of ``WEB_CONCURRENCY``."""
    command = compose()["services"]["web"]["command"]
    match = re.search(r"exec gunicorn (.*?)\"", command, flags=re.DOTALL)
    assert match, f"no 'exec gunicorn' in the web service's command: {command}"
    args = shlex.split(match.group(1))
    replaced = {"0.0.0.0:8000": f"127.0.0.1:{port}", "$${WEB_CONCURRENCY:-4}": str(workers)}
    assert set(replaced) <= set(args), args
    return [replaced.get(arg, arg) for arg in args]


def nginx_binary() -> str | None:
    """Debian's nginx (``/usr/sbin`` may be missing from a user's PATH)."""
    found = shutil.which("nginx")
    if found is None and os.access("/usr/sbin/nginx", os.X_OK):
        found = "/usr/sbin/nginx"
    return found


def nginx_config(tmp: Path, *, port: int, upstream: str) -> Path:
    """deploy/nginx.conf as a run outside docker needs it, and the main config it goes in.

    Two lines of the repository's file change, each found exactly once: the listen
    address (a loopback port, not the container's 80) and the web service's address
    (``upstream``, not the compose name ``web:8000``). The main config stands in for
    the one nginx's official image puts around it, with every path under ``tmp``.
    """
    text = NGINX_CONF.read_text()
    for old, new in (
        ("listen 80;", f"listen 127.0.0.1:{port};"),
        ("set $startsafe_web web:8000;", f"set $startsafe_web {upstream};"),
    ):
        assert text.count(old) == 1, f"deploy/nginx.conf should have {old!r} once"
        text = text.replace(old, new)
    (tmp / "startsafe.conf").write_text(text)
    # As root, nginx's workers would run as "nobody", which cannot write under tmp;
    # the image runs them as its own user, who owns its temporary folders.
    user = "user root;" if os.geteuid() == 0 else ""
    main = tmp / "nginx.conf"
    main.write_text(
        f"""
{user}
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/nginx-access.log;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    include {tmp}/startsafe.conf;
}}
"""
    )
    return main


class Nginx:
    """nginx with deploy/nginx.conf (``nginx_config``) on a free loopback port, in
    front of ``upstream`` (host:port)."""

    def __init__(self, tmp: Path, upstream: str) -> None:
        binary = nginx_binary()
        assert binary, "nginx is missing: apt-get install -y nginx (make test does it as root)"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp = tmp
        self.config = nginx_config(tmp, port=self.port, upstream=upstream)
        self.command = [binary, "-c", str(self.config)]
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Nginx:
        self.process = subprocess.Popen(
            self.command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for(self._listens, 10, f"nginx on {self.url}")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _listens(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"nginx exited: {self.errors()}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            stop_process(self.process)

    def errors(self) -> str:
        log = self.tmp / "nginx-error.log"
        return log.read_text(errors="replace")[-4000:] if log.exists() else ""
