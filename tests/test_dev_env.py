"""The development env file that ``make run`` writes (``var/dev.env``): the README's
second terminal reads the same DEBUG and SECRET_KEY as make run's own processes, and
a variable set in the environment always wins over the file.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from startsafe import devenv

ROOT = Path(__file__).resolve().parent.parent

# Prints what settings made of DEBUG and SECRET_KEY, and the file they read.
PROBE = (
    "import django; django.setup(); from django.conf import settings; "
    "print(settings.DEBUG, settings.SECRET_KEY, settings.DEV_ENV_FILE)"
)


def _settings_with(var_dir: Path, **env: str) -> subprocess.CompletedProcess:
    """Load the settings in a newcomer's shell: none of the project's variables set."""
    clean = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY")}
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={
            **clean,
            "DJANGO_SETTINGS_MODULE": "startsafe.settings",
            "STARTSAFE_VAR_DIR": str(var_dir),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_file_is_written_once_with_a_random_key_and_then_kept(tmp_path):
    path, created = devenv.write(tmp_path / "var")
    first = path.read_text()
    again, created_again = devenv.write(tmp_path / "var")

    assert created and not created_again and again == path
    assert path == tmp_path / "var" / "dev.env"
    assert path.read_text() == first
    assert "DEBUG=1" in first.splitlines()
    key = next(line for line in first.splitlines() if line.startswith("SECRET_KEY="))
    assert len(key.removeprefix("SECRET_KEY=")) >= 50
    # A signing key: only its owner reads it.
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Another folder (another clone) gets its own key.
    other, _ = devenv.write(tmp_path / "other")
    assert other.read_text() != first


def test_settings_read_the_file_when_nothing_is_set(tmp_path):
    path, _ = devenv.write(tmp_path)
    key = devenv.values(path)["SECRET_KEY"]

    done = _settings_with(tmp_path)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", key, str(path)]


def test_a_variable_set_in_the_environment_wins_over_the_file(tmp_path):
    path, _ = devenv.write(tmp_path)

    done = _settings_with(tmp_path, DEBUG="0", SECRET_KEY="from-the-environment-" + "x" * 40)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "from-the-environment-" + "x" * 40, str(path)]


def test_a_variable_set_empty_is_set_too(tmp_path):
    """``DEBUG=`` in the environment is off, as the strict helpers read it: not the file's 1."""
    devenv.write(tmp_path)

    done = _settings_with(tmp_path, DEBUG="")

    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "False"


def test_without_the_file_nothing_changes(tmp_path):
    done = _settings_with(tmp_path)

    assert done.returncode != 0
    assert "SECRET_KEY is required when DEBUG is off" in done.stderr
    assert not (tmp_path / "dev.env").exists()


def test_load_never_overrides_the_environment(tmp_path, monkeypatch):
    path, _ = devenv.write(tmp_path)
    monkeypatch.setenv("DEBUG", "0")
    monkeypatch.delenv("SECRET_KEY", raising=False)

    assert devenv.load(tmp_path) == path

    assert os.environ["DEBUG"] == "0"
    assert os.environ["SECRET_KEY"] == devenv.values(path)["SECRET_KEY"]


def test_load_without_the_file_reads_nothing(tmp_path):
    assert devenv.load(tmp_path) is None


def test_make_run_writes_it_where_settings_look_for_it(tmp_path):
    """``python -m startsafe.devenv`` (what make run calls) honours STARTSAFE_VAR_DIR."""
    env = {**os.environ, "STARTSAFE_VAR_DIR": str(tmp_path / "elsewhere")}

    done = subprocess.run(
        [sys.executable, "-m", "startsafe.devenv"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert (tmp_path / "elsewhere" / "dev.env").is_file()


def test_check_deploy_warns_when_the_file_was_read(tmp_path):
    devenv.write(tmp_path)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "STARTSAFE_VAR_DIR": str(tmp_path),
    }

    done = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert "startsafe.W001" in done.stdout + done.stderr
    assert str(tmp_path / "dev.env") in done.stdout + done.stderr


@pytest.mark.parametrize("line", ["var/", ".venv/", ".env"])
def test_the_docker_image_never_gets_the_development_files(line):
    """``COPY . .`` would carry var/dev.env (DEBUG=1) into /app/var, where settings read it."""
    ignored = (ROOT / ".dockerignore").read_text().splitlines()

    assert line in ignored
