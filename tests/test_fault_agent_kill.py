"""The example agent killed with SIGKILL at each point of the protocol, then restarted.

Each case kills the agent once (``examples/kill_points.py``): before a call is
recorded, between record and execute, between execute and complete, during a
heartbeat, and while it waits for a person's approval. Then the agent is started
again (``--supersede``, as its runtime would) until the ticket is answered, and this
test plays the person the rules call for: it approves what awaits approval, and
settles an unknown outcome the agent cannot look up itself by looking at the
provider (the ledger) — mark done when the effect is there, release when it is not.

What must hold, whatever the point:
1. the ledger (the providers) holds each of the three effects exactly once;
2. no result is lost: every effect is ``done``, and an effect the agent reported
   (or settled by its lookup) carries the result that matches the ledger;
3. no argument version is lost: every argument hash a call sent is a version of
   its effect;
4. no decision is lost: every decision this test made as a person is the effect's
   audit trail, and the attempts tell the whole restart story.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from example_helpers import LEDGER_KIND, in_the_ledger

from approvals.decisions import approve_effect, mark_effect_done, release_effect
from runs.errors import JournalError
from runs.models import Attempt, AuditEvent, Call, Effect, EffectVersion, Run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

import ledger  # noqa: E402

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(150),
    pytest.mark.django_db(transaction=True),
]

KILLED, NEEDS_PERSON = -signal.SIGKILL, 3
EFFECT_TOOLS = tuple(LEDGER_KIND)


def _command(live_server, agent, ledger_path: Path, *extra: str) -> list[str]:
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
        "30",
        "--heartbeat-timeout",
        "5",
        "--supersede",
        *extra,
    ]


class Person:
    """The operator: every decision taken is remembered, to find it again afterwards."""

    def __init__(self, operator, ledger_path: Path) -> None:
        self.operator = operator
        self.ledger_path = ledger_path
        self.decisions: list[tuple[str, str]] = []  # (verb, effect id)

    def approve_waiting(self) -> None:
        for effect in Effect.objects.filter(status="awaiting_approval"):
            # A refusal means the agent revised it meanwhile: the next round sees it.
            with contextlib.suppress(JournalError):
                approve_effect(
                    self.operator, effect.id, args_hash=effect.args_hash, note="fault: approved"
                )
                self.decisions.append(("approved", str(effect.id)))

    def settle_unknowns(self) -> None:
        """Look each unknown effect up at the provider (the ledger) and decide."""
        for effect in Effect.objects.filter(status="unknown"):
            if in_the_ledger(self.ledger_path, effect):
                mark_effect_done(
                    self.operator, effect.id, args_hash=effect.args_hash, note="in the ledger"
                )
                self.decisions.append(("marked_done", str(effect.id)))
            else:
                release_effect(
                    self.operator, effect.id, args_hash=effect.args_hash, note="not in the ledger"
                )
                self.decisions.append(("released", str(effect.id)))


def _drive(command: list[str], person: Person | None, timeout: float = 60) -> tuple[int, str]:
    """Run the agent to its end, approving while it waits (unless ``person`` is None)."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    deadline = time.monotonic() + timeout
    try:
        while process.poll() is None:
            if time.monotonic() > deadline:
                pytest.fail(f"the agent did not finish: {command[-4:]}")
            if person is not None:
                person.approve_waiting()
            time.sleep(0.1)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=5)
    return process.returncode, process.stdout.read()


CASES = [
    *(pytest.param(f"before-record:{t}", id=f"before-record-{t}") for t in EFFECT_TOOLS),
    *(pytest.param(f"after-record:{t}", id=f"after-record-{t}") for t in EFFECT_TOOLS),
    *(pytest.param(f"after-execute:{t}", id=f"after-execute-{t}") for t in EFFECT_TOOLS),
    pytest.param("heartbeat", id="during-heartbeat"),
    pytest.param("waiting-approval", id="waiting-for-approval"),
]


