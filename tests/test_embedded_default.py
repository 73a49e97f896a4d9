"""The embedded default (no ``DATABASE_URL``: a SQLite file), through HTTP, as
``make run`` serves it to a newcomer.

The rest of the suite runs on PostgreSQL, where the hottest paths (the poll, the
token lookup) are constant SQL; on SQLite they go through the ORM, because ids
are stored there as hex text and times as naive text. A first version passed the
UUID straight to SQLite and every poll was a 500: this test is the guard.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import startsafe_client as ss
from tests.fault_helpers import ROOT, Gunicorn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _manage(var_dir: Path, *args: str) -> str:
    env = {
        **os.environ,
        "DATABASE_URL": "",
        "DEBUG": "1",
        "STARTSAFE_VAR_DIR": str(var_dir),
        "LOG_LEVEL": "WARNING",
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=180,
    ).stdout


def test_the_protocol_the_poll_and_the_console_work_on_the_sqlite_default(tmp_path):
    _manage(tmp_path, "migrate", "--noinput")
    token = _manage(tmp_path, "create_agent", "embedded-agent").strip().splitlines()[-1]
    assert (tmp_path / "startsafe.sqlite3").exists()

    # As a deployment serves it: DEBUG off, so no query is logged.
    production = {
        "DEBUG": "0",
        "SECRET_KEY": "embedded-test-" + "k" * 50,
        # Plain HTTP on loopback: the console's cookies must travel without TLS.
        "SESSION_COOKIE_SECURE": "0",
        "CSRF_COOKIE_SECURE": "0",
    }
    with Gunicorn(tmp_path, workers=2, DATABASE_URL="", **production) as server:
        auth = {"Authorization": f"Bearer {token}"}
        client = ss.Client(server.url, token, backoff=0.05, poll_interval=0.05)
        executed: list[int] = []

        @client.tool(kind="effect", key=lambda a: ss.intent_key("mail", n=a["n"]))
        def send(n: int) -> dict:
            executed.append(n)
            return {"sent": n}

        with client.run("embedded-1") as run:
            assert run.call(send, n=1) == {"sent": 1}
        # Another run redelivering the same intent: skipped with the recorded result.
        with client.run("embedded-2") as run:
            assert run.call(send, n=1) == {"sent": 1}
        assert executed == [1]

        effects = httpx.get(f"{server.url}/api/v1/effects", headers=auth).json()["items"]
        assert len(effects) == 1
        effect_id = effects[0]["id"]
        # The poll: the same effect as the list shows it, then 304 on its ETag.
        polled = httpx.get(f"{server.url}/api/v1/effects/{effect_id}", headers=auth)
        assert polled.status_code == 200, polled.text
        body = polled.json()
        assert body["action"] == "skip"
        assert body["effect"] == effects[0]
        unchanged = httpx.get(
            f"{server.url}/api/v1/effects/{effect_id}",
            headers={**auth, "If-None-Match": polled.headers["ETag"]},
        )
        assert unchanged.status_code == 304
        missing = httpx.get(
            f"{server.url}/api/v1/effects/00000000-0000-4000-8000-000000000000", headers=auth
        )
        assert missing.status_code == 404
        assert httpx.get(f"{server.url}/api/v1/effects/{effect_id}").status_code == 401

        # The console on the same file: the demo operator signs in and sees the queue.
        _manage(tmp_path, "seed_demo")
        with httpx.Client(base_url=server.url, follow_redirects=True) as browser:
            login = browser.get("/accounts/login/")
            csrf = login.text.split('name="csrfmiddlewaretoken" value="')[1].split('"')[0]
            queue = browser.post(
                "/accounts/login/",
                data={"username": "demo", "password": "demo-operator", "csrfmiddlewaretoken": csrf},
                headers={"Referer": f"{server.url}/accounts/login/"},
            )
            assert queue.status_code == 200 and str(queue.url) == f"{server.url}/"
            assert "Awaiting approval" in queue.text and 'class="item"' in queue.text
            run_page = browser.get(f"/runs/{run.id}/")
            assert run_page.status_code == 200 and "embedded-2" in run_page.text
        assert all(status < 500 for status in server.statuses()), server.statuses()
