"""Pydantic AI through ``startsafe_client.pydantic_ai.JournaledToolset``, on a live server.

The story (slow): ``examples/pydantic-ai/ticket_agent.py``, a real Pydantic AI agent
loop whose model is the framework's own offline ``FunctionModel`` (scripted by the
seeded fake LLM), is killed by SIGKILL right after a tool did its effect and before it
was reported. The next attempt, whose model reorders the calls and rewrites their
arguments, runs to the end, on the other path of the framework (``agent.run_sync``
with ``Client``, or ``await agent.run`` with ``AsyncClient``). Meanwhile this test
plays the operator: it rejects the campaign's first version with a note, which the
model hears and answers with a revision, and approves that revision after editing it.
The ledger holds each effect once, and the campaign ran as the operator edited it.

In process (fast): what the model sees when a decision is still pending past the
approval timeout, or when no key can be built; and a toolset given a client starts
the run named after Pydantic AI's ``run_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import (
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.toolsets import CombinedToolset
from startsafe_client.pydantic_ai import JournaledToolset

import startsafe_client as ss
from approvals.decisions import approve_effect, mark_effect_done, reject_effect
from runs.errors import JournalError
from runs.models import Call, Effect, Run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pydantic-ai" / "ticket_agent.py"
sys.path.insert(0, str(ROOT / "examples"))

import ledger  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)

NEEDS_PERSON = 3
NOTE = "Not 20%: this winter's EU offer is 15%."
EDITED_SUBJECT = "Winter offer: 15% off for EU customers"
KINDS = {"send_reply": "reply", "import_dataset": "import", "send_campaign": "campaign"}


class Operator:
    """Rejects the campaign's first version with :data:`NOTE`; approves any later one
    after editing its subject to :data:`EDITED_SUBJECT`."""

    def __init__(self, user) -> None:
        self.user = user
        self.rejected: str | None = None

    def decide(self) -> None:
        for effect in Effect.objects.filter(status="awaiting_approval", tool="send_campaign"):
            with contextlib.suppress(JournalError):  # the agent revised it meanwhile
                if self.rejected is None:
                    reject_effect(self.user, effect.id, args_hash=effect.args_hash, note=NOTE)
                    self.rejected = effect.args_hash
                elif effect.args_hash != self.rejected:
                    edited = {**effect.args, "subject": EDITED_SUBJECT}
                    approve_effect(
                        self.user,
                        effect.id,
                        args_hash=effect.args_hash,
                        note="15%, as agreed",
                        edited_args=edited,
                    )


def _command(live_server, agent, tmp_path: Path, path: str, *extra: str) -> list[str]:
    command = [
        sys.executable,
        str(EXAMPLE),
        *("--base-url", live_server.url, "--token", agent.token, "--ticket", "ticket-4812"),
        *("--ledger", str(tmp_path / "ledger.jsonl"), "--seed", "1"),
        *("--transcript", str(tmp_path / "transcript.jsonl"), "--poll-interval", "0.2"),
        *("--approval-timeout", "60", "--heartbeat-timeout", "5", "--supersede"),
        *extra,
    ]
    return [*command, "--async"] if path == "async" else command


def _drive(command: list[str], operator: Operator, timeout: float = 90) -> tuple[int, str]:
    """Run the agent to its end, deciding as the operator while it waits."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    deadline = time.monotonic() + timeout
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the agent did not finish: {process.communicate()[0]}")
        operator.decide()
        time.sleep(0.1)
    return process.returncode, process.stdout.read()


def _turns(transcript: Path) -> list[tuple[ModelRequest, ModelResponse]]:
    """Each turn of the model: what it received, and what it answered."""
    lines = transcript.read_bytes().splitlines()
    return [tuple(ModelMessagesTypeAdapter.validate_json(line)) for line in lines]