@pytest.mark.parametrize("kill_at", CASES)
def test_an_agent_killed_at_each_point_of_the_protocol_loses_and_repeats_nothing(
    kill_at, live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    person = Person(operator, ledger_path)
    command = _command(live_server, agent, ledger_path)
    waiting_case = kill_at == "waiting-approval"
    extra = ["--kill-at", kill_at]
    if kill_at == "heartbeat":
        extra += ["--think", "1"]  # heartbeats every 5/3 s come while the model thinks

    # 1. The kill. While it waits for approval nobody decides, so it dies waiting.
    code, output = _drive([*command, *extra], None if waiting_case else person)
    assert code == KILLED, output
    assert "!! SIGKILL" in output
    effects_before = ledger.counts(ledger_path)
    if waiting_case:
        # The person decides while the agent is dead: the decision must survive.
        person.approve_waiting()
        assert [verb for verb, _ in person.decisions] == ["approved"]

    # 2. Start it again until the ticket is answered, deciding as a person between runs.
    outputs = [output]
    for _ in range(4):
        code, output = _drive(command, person)
        outputs.append(output)
        if code != NEEDS_PERSON:
            break
        person.settle_unknowns()
    transcript = "\n---\n".join(outputs)
    assert code == 0, transcript

    # 3. The providers: each effect exactly once, whatever was done before the kill.
    counts = ledger.counts(ledger_path)
    assert sorted(kind for kind, _ in counts) == ["campaign", "import", "reply"], transcript
    assert set(counts.values()) == {1}, counts
    assert all(effects_before[k] <= 1 for k in effects_before)

    # 4. The database: the run completed on a later attempt; every earlier attempt ended.
    run = Run.objects.get(run_key="ticket-4812")
    assert run.status == "completed" and run.current_attempt >= 2
    attempts = list(Attempt.objects.filter(run=run).order_by("number"))
    assert [a.number for a in attempts] == list(range(1, run.current_attempt + 1))
    assert attempts[-1].status == "completed"
    assert all(a.status in ("superseded", "failed", "interrupted") for a in attempts[:-1])

    # No result lost: each effect is done; what the agent (or its lookup) reported
    # matches the ledger line that the effect wrote.
    effects = {e.tool: e for e in Effect.objects.filter(agent=agent)}
    assert sorted(effects) == sorted(EFFECT_TOOLS)
    for tool, effect in effects.items():
        assert effect.status == "done", (tool, effect.status, transcript)
        verb = (effect.decision or {}).get("verb")
        if verb == "marked_done":
            continue  # a person's note is the outcome (the ledger proves it happened)
        assert effect.result, (tool, effect.decision)
        if tool == "send_reply":
            assert effect.result["in_reply_to"] == effect.args["message_id"]
        elif tool == "import_dataset":
            assert effect.result.get("sha256", effect.key) == effect.key
        else:
            assert effect.result["campaign_id"] == effect.args["campaign_id"]

    # No argument version lost: every hash a call sent is a version of its effect
    # (the rewrites of later attempts are kept as drift, never dropped).
    for call in Call.objects.filter(run=run, effect__isnull=False):
        versions = EffectVersion.objects.filter(effect=call.effect)
        versions = set(versions.values_list("args_hash", flat=True))
        assert call.args_hash in versions, (call.tool, call.args_hash)

    # No decision lost: each one this test took is in the audit log, by this person,
    # and the last one on each effect is its current decision.
    for verb, effect_id in person.decisions:
        assert AuditEvent.objects.filter(
            effect_id=effect_id, actor=operator.username, verb__icontains=verb.split("_")[0]
        ).exists(), (verb, effect_id)
    for effect in effects.values():
        mine = [v for v, e in person.decisions if e == str(effect.id)]
        if mine and mine[-1] != "approved":
            assert effect.decision["verb"] == mine[-1]

    settled = {t: (e.decision or {}).get("verb", "reported") for t, e in effects.items()}
    print(
        f"\nkill {kill_at}: agent runs {len(outputs)}, attempts {len(attempts)}, "
        f"ledger effects {sum(counts.values())} ({len(counts)} distinct, duplicates "
        f"{sum(counts.values()) - len(counts)}), person's decisions {len(person.decisions)}, "
        f"calls {Call.objects.filter(run=run).count()}, settled {settled}"
    )
