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

import os
from pathlib import Path

import pytest
from agent_process import approve_with_an_edit, drive
from example_helpers import assert_each_effect_once, crash_then_answer, ledger
from test_typescript_client import built  # noqa: F401 (the fixture: npm ci, tsc, build)

from runs.models import Effect

PACKAGE = Path(__file__).resolve().parent.parent / "clients" / "typescript"
EDITED = {"subject": "Winter sale: 20% off (checked by marketing)", "recipients": 200}

pytestmark = [pytest.mark.node, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


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


def _drive(command: list[str], operator) -> tuple[int, str]:
    """Run the agent to its end; while the campaign waits, approve it edited."""
    note = "e2e: subject and audience checked by marketing"
    return drive(
        command,
        lambda: approve_with_an_edit(operator, EDITED, note),
        env=dict(os.environ),
        cwd=PACKAGE,
        timeout=60,
    )


@pytest.mark.usefixtures("built")
@pytest.mark.parametrize("crash_after", [1, 2, 3])
def test_the_ai_sdk_example_survives_a_crash_after_each_effect_without_duplicates(
    crash_after, live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    command = _command(live_server, agent, ledger_path)

    outputs = crash_then_answer(
        _drive, command, operator, ledger_path, crash_after, told="do not try it again"
    )

    # While the campaign waited, the run named its page in the console.
    campaign = Effect.objects.get(tool="send_campaign")
    page = f"{live_server.url}/effects/{campaign.id}/"
    said = f"send_campaign: waiting (awaiting_approval) for a decision at {page}"
    assert said in "".join(outputs)

    # The answer: each effect exactly once in the ledger, the campaign as edited.
    counter = ["node", str(PACKAGE / "examples" / "count-ledger.mjs")]
    assert_each_effect_once(_drive, command, operator, ledger_path, counter)
    sent = ledger.find(ledger_path, "campaign", "2026-winter-eu")[1]["details"]
    assert sent == {"segment": "EU", **EDITED}
