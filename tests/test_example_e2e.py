"""The example agent, end to end: crash it at every effect position, start it again,
let a person decide what needs one, and count: every effect is in the ledger once.

The agent runs as a subprocess against a live server. While it runs, this test plays
the operator: it approves the campaign when it waits, and after a run that stopped
for a person it settles unknown effects by looking at the ledger (the provider) —
mark done when the effect is there, release when it is not — as the rules say.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from approvals.decisions import approve_effect, mark_effect_done, release_effect
from runs.errors import JournalError
from runs.models import Effect, Run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

import ledger  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CRASHED, NEEDS_PERSON = 137, 3
LEDGER_KIND = {"send_reply": "reply", "import_dataset": "import", "send_campaign": "campaign"}


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


def _drive(command: list[str], operator, timeout: float = 120) -> tuple[int, str]:
    """Run the agent to its end, approving while it waits; return its exit code and output."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the agent did not finish: {process.communicate()[0]}")
        _approve_waiting(operator)
        time.sleep(0.2)
    return process.returncode, process.stdout.read()


def _settle_unknowns(operator, ledger_path: Path) -> None:
    """A person looks each unknown effect up at the provider (the ledger) and decides."""
    for effect in Effect.objects.filter(status="unknown"):
        kind = LEDGER_KIND[effect.tool]
        identity = {
            "reply": effect.args.get("message_id"),
            "import": effect.key,
            "campaign": effect.args.get("campaign_id"),
        }[kind]
        if ledger.find(ledger_path, kind, identity):
            mark_effect_done(
                operator, effect.id, args_hash=effect.args_hash, note=f"found in the {kind} log"
            )
        else:
            release_effect(
                operator, effect.id, args_hash=effect.args_hash, note=f"not in the {kind} log"
            )


@pytest.mark.parametrize("crash_after", [1, 2, 3])
def test_the_example_survives_a_crash_after_each_effect_without_duplicates(
    crash_after, live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    command = _agent_command(live_server, agent, ledger_path)

    code, output = _drive([*command, "--crash-after", str(crash_after)], operator)
    assert code == CRASHED, output
    assert len(ledger.entries(ledger_path)) == crash_after  # it did them, then died
    crashed_kind = ledger.entries(ledger_path)[-1]["kind"]

    outputs, codes = [output], []
    for _ in range(3):  # run again until answered, deciding between runs as a person
        code, output = _drive(command, operator)
        outputs.append(output)
        codes.append(code)
        if code != NEEDS_PERSON:
            break
        _settle_unknowns(operator, ledger_path)
    assert code == 0, "\n---\n".join(outputs)

    # The effect caught between doing and reporting: the reply and the import settle
    # themselves through their lookup; the campaign has none, so a person decided.
    crashed = Effect.objects.get(tool=[t for t, k in LEDGER_KIND.items() if k == crashed_kind][0])
    if crashed_kind == "campaign":
        assert codes[0] == NEEDS_PERSON and "outcome_unknown" in outputs[1]
        assert crashed.decision["verb"] == "marked_done"
    else:
        assert codes == [0]
        assert crashed.decision["verb"] == "reconciled"

    # The answer: each effect exactly once in the ledger.
    counts = ledger.counts(ledger_path)
    assert sorted(kind for kind, _ in counts) == ["campaign", "import", "reply"]
    assert set(counts.values()) == {1}, counts
    counted = subprocess.run(
        [sys.executable, str(EXAMPLES / "count_ledger.py"), str(ledger_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert counted.returncode == 0 and "duplicates: 0" in counted.stdout, counted.stdout

    # The database: the run completed on a later attempt, its effects all done.
    run = Run.objects.get(run_key="ticket-4812")
    assert run.status == "completed" and run.current_attempt >= 2
    assert sorted(Effect.objects.values_list("status", flat=True)) == ["done"] * 3

    # Running it once more changes nothing: the run is finished.
    code, output = _drive(command, operator)
    assert code == 0 and "already answered" in output
    assert ledger.counts(ledger_path) == counts
