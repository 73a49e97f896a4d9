"""The README, followed literally by a newcomer: a fresh clone of the committed HEAD,
``make run`` in one terminal, then the README's agent-section commands, verbatim, in a
second shell in the same folder.

The commands are read out of README.md (the first ``sh`` block under each heading
below), so that the README and this test cannot drift apart.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.fault_helpers import free_port, stop_process, wait_for

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
INSTALL_HEADING = "### Install the client and create an agent"
EXAMPLE_HEADING = "## The example: crash, restart, count"


def readme_block(heading: str, readme: Path = README) -> str:
    """The first ``sh`` block under ``heading`` in README.md."""
    text = readme.read_text()
    start = text.index(f"\n{heading}\n")
    body = text.index("```sh\n", start) + len("```sh\n")
    return text[body : text.index("```", body)]


def second_terminal_commands(readme: Path = README) -> str:
    """The example's commands for the second terminal: its block without ``make run``
    (terminal 1), up to the first run of the example agent."""
    lines = []
    for line in readme_block(EXAMPLE_HEADING, readme).splitlines():
        if "examples/support_agent.py" in line:
            break
        if not line.startswith("make run"):
            lines.append(line)
    return "\n".join(lines)


def newcomer_env(**extra: str) -> dict[str, str]:
    """A newcomer's shell: none of the project's variables (every one .env.example
    names), nor this test run's make, virtualenv or Django variables."""
    names = set(re.findall(r"^([A-Z][A-Z0-9_]*)=", (ROOT / ".env.example").read_text(), re.M))
    names |= {"PORT", "DJANGO_SETTINGS_MODULE", "PYTHONPATH", "VIRTUAL_ENV", "REDIS_URL"}
    names |= {"PYTHON", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}
    env = {k: v for k, v in os.environ.items() if k not in names and not k.startswith("PYTEST")}
    return {**env, **extra}


def bash(clone: Path, script: str, env: dict[str, str], timeout: float = 300):
    """The commands in a second shell that stops at the first that fails (``-e``)."""
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_readme_shows_tokens_as_they_are():
    from runs.models import TOKEN_PREFIX

    text = README.read_text()

    assert TOKEN_PREFIX == "ss_"
    assert "sst_" not in text
    assert "ss_…" in text, "the README shows what a token looks like"


def test_the_agent_section_uses_the_projects_virtualenv():
    """Bare pip and python put the client into the system Python, and then manage.py
    fails with "No module named 'django'"."""
    for block in (readme_block(INSTALL_HEADING), second_terminal_commands()):
        commands = [line.split("#")[0].strip() for line in block.splitlines()]
        commands = [c for c in commands if c]
        assert commands
        for command in commands:
            assert not re.search(r"(^|[\s(])(pip|python3?)\s", command), command


def test_the_token_is_captured_without_hiding_a_failure():
    """``export X=$(cmd | tail -n 1)`` exits 0 when cmd fails: the form must not."""
    for block in (readme_block(INSTALL_HEADING), second_terminal_commands()):
        capture = next(line for line in block.splitlines() if "create_agent" in line)
        assert capture.startswith("STARTSAFE_TOKEN=$("), capture
        assert "|" not in capture and not capture.startswith("export")


def test_the_broker_keeps_its_control_folder_under_var(tmp_path):
    """The worker's remote control (celery's pidbox, a fanout exchange) used to leave
    kombu's default control/ folder in the current folder: the top of a clone."""
    top = tmp_path / "clone"
    top.mkdir()
    probe = (
        "import django; django.setup(); from startsafe.celery import app; "
        "app.control.ping(timeout=0.2)"
    )
    env = newcomer_env(
        DEBUG="1",
        DJANGO_SETTINGS_MODULE="startsafe.settings",
        PYTHONPATH=str(ROOT),
        STARTSAFE_VAR_DIR=str(tmp_path / "var"),
    )

    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=top, env=env, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    assert list(top.iterdir()) == []
    assert any((tmp_path / "var" / "celery" / "control").iterdir())


