"""The TypeScript example on the Vercel AI SDK, end to end: crash it after each effect,
start it again, let a person decide, and count: every effect is in the ledger once.

``clients/typescript/examples/support-agent.mjs`` runs as a Node subprocess against a
live server: ``generateText`` with the SDK's mock model (``ai/test``), seeded so that
each attempt rewrites the arguments and reorders the calls, and four ``tool()``s
journaled by ``startsafe-client/ai``. The first run exits abruptly (``--crash-after N``)
right after its N-th effect and before reporting it; later runs go on to the end. This
test plays the operator: while the campaign waits it approves it with *edited*
arguments, and after a run that stopped for a person it settles the unknown effect by
looking at the ledger (the provider), as the Python example's test does.

The ledger the tools write (the Python example's format) holds each effect exactly
once, and the campaign ran with the operator's arguments, not the model's. The
adapter's own tests (clients/typescript/test/ai.test.ts) run with the client's, from
tests/test_typescript_client.py, whose build this test shares.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from approvals.decisions import approve_effect
from runs.errors import JournalError
from runs.models import Effect, Run

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "clients" / "typescript"
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ledger  # noqa: E402
from test_example_e2e import LEDGER_KIND, _settle_unknowns  # noqa: E402
from test_typescript_client import built  # noqa: E402, F401 (the fixture: npm ci, tsc)

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CRASHED, NEEDS_PERSON = 137, 3
EDITED = {"subject": "Winter sale: 20% off (checked by marketing)", "recipients": 200}


def _command(live_server, agent, ledger_path: Path, *extra: str) -> list[str]:
    return [
        "node",
        str(PACKAGE / "examples" / "support-agent.mjs"),
        *("--base-url", live_server.url, "--token", agent.token),
        *("--ticket", "ticket-4812", "--ledger", str(ledger_path), "--seed", "1"),
        *("--poll-interval", "0.2", "--approval-timeout", "60", "--heartbeat-timeout", "5"),
        "--supersede",
        *extra,
    ]


def _approve_edited(operator) -> None:
    """The operator approves the waiting campaign after editing its subject and size."""
    for effect in Effect.objects.filter(status="awaiting_approval"):
        # A refusal means the agent revised it meanwhile: the next round sees the new one.
        with contextlib.suppress(JournalError):
            approve_effect(
                operator,
                effect.id,
                args_hash=effect.args_hash,
                edited_args={**effect.args, **EDITED},
                note="e2e: subject and audience checked by marketing",
            )


def _drive(command: list[str], operator, timeout: float = 60) -> tuple[int, str]:
    """Run the agent to its end, approving while it waits; its exit code and output."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=PACKAGE
    )
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the agent did not finish: {process.communicate()[0]}")
        _approve_edited(operator)
        time.sleep(0.1)
    return process.returncode, process.stdout.read()


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("crash_after", [1, 2, 3])
def test_the_ai_sdk_example_survives_a_crash_after_each_effect_without_duplicates(
    crash_after, live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    command = _command(live_server, agent, ledger_path)

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
    crashed = Effect.objects.get(tool=next(t for t, k in LEDGER_KIND.items() if k == crashed_kind))
    if crashed_kind == "campaign":
        assert codes[0] == NEEDS_PERSON and "do not try it again" in outputs[1]
        assert crashed.decision["verb"] == "marked_done"
    else:
        assert codes == [0]
        assert crashed.decision["verb"] == "reconciled"

    # While the campaign waited, the run named its page in the console.
    campaign = Effect.objects.get(tool="send_campaign")
    page = f"{live_server.url}/effects/{campaign.id}/"
    said = f"send_campaign: waiting (awaiting_approval) for a decision at {page}"
    assert said in "".join(outputs)

    # The answer: each effect exactly once in the ledger, the campaign as edited.
    counts = ledger.counts(ledger_path)
    assert sorted(kind for kind, _ in counts) == ["campaign", "import", "reply"]
    assert set(counts.values()) == {1}, counts
    sent = ledger.find(ledger_path, "campaign", "2026-winter-eu")[1]["details"]
    assert sent == {"segment": "EU", **EDITED}
    counted = subprocess.run(
        ["node", str(PACKAGE / "examples" / "count-ledger.mjs"), str(ledger_path)],
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
