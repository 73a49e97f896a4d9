"""The OpenAI Agents SDK adapter, end to end: a real SDK agent loop, killed, then run again.

``examples/openai_agents/ticket_agent.py`` runs as a subprocess against a live server:
an SDK ``Agent`` whose model is the SDK's own offline ``agents.testing.ScriptedModel``
(seeded: each attempt rewrites the arguments and reorders the calls), its four tools
wrapped by ``startsafe_client.openai_agents.journaled``. The first attempt
(``Runner.run_sync``, the blocking client) is SIGKILLed after a tool did its effect
and before it was reported; the second runs to the end, on the SDK's async path
(``await Runner.run``, ``AsyncClient``) or its sync one. This test plays the operator:
it approves the campaign with edited arguments, or rejects it with a note.

The ledger the tools write holds each effect exactly once; the campaign ran with the
arguments the operator approved; a rejection's note is what the model hears on its
next turn; a decision still pending past the approval timeout is a tool error that
names the console page. In-process tests drive the SDK's loop the same way for the
adapter's rules: an exception after the effect, ``NotPerformed``, a refused key, a
tool without a declaration, and the run key taken from the SDK's own identity.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    RunConfig,
    Runner,
    SQLiteSession,
    UserError,
    function_tool,
    set_tracing_disabled,
)
from agents.testing import ModelCall, ScriptedModel, assistant_message, function_call
from mcp.types import ToolAnnotations
from startsafe_client.openai_agents import journaled, run_key_for

import startsafe_client as ss
from approvals.decisions import approve_effect, reject_effect
from runs.models import Call, Effect, Run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

import ledger  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)
set_tracing_disabled(True)  # offline: the SDK exports no trace

SIGKILLED, NEEDS_PERSON = -9, 3
EDITED = {"subject": "Winter sale: 20% off (checked by marketing)", "recipients": 200}
NOTE = "Not this week: legal has not cleared the 20% claim."


def _command(live_server, agent, ledger_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(EXAMPLES / "openai_agents" / "ticket_agent.py"),
        *("--base-url", live_server.url, "--token", agent.token),
        *("--ticket", "ticket-4812", "--ledger", str(ledger_path), "--seed", "1"),
        *("--poll-interval", "0.2", "--heartbeat-timeout", "5", "--supersede"),
        *extra,
    ]


def _drive(command: list[str], decide: Callable[[Effect], None] | None = None) -> tuple[int, str]:
    """Run the agent to its end; ``decide`` is the operator, shown each effect awaiting approval."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    )
    deadline = time.monotonic() + 120
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the agent did not finish: {process.communicate()[0]}")
        if decide is not None:
            for effect in Effect.objects.filter(status="awaiting_approval"):
                decide(effect)
        time.sleep(0.2)
    return process.returncode, process.stdout.read()


def _killed_after(live_server, agent, ledger_path: Path, tool: str) -> str:
    """Attempt 1, on the sync path: SIGKILLed after ``tool`` did its effect, before reporting it."""
    command = _command(live_server, agent, ledger_path, "--runner", "sync")
    code, output = _drive([*command, "--kill-at", f"after-execute:{tool}"])
    assert code == SIGKILLED, output
    assert "(Runner.run_sync)" in output and f"!! SIGKILL after executing {tool}" in output
    return output


def _heard_on_next_turn(output: str, tool: str) -> str:
    """What the model heard from ``tool``, asserting it was on the turn after its call."""
    called = re.search(rf"model turn (\d+) calls {tool}\n", output)
    heard = re.search(rf"model turn (\d+) hears {tool}: (.*)\n", output)
    assert called and heard, output
    assert int(heard.group(1)) == int(called.group(1)) + 1, output
    return heard.group(2)


def _assert_once_each(ledger_path: Path, kinds: list[str]) -> None:
    counts = ledger.counts(ledger_path)
    assert sorted(kind for kind, _ in counts) == kinds, counts
    assert set(counts.values()) == {1}, counts


