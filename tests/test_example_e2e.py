"""The example agent, end to end: crash it at every effect position, start it again,
let a person decide what needs one, and count: every effect is in the ledger once.

The agent runs as a subprocess against a live server. While it runs, this test plays
the operator: it approves the campaign when it waits, and after a run that stopped
for a person it settles unknown effects by looking at the ledger (the provider) —
mark done when the effect is there, release when it is not — as the rules say.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest
from agent_process import drive
from example_helpers import assert_each_effect_once, crash_then_answer

from approvals.decisions import approve_effect
from runs.errors import JournalError
from runs.models import Effect

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _agent_command(live_server, agent, ledger_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(EXAMPLES / "support_agent.py"),
        "--base-url",
        live_server.url,
        "--token",
        agent.token,
        "--ticket",
        "ticket-4812",
        "--ledger",
        str(ledger_path),
        "--seed",
        "1",
        "--poll-interval",
        "0.2",
        "--approval-timeout",
        "60",
        "--heartbeat-timeout",
        "5",
        "--supersede",
        *extra,
    ]


def _approve_waiting(operator) -> None:
    """The operator approves whatever awaits approval, as shown (its current args_hash)."""
    for effect in Effect.objects.filter(status="awaiting_approval"):
        # A refusal means the agent revised it meanwhile: the next round sees the new one.
        with contextlib.suppress(JournalError):
            approve_effect(operator, effect.id, args_hash=effect.args_hash, note="e2e: looks right")


def _drive(command: list[str], operator) -> tuple[int, str]:
    """Run the agent to its end, approving while it waits."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return drive(command, lambda: _approve_waiting(operator), cwd=ROOT, env=env)


@pytest.mark.parametrize("crash_after", [1, 2, 3])
def test_the_example_survives_a_crash_after_each_effect_without_duplicates(
    crash_after, live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    command = _agent_command(live_server, agent, ledger_path)

    crash_then_answer(_drive, command, operator, ledger_path, crash_after, told="outcome_unknown")

    # The answer: each effect exactly once in the ledger.
    counter = [sys.executable, str(EXAMPLES / "count_ledger.py")]
    assert_each_effect_once(_drive, command, operator, ledger_path, counter)