def _calls_by_attempt(turns) -> dict[int, list[ToolCallPart]]:
    calls: dict[int, list[ToolCallPart]] = {}
    for _, response in turns:
        for part in response.parts:
            if isinstance(part, ToolCallPart):
                attempt = int(part.tool_call_id.split("-")[0][1:])  # "a2-call3"
                calls.setdefault(attempt, []).append(part)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize(
    ("crashing", "finishing", "crash_after"),
    [
        ("sync", "async", 2),  # after the reply: its lookup settles it
        ("async", "sync", 3),  # after the approved campaign: a person settles it
    ],
)
def test_a_killed_agent_run_starts_again_without_duplicates_and_runs_what_was_approved(
    crashing, finishing, crash_after, live_server, agent, operator, tmp_path
):
    deciding = Operator(operator)
    transcript, ledger_path = tmp_path / "transcript.jsonl", tmp_path / "ledger.jsonl"

    first = _command(live_server, agent, tmp_path, crashing, "--crash-after", str(crash_after))
    code, output = _drive(first, deciding)
    assert code == -signal.SIGKILL, output
    assert "SIGKILL after effect" in output
    assert len(ledger.entries(ledger_path)) == crash_after  # done, never reported

    outputs = [output]
    for _ in range(2):  # run again until answered, settling as a person in between
        code, output = _drive(_command(live_server, agent, tmp_path, finishing), deciding)
        outputs.append(output)
        if code != NEEDS_PERSON:
            break
        campaign = Effect.objects.get(tool="send_campaign", status="unknown")
        assert ledger.find(ledger_path, "campaign", campaign.args["campaign_id"])
        mark_effect_done(operator, campaign.id, args_hash=campaign.args_hash, note="in the ESP")
    assert code == 0, "\n---\n".join(outputs)

    # Each effect exactly once, the campaign as the operator edited it.
    assert set(ledger.counts(ledger_path).values()) == {1}, ledger.counts(ledger_path)
    assert sorted(k for k, _ in ledger.counts(ledger_path)) == ["campaign", "import", "reply"]
    sent = {e["kind"]: e["details"] for e in ledger.entries(ledger_path)}
    assert sent["campaign"]["subject"] == EDITED_SUBJECT
    effects = {e.tool: e for e in Effect.objects.all()}
    assert {e.status for e in effects.values()} == {"done"}
    assert effects["send_campaign"].args["subject"] == EDITED_SUBJECT
    assert sent["reply"]["subject"] == effects["send_reply"].args["subject"]  # attempt 1's
    run = Run.objects.get(run_key="ticket-4812")
    assert run.status == "completed" and run.current_attempt >= 2

    turns = _turns(transcript)
    calls = _calls_by_attempt(turns)
    # The second attempt's model reordered the calls and rewrote the arguments.
    order = {n: [c.tool_name for c in calls[n] if c.tool_name != "lookup_customer"] for n in (1, 2)}
    assert order[1] != order[2], order
    replies = {n: [c.args for c in calls[n] if c.tool_name == "send_reply"] for n in (1, 2)}
    if replies[1] and replies[2]:
        assert replies[1][0]["subject"] != replies[2][0]["subject"] or (
            replies[1][0]["body"] != replies[2][0]["body"]
        )

    # The rejection's note was the tool's output, and the model's next turn revised it.
    heard = [
        (i, part)
        for i, (request, _) in enumerate(turns)
        for part in request.parts
        if isinstance(part, ToolReturnPart) and part.tool_name == "send_campaign"
    ]
    rejected = [i for i, part in heard if part.content == f"rejected by an operator: {NOTE}"]
    assert len(rejected) == 1, heard
    (revision,) = turns[rejected[0]][1].parts
    assert isinstance(revision, ToolCallPart) and revision.tool_name == "send_campaign"
    assert revision.args["subject"].endswith("(revised after review)")

    if crash_after == 3:  # the campaign, in doubt: the model was told where a person decides
        pending = [p for _, p in heard if p.outcome == "failed"]
        assert [f"/effects/{effects['send_campaign'].id}/" in p.content for p in pending] == [True]
        assert effects["send_campaign"].decision["verb"] == "marked_done"
    else:
        assert effects["send_reply"].decision["verb"] == "reconciled"


# --- in process -----------------------------------------------------------------------


def scripted(*calls: tuple[str, dict], seen: list | None = None) -> FunctionModel:
    """A ``FunctionModel`` that makes these calls, one per turn, then answers "done";
    ``seen`` collects the parts of every request it received."""
    todo = list(calls)

    def model(messages, info) -> ModelResponse:
        if seen is not None:
            seen.extend(messages[-1].parts)
        if not todo:
            return ModelResponse(parts=[TextPart("done")])
        name, args = todo.pop(0)
        return ModelResponse(parts=[ToolCallPart(name, args, tool_call_id=f"c{len(todo)}")])

    return FunctionModel(model)