def _rewritten(tool: str) -> None:
    """The second attempt's model called ``tool`` with other arguments, on the same effect."""
    first, second = Call.objects.filter(tool=tool).order_by("attempt_number", "seq")
    assert (first.attempt_number, second.attempt_number) == (1, 2)
    assert first.args != second.args and first.effect_id == second.effect_id


def _actions(attempt: int) -> dict[str, str]:
    """The first answer to each call of that attempt, by tool."""
    return dict(Call.objects.filter(attempt_number=attempt).values_list("tool", "action"))


@pytest.mark.slow
def test_an_edited_approval_runs_as_edited_after_a_kill_and_nothing_runs_twice(
    live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    # Seed 1, attempt 1: import, reply, campaign. Killed after the reply was sent.
    _killed_after(live_server, agent, ledger_path, "send_reply")
    assert [e["kind"] for e in ledger.entries(ledger_path)] == ["import", "reply"]

    def approve_edited(effect: Effect) -> None:
        edited = {**effect.args, **EDITED}
        approve_effect(operator, effect.id, args_hash=effect.args_hash, edited_args=edited)

    # Attempt 2, on the async path: import, campaign, reply, all reworded.
    command = _command(live_server, agent, ledger_path, "--runner", "async")
    code, output = _drive(command, approve_edited)
    assert code == 0, output
    assert "(Runner.run)" in output and "ticket-4812 answered: run completed." in output

    _assert_once_each(ledger_path, ["campaign", "import", "reply"])
    campaign = ledger.find(ledger_path, "campaign", "2026-winter-eu")[1]["details"]
    assert {k: campaign[k] for k in EDITED} == EDITED  # what the operator approved ran
    assert "checked by marketing" in _heard_on_next_turn(output, "send_campaign")
    # The import was skipped (the model heard its recorded result), the reply was in
    # review (the kill left it unknown) and its lookup found it in the ledger.
    assert _actions(attempt=2) == {
        "lookup_customer": "execute",
        "import_dataset": "skip",
        "send_campaign": "wait",
        "send_reply": "review",
    }
    assert "'sha256': 'sha256:" in _heard_on_next_turn(output, "import_dataset")
    assert Effect.objects.get(tool="send_reply").decision["verb"] == "reconciled"
    _rewritten("send_reply")
    assert sorted(Effect.objects.values_list("status", flat=True)) == ["done"] * 3
    assert Run.objects.get(run_key="ticket-4812").status == "completed"


@pytest.mark.slow
def test_a_rejection_note_reaches_the_model_after_a_kill_on_the_sync_path(
    live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    _killed_after(live_server, agent, ledger_path, "import_dataset")
    assert [e["kind"] for e in ledger.entries(ledger_path)] == ["import"]

    def reject(effect: Effect) -> None:
        reject_effect(operator, effect.id, args_hash=effect.args_hash, note=NOTE)

    # Attempt 2, on the sync path: import (unknown: its lookup finds it), campaign, reply.
    command = _command(live_server, agent, ledger_path, "--runner", "sync")
    code, output = _drive(command, reject)
    assert code == 0, output
    assert "(Runner.run_sync)" in output

    assert _heard_on_next_turn(output, "send_campaign") == f"rejected by an operator: {NOTE}"
    assert f"(heard: rejected by an operator: {NOTE})" in output  # and it said so at the end
    _assert_once_each(ledger_path, ["import", "reply"])  # the campaign never ran
    assert Effect.objects.get(tool="import_dataset").decision["verb"] == "reconciled"
    assert Effect.objects.get(tool="send_campaign").status == "rejected"
    _rewritten("import_dataset")


@pytest.mark.slow
def test_a_decision_pending_past_the_timeout_is_a_tool_error_naming_the_console_page(
    live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    command = _command(live_server, agent, ledger_path, "--runner", "async")

    # Nobody decides within the second the agent waits: the model hears where to decide.
    code, output = _drive([*command, "--approval-timeout", "1"])
    assert code == NEEDS_PERSON, output
    campaign = Effect.objects.get(tool="send_campaign")
    page = f"{live_server.url}/effects/{campaign.id}/"
    assert _heard_on_next_turn(output, "send_campaign") == (
        f"not performed yet: it waits (awaiting_approval) for a person's decision at {page}"
    )
    assert f"send_campaign: decide at {page}" in output
    assert Run.objects.get(run_key="ticket-4812").status != "completed"

    def approve(effect: Effect) -> None:
        approve_effect(operator, effect.id, args_hash=effect.args_hash)

    code, output = _drive(command, approve)  # run again: the wait resumes, approved
    assert code == 0, output
    _assert_once_each(ledger_path, ["campaign", "import", "reply"])


# --- in-process: the adapter's rules on the SDK's loop ---------------------------------


def _client(live_server, agent, cls: type = ss.Client) -> Any:
    return cls(live_server.url, agent.token, poll_interval=0.05, approval_timeout=5, backoff=0.01)


def _model(*calls: tuple[str, dict[str, Any]]) -> ScriptedModel:
    """Calls these tools one turn each, then answers; records what it was sent."""
    steps: list[Any] = [[function_call(n, a, call_id=f"c{i}")] for i, (n, a) in enumerate(calls)]
    return ScriptedModel([*steps, [assistant_message("done")]])


def _heard(model: ScriptedModel) -> list[str]:
    """The tool outputs the model was sent, in order (the last turn's conversation)."""
    last: ModelCall | None = model.last_call
    items = last.input if last is not None and isinstance(last.input, list) else []
    return [str(i["output"]) for i in items if i.get("type") == "function_call_output"]


def _reply_tool(ledger_path: Path, fail: list[BaseException]) -> Any:
    """An SDK tool that sends (writes its ledger line); raises ``fail``'s next error."""

    @function_tool
    def send_reply(message_id: str, body: str) -> dict[str, str]:
        """Reply to an inbound message."""
        if fail and isinstance(fail[0], ss.NotPerformed):
            raise fail.pop(0)  # before anything was sent
        ledger.append(ledger_path, "reply", message_id, {"body": body})
        if fail:
            raise fail.pop(0)  # after it was sent: the outcome is unknown
        return {"sent": message_id}

    return send_reply


def _reply_spec(ledger_path: Path) -> ss.ToolSpec:
    def in_ledger(args: dict[str, Any], key: str | None) -> ss.Reconciliation:
        if ledger.find(ledger_path, "reply", args["message_id"]):
            return ss.Reconciliation.done("found in the ledger", {"sent": args["message_id"]})
        return ss.Reconciliation.not_done("not in the ledger")

    return ss.effect(
        key=lambda a: ss.provider_key("outlook", "message", a["message_id"]), reconcile=in_ledger
    )


def test_an_exception_after_the_effect_fails_the_sdk_run_unreported_and_the_next_reconciles(
    live_server, agent, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    tool, spec = (
        _reply_tool(ledger_path, [TimeoutError("read timed out")]),
        _reply_spec(ledger_path),
    )
    client = _client(live_server, agent)

    model = _model(("send_reply", {"message_id": "<m1>", "body": "first draft"}))
    with pytest.raises(UserError), client.run("ticket-1") as run:  # noqa: PT012
        Runner.run_sync(
            Agent(name="a", model=model, tools=journaled(run, [tool], {"send_reply": spec})), "go"
        )
    assert len(model.calls) == 1  # the model never heard "please try again"
    assert Effect.objects.get(tool="send_reply").status == "unknown"

    model = _model(("send_reply", {"message_id": "<m1>", "body": "second draft"}))
    with client.run("ticket-1") as run:
        Runner.run_sync(
            Agent(name="a", model=model, tools=journaled(run, [tool], {"send_reply": spec})), "go"
        )
    assert _heard(model) == ["{'sent': '<m1>'}"]  # what the lookup found, not a second send
    assert ledger.counts(ledger_path)[("reply", "<m1>")] == 1
    assert Effect.objects.get(tool="send_reply").decision["verb"] == "reconciled"


def test_not_performed_is_reported_failed_and_runs_when_the_model_calls_again(
    live_server, agent, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    tool = _reply_tool(ledger_path, [ss.NotPerformed("the mail server refused the connection")])
    args = {"message_id": "<m2>", "body": "hello"}
    model = _model(("send_reply", args), ("send_reply", args))

    async def answer() -> None:  # the SDK's async path, with AsyncClient
        client = _client(live_server, agent, ss.AsyncClient)
        async with client, client.run("ticket-2") as run:
            tools = journaled(run, [tool], {"send_reply": _reply_spec(ledger_path)})
            await Runner.run(Agent(name="a", model=model, tools=tools), "go")

    asyncio.run(answer())
    # The SDK's own error text for the tool (its default failure_error_function).
    assert _heard(model) == [
        "An error occurred while running the tool. Please try again.",
        "{'sent': '<m2>'}",
    ]
    assert ledger.counts(ledger_path)[("reply", "<m2>")] == 1
    assert list(Call.objects.order_by("seq").values_list("action", flat=True)) == ["execute"] * 2
    assert Effect.objects.get(tool="send_reply").status == "done"


def test_a_refused_key_is_a_tool_error_and_undeclared_tools_are_unkeyed_effects(
    live_server, agent, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"

    @function_tool
    def archive(ticket: str) -> str:
        """Archive a ticket."""
        return f"archived {ticket}"

    @function_tool
    def search(query: str) -> str:
        """Search the help center."""
        return f"3 articles about {query}"

    hinted = dataclasses.replace(search, _mcp_annotations=ToolAnnotations(read_only_hint=True))
    model = _model(
        ("send_reply", {"message_id": "", "body": "hi"}),
        ("archive", {"ticket": "4812"}),
        ("search", {"query": "winter"}),
    )
    with _client(live_server, agent) as client, client.run("ticket-3") as run:
        tools = journaled(
            run,
            [_reply_tool(ledger_path, []), archive, hinted],
            {"send_reply": _reply_spec(ledger_path)},
            trust_read_only_hints=True,
        )
        Runner.run_sync(Agent(name="a", model=model, tools=tools), "go")

    refused, archived, found = _heard(model)
    assert refused.startswith("send_reply: no key in these arguments (ValueError: ")
    assert (archived, found) == ("archived 4812", "3 articles about winter")
    assert not ledger.entries(ledger_path)  # nothing sent, nothing recorded for it
    calls = {c.tool: c for c in Call.objects.select_related("effect")}
    assert set(calls) == {"archive", "search"}
    assert calls["archive"].kind == "effect" and calls["archive"].effect.key is None
    assert calls["search"].kind == "read" and calls["search"].effect is None


def test_read_only_hints_are_not_trusted_unless_asked(live_server, agent):
    @function_tool
    def search(query: str) -> str:
        """Search the help center."""
        return "nothing"

    hinted = dataclasses.replace(search, _mcp_annotations=ToolAnnotations(read_only_hint=True))
    with _client(live_server, agent) as client, client.run("ticket-4") as run:
        model = _model(("search", {"query": "winter"}))
        Runner.run_sync(Agent(name="a", model=model, tools=journaled(run, [hinted])), "go")
    assert Call.objects.get().kind == "effect"


def test_journaled_refuses_specs_for_missing_tools_and_tools_it_cannot_wrap(db):
    @function_tool
    def search(query: str) -> str:
        """Search."""
        return ""

    with pytest.raises(ValueError, match="not given: serach"):
        journaled(None, [search], {"serach": ss.read()})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FunctionTools only"):
        journaled(None, [print])  # type: ignore[arg-type, list-item]


def test_the_run_key_comes_from_the_sdks_identity_only_when_there_is_one(tmp_path):
    session = SQLiteSession("thread-7", str(tmp_path / "sessions.db"))
    assert run_key_for(session=session) == "openai-agents:session:thread-7"
    assert run_key_for(conversation_id="conv_1") == "openai-agents:conversation:conv_1"
    assert run_key_for(run_config=RunConfig(group_id="chat-9")) == "openai-agents:group:chat-9"
    with pytest.raises(ValueError, match="never|no identity"):
        run_key_for(run_config=RunConfig())