class MakeRun:
    """``make run`` in the background, as terminal 1: its own process group, stopped
    by its PID; its output in a log file."""

    def __init__(self, clone: Path, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                ["make", "run", f"PORT={self.port}"],
                cwd=clone,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def wait_until_serving(self) -> None:
        def serving() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"make run exited:\n{self.output()[-4000:]}")
            try:
                return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(serving, 600, f"make run serving {self.url}/healthz", every=0.5)
        wait_for(lambda: " ready." in self.output(), 120, "make run's Celery worker")

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def demo_token(self) -> str:
        printed = self.output().splitlines()
        heading = next(i for i, line in enumerate(printed) if "Token of the agent" in line)
        return printed[heading + 1].strip()

    def answers(self, token: str) -> int:
        auth = {"Authorization": f"Bearer {token}"}
        return httpx.get(f"{self.url}/api/v1/effects", headers=auth, timeout=10).status_code

    def stop(self) -> None:
        stop_process(self.process, grace=20)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_newcomer_follows_the_readme_in_a_fresh_clone(tmp_path):
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs the repository's git history to clone")
    began = time.monotonic()
    clone = tmp_path / "startsafe"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    env = newcomer_env()

    # Terminal 1.
    server = MakeRun(clone, env, tmp_path / "make-run-1.log")
    try:
        server.wait_until_serving()
        installed = time.monotonic() - began

        # Terminal 2: each agent-section block as the clone's README writes it.
        readme = clone / "README.md"
        tokens = []
        for heading, block in [
            (EXAMPLE_HEADING, second_terminal_commands(readme)),
            (INSTALL_HEADING, readme_block(INSTALL_HEADING, readme)),
        ]:
            assert "create_agent" in block, heading
            token_file = tmp_path / f"token-{len(tokens)}"
            script = f'{block}\nprintf %s "$STARTSAFE_TOKEN" > {token_file}\n'
            done = bash(clone, script, env)
            assert done.returncode == 0, f"{heading}:\n{done.stdout}\n{done.stderr}"
            token = token_file.read_text()
            assert re.fullmatch(r"ss_[A-Za-z0-9_-]{40,}", token), (heading, token, done.stderr)
            tokens.append(token)
        assert [server.answers(token) for token in tokens] == [200, 200]

        # The same commands again: create_agent fails (the agent exists), and the shell
        # stops there, loudly, saying what to do; nothing goes on with an empty token.
        token_file = tmp_path / "token-again"
        script = f'{second_terminal_commands(readme)}\necho "$STARTSAFE_TOKEN" > {token_file}'
        again = bash(clone, script, env)
        assert again.returncode != 0
        assert "exists already" in again.stderr and "--new-token" in again.stderr
        assert not token_file.exists()

        # The demo agent's token: seeding again prints the one make run printed.
        demo = server.demo_token()
        reseeded = bash(clone, ".venv/bin/python manage.py seed_demo", env)
        assert reseeded.returncode == 0, reseeded.stderr
        assert reseeded.stdout.strip().splitlines()[-1] == demo
        assert server.answers(demo) == 200
    finally:
        server.stop()

    # Later the same folder gets docker compose's .env (from .env.example: DEBUG=0,
    # the hosts db and redis), and make run starts again: its processes still run on
    # the development settings (honcho does not read that .env), and the demo token
    # printed the first time still answers, as do the agents' tokens.
    shutil.copy(clone / ".env.example", clone / ".env")
    restarted = MakeRun(clone, env, tmp_path / "make-run-2.log")
    try:
        restarted.wait_until_serving()
        assert restarted.demo_token() == demo
        assert [restarted.answers(token) for token in [demo, *tokens]] == [200, 200, 200]
    finally:
        restarted.stop()

    # Everything make run and the commands made is under var/ (and .venv/): no
    # control/ folder or any other untracked file at the top of the clone.
    assert not (clone / "control").exists()
    assert (clone / "var" / "celery" / "control").is_dir()
    assert (clone / "var" / "dev.env").is_file()
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
    )
    assert status.stdout == ""
    print(
        f"\nfresh clone to serving: {installed:.0f}s; whole test: {time.monotonic() - began:.0f}s"
    )
