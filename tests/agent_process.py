"""An example agent run as a process to its end, while the test plays the operator."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from approvals.decisions import approve_effect
from runs.errors import JournalError
from runs.models import Effect


def drive(
    command: list[str],
    decide: Callable[[], None] | None = None,
    *,
    env: dict[str, str],
    cwd: Path,
    timeout: float = 120,
) -> tuple[int, str]:
    """Run the agent to its end, calling ``decide()`` (the operator) while it runs;
    return its exit code and its output (standard error included)."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd
    )
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the agent did not finish: {process.communicate()[0]}")
        if decide is not None:
            decide()
        time.sleep(0.1)
    return process.returncode, process.stdout.read()


def approve_with_an_edit(operator, edit: dict[str, Any], note: str) -> None:
    """The operator edits each effect waiting for approval (``edit`` over its arguments)
    and approves it."""
    for effect in Effect.objects.filter(status="awaiting_approval"):
        with contextlib.suppress(JournalError):  # revised meanwhile: the next round sees it
            approve_effect(
                operator,
                effect.id,
                args_hash=effect.args_hash,
                note=note,
                edited_args={**effect.args, **edit},
            )