def test_a_pending_approval_is_a_tool_error_naming_the_console_page_and_a_missing_key_a_retry(
    live_server, agent
):
    ran: list[str] = []

    def send_campaign(campaign_id: str, subject: str) -> dict:
        ran.append(subject)
        return {"sent": subject}

    def send_reply(message_id: str = "", body: str = "") -> str:
        ran.append(body)
        return "sent"

    specs = {
        "send_campaign": ss.effect(
            key=lambda a: ss.intent_key("campaign", campaign_id=a["campaign_id"]),
            needs_approval=True,
        ),
        "send_reply": ss.effect(
            key=lambda a: ss.provider_key("outlook", "message", a["message_id"])
        ),
    }
    seen: list = []
    model = scripted(
        ("send_reply", {"message_id": "", "body": "Hello"}),  # no key in these arguments
        ("send_campaign", {"campaign_id": "winter", "subject": "20% off"}),
        seen=seen,
    )

    async def main() -> JournaledToolset:
        options = {"approval_timeout": 0.3, "poll_interval": 0.05}
        client = ss.AsyncClient(live_server.url, agent.token, **options)
        async with client, client.run("ticket-5") as run:
            journaled = JournaledToolset(run, FunctionToolset([send_campaign, send_reply]), specs)
            result = await Agent(model).run("go", toolsets=[journaled])
            assert result.output == "done"
            return journaled

    journaled = asyncio.run(main())

    effect = Effect.objects.get(tool="send_campaign")
    assert ran == [] and effect.status == "awaiting_approval"
    returns = {p.tool_name: p for p in seen if isinstance(p, ToolReturnPart)}
    # Pending: a failed tool result naming the page where a person decides, not a retry.
    assert returns["send_campaign"].outcome == "failed"
    assert f"/effects/{effect.id}/" in returns["send_campaign"].content
    assert [w.effect_id for w in journaled.waiting] == [str(effect.id)]
    # No key: the model is asked to fix its arguments; nothing was recorded.
    assert returns["send_reply"].outcome == "retried"
    assert "no key in these arguments" in str(returns["send_reply"].content)
    assert not Call.objects.filter(tool="send_reply").exists()


@pytest.mark.parametrize("trust_annotations", [True, False])
def test_given_a_client_the_toolset_starts_the_run_named_after_the_agent_runs_run_id(
    trust_annotations, live_server, agent
):
    def peek_ticket(ticket: str) -> str:  # an MCP-style tool marked read-only
        return f"{ticket}: open"

    def note_ticket(ticket: str, text: str) -> str:  # declared nowhere
        return "noted"

    tools = CombinedToolset(
        [
            FunctionToolset([peek_ticket]).with_metadata(annotations={"readOnlyHint": True}),
            FunctionToolset([note_ticket]),
        ]
    )
    model = scripted(
        ("peek_ticket", {"ticket": "t-7"}), ("note_ticket", {"ticket": "t-7", "text": "seen"})
    )
    with ss.Client(live_server.url, agent.token) as client:
        journaled = JournaledToolset(
            client,
            tools,
            trust_annotations=trust_annotations,
            run_options={"title": "Ticket 7"},
        )
        result = Agent(model).run_sync("go", toolsets=[journaled], run_id="ticket-7")
    assert result.output == "done"

    run = Run.objects.get(run_key="pydantic-ai:ticket-7")
    assert (run.status, run.title) == ("completed", "Ticket 7")
    kinds = dict(Call.objects.filter(run=run).values_list("tool", "kind"))
    assert kinds == {
        "peek_ticket": "read" if trust_annotations else "effect",
        "note_ticket": "effect",
    }
    assert Effect.objects.get(tool="note_ticket").key is None  # an unkeyed effect


@pytest.mark.parametrize("failing", ["tool", "model"])
def test_an_agent_run_that_raises_ends_the_toolsets_attempt_failed(failing, live_server, agent):
    """The attempt the toolset started ends ``failed`` whether a tool raised (its effect
    is then unknown: an exception is not proof that nothing happened) or the model did
    after the effect was done, although Pydantic AI exits toolsets without the error."""
    sent: list[str] = []

    def send_reply(message_id: str, body: str) -> str:
        sent.append(body)
        if failing == "tool":
            raise TimeoutError("the mail server took the message, then the answer timed out")
        return "sent"

    def model(messages, info) -> ModelResponse:
        if len(messages) > 1:
            raise TimeoutError("the model's provider timed out")
        call = ToolCallPart("send_reply", {"message_id": "m-8", "body": "Hello"}, tool_call_id="c")
        return ModelResponse(parts=[call])

    specs = {"send_reply": ss.effect(key=lambda a: ss.provider_key("m", "msg", a["message_id"]))}
    with ss.Client(live_server.url, agent.token) as client:
        journaled = JournaledToolset(client, FunctionToolset([send_reply]), specs)
        with pytest.raises(TimeoutError):
            Agent(FunctionModel(model)).run_sync("go", toolsets=[journaled], run_id="ticket-8")

    run = Run.objects.get(run_key="pydantic-ai:ticket-8")
    assert run.status == "failed" and "TimeoutError" in run.attempts.get().error
    assert sent == ["Hello"]
    effect = Effect.objects.get(tool="send_reply")
    assert effect.status == ("unknown" if failing == "tool" else "done")  # never "failed"
