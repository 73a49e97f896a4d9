"""The LangChain adapter in a real LangGraph agent loop (``create_agent``, its
``ToolNode``) with LangChain's own offline model, against a live server.

The agent is ``examples/langchain/agent.py``, run as a process: its model is
``GenericFakeChatModel`` playing ``fake_llm.FakeLLM``'s seeded plan (order and
wording change on every attempt). This test plays the operator while it runs, and
reads what the model was shown in each turn from its transcript.

1. SIGKILL after a tool did its effect and before it was reported (sync ``invoke``),
   then an attempt that reorders and rewrites its calls (``ainvoke`` on
   ``AsyncClient``) and runs to the end: each effect is in the ledger once, and the
   campaign ran with the arguments the operator edited and approved.
2. A campaign still pending past the approval timeout reaches the model as a tool
   error naming its console page (``ainvoke``); in the next attempt (``invoke``)
   the operator rejects it while it waits, and the model reads the operator's note
   as the tool's output in its next turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from agent_process import approve_with_an_edit, drive
from langchain_core.messages import AIMessage
from langchain_core.tools import StructuredTool, ToolException, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from startsafe_client.langchain import journaled, run_key_for

import startsafe_client as ss
from approvals.decisions import reject_effect
from runs.errors import JournalError
from runs.models import Call, Effect, Run

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))

import ledger  # noqa: E402 (examples/ledger.py: the providers' log the tools write)

pytestmark = pytest.mark.django_db(transaction=True)

NEEDS_PERSON = 3
EDIT = {"subject": "Winter offer: 15% off (edited by an operator)", "recipients": 200}
NOTE = "Hold it: the spring prices are not final yet."


def _command(live_server, agent, tmp_path: Path, ticket: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(EXAMPLES / "langchain" / "agent.py"),
        *("--base-url", live_server.url, "--token", agent.token, "--ticket", ticket),
        *("--ledger", str(tmp_path / "ledger.jsonl"), "--seed", "1"),
        *("--transcript", str(tmp_path / "transcript.jsonl")),
        *("--poll-interval", "0.2", "--approval-timeout", "60", "--heartbeat-timeout", "5"),
        *extra,
    ]


def _drive(command: list[str], decide=None) -> tuple[int, str]:
    """Run the agent to its end, calling ``decide()`` (the operator) while it runs."""
    return drive(command, decide, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=ROOT)


def _approve_with_an_edit(operator) -> None:
    """The operator edits the waiting campaign (subject, recipients) and approves it."""
    approve_with_an_edit(
        operator, EDIT, "approved with a softer subject and the opted-in recipients only"
    )


def _reject(operator) -> None:
    """The operator rejects the waiting campaign, with a note for the model."""
    for effect in Effect.objects.filter(status="awaiting_approval", args_versions__gt=1):
        with contextlib.suppress(JournalError):
            reject_effect(operator, effect.id, args_hash=effect.args_hash, note=NOTE)


def _transcript(tmp_path: Path, attempt: int) -> list[dict[str, Any]]:
    """Each turn of an attempt: what the model was shown (``messages``, LangChain's
    message dicts) and what it answered (``answer``)."""
    lines = (tmp_path / "transcript.jsonl").read_text().splitlines()
    return [turn for turn in map(json.loads, lines) if turn["attempt"] == attempt]


def _turns(tmp_path: Path, attempt: int) -> list[list[dict[str, Any]]]:
    return [turn["messages"] for turn in _transcript(tmp_path, attempt)]


def _calls(tmp_path: Path, attempt: int) -> list[tuple[str, dict[str, Any]]]:
    """The tool calls the model made in an attempt, in order."""
    return [
        (call["name"], call["args"])
        for turn in _transcript(tmp_path, attempt)
        for call in turn["answer"]["data"].get("tool_calls", [])
    ]


def _answer_in_next_turn(turns, tool: str) -> dict[str, Any]:
    """The tool's answer, as the model read it in the turn right after its call."""
    for number, turn in enumerate(turns):
        last, before = turn[-1], turn[-2]
        calls = before["data"].get("tool_calls", []) if before["type"] == "ai" else []
        if last["type"] == "tool" and [c["name"] for c in calls] == [tool]:
            assert last["data"]["tool_call_id"] == calls[0]["id"]
            assert number >= 1 and before not in turns[number - 1]  # made in the turn before
            return last["data"]
    raise AssertionError(f"no turn shows the answer of {tool}")


@pytest.mark.slow
def test_a_killed_attempt_then_a_rewritten_async_one_leave_each_effect_once(
    live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    command = _command(live_server, agent, tmp_path, "ticket-4812")

    # Attempt 1 (invoke, Client): the reply is sent, and the process dies by SIGKILL
    # before it reports it.
    code, output = _drive([*command, "--kill-at", "after-execute:send_reply"])
    assert code == -signal.SIGKILL, output
    assert "SIGKILL after executing send_reply" in output
    assert [e["kind"] for e in ledger.entries(ledger_path)] == ["import", "reply"]

    # Attempt 2 (ainvoke, AsyncClient) takes over: the model reorders and rewrites its
    # calls. The import is skipped, the reply settled by its lookup, the campaign
    # waits for the operator, who edits it and approves.
    code, output = _drive(
        [*command, "--async", "--supersede"], lambda: _approve_with_an_edit(operator)
    )
    assert code == 0, output
    assert "ticket-4812 answered: run completed." in output

    first, second = _calls(tmp_path, 1), _calls(tmp_path, 2)
    assert [n for n, _ in first] == ["lookup_customer", "import_dataset", "send_reply"]
    assert [n for n, _ in second] == [
        "lookup_customer",
        "import_dataset",
        "send_campaign",
        "send_reply",
    ]
    reply_args = [dict(a) for n, a in (*first, *second) if n == "send_reply"]
    assert reply_args[0]["message_id"] == reply_args[1]["message_id"]
    assert reply_args[0]["body"] != reply_args[1]["body"]  # rewritten

    # Each effect exactly once; the campaign as the operator approved it.
    counts = ledger.counts(ledger_path)
    assert sorted(kind for kind, _ in counts) == ["campaign", "import", "reply"]
    assert set(counts.values()) == {1}, counts
    campaign = ledger.find(ledger_path, "campaign", "2026-winter-eu")[1]["details"]
    model_wrote = dict(second)["send_campaign"]
    assert campaign["subject"] == EDIT["subject"] != model_wrote["subject"]
    assert campaign["recipients"] == 200 != model_wrote["recipients"]
    assert EDIT["subject"] in _answer_in_next_turn(_turns(tmp_path, 2), "send_campaign")["content"]

    run = Run.objects.get(run_key="langgraph-thread:ticket-4812")
    assert run.status == "completed" and run.current_attempt == 2
    effects = {e.tool: e for e in Effect.objects.all()}
    assert {t: e.status for t, e in effects.items()} == dict.fromkeys(
        ["send_reply", "import_dataset", "send_campaign"], "done"
    )
    assert effects["send_reply"].decision["verb"] == "reconciled"
    assert effects["send_campaign"].args_versions >= 2  # the operator's edit

    # Once more: the run is finished, nothing runs again.
    code, output = _drive(command)
    assert code == 0 and "already answered" in output
    assert ledger.counts(ledger_path) == counts


@pytest.mark.slow
def test_a_pending_approval_then_a_rejection_reach_the_model(
    live_server, agent, operator, tmp_path
):
    ledger_path = tmp_path / "ledger.jsonl"
    command = _command(live_server, agent, tmp_path, "ticket-4813", "--campaign", "2026-spring-eu")

    # Attempt 1 (ainvoke): nobody decides in time; the model hears where a person
    # decides, and the attempt ends for that person.
    code, output = _drive([*command, "--async", "--approval-timeout", "1"])
    assert code == NEEDS_PERSON, output
    campaign = Effect.objects.get(tool="send_campaign")
    assert campaign.status == "awaiting_approval"
    page = f"/effects/{campaign.id}/"
    pending = _answer_in_next_turn(_turns(tmp_path, 1), "send_campaign")
    assert pending["status"] == "error" and page in pending["content"], pending
    assert "waits (awaiting_approval) for a person's decision" in pending["content"]

    # Attempt 2 (invoke): the model asks again (in other words: a revision, which
    # waits for approval again); the operator rejects it, with a note for the model,
    # which reads it in its next turn as the campaign tool's output, and finishes.
    code, output = _drive(command, lambda: _reject(operator))
    assert code == 0, output
    turns = _turns(tmp_path, 2)
    rejected = _answer_in_next_turn(turns, "send_campaign")
    assert rejected["status"] == "success"
    assert rejected["content"] == f"rejected by an operator: {NOTE}"
    assert f"(heard: rejected by an operator: {NOTE})" in output  # its last answer

    counts = ledger.counts(ledger_path)
    assert sorted(kind for kind, _ in counts) == ["import", "reply"]  # never the campaign
    assert set(counts.values()) == {1}, counts
    run = Run.objects.get(run_key="langgraph-thread:ticket-4813")
    assert run.status == "completed" and run.current_attempt == 2
    assert Effect.objects.get(pk=campaign.pk).status == "rejected"


# --- The adapter in process: LangGraph's ToolNode, sync and async ----------------------


def _tool_graph(tools: list) -> Any:
    """A LangGraph graph of one node, the ToolNode: it runs the calls of the last message."""
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "tools")
    return graph.compile()


def _calling(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """ToolNode's input: the model's message with these tool calls."""
    tool_calls = [{"name": n, "args": a, "id": f"call_{i}"} for i, (n, a) in enumerate(calls)]
    return {"messages": [AIMessage("", tool_calls=tool_calls)]}


def _ping(host: str) -> str:
    return f"{host} is up"


# Marked read-only as langchain-mcp-adapters marks an MCP tool (its annotations).
ping = StructuredTool.from_function(
    _ping, name="ping", description="Ping a host.", metadata={"readOnlyHint": True}
)


@tool
def poke(host: str) -> str:
    """Poke a host (no declaration: an unkeyed effect)."""
    return f"{host} poked"


def test_tools_without_a_spec_are_unkeyed_effects_unless_marked_read_only(live_server, agent):
    client = ss.Client(live_server.url, agent.token)
    config = {"configurable": {"thread_id": "ops-1"}}
    with client.run(run_key_for(config)) as run:
        graph = _tool_graph(journaled(run, [ping, poke]))
        out = graph.invoke(_calling(("ping", {"host": "a"}), ("poke", {"host": "b"})), config)
    assert [m.content for m in out["messages"][1:]] == ["a is up", "b poked"]
    calls = Call.objects.filter(run__run_key="langgraph-thread:ops-1")  # run in parallel
    assert sorted((c.tool, c.kind) for c in calls) == [("ping", "read"), ("poke", "effect")]
    assert Effect.objects.get(tool="poke").key_source is None  # unkeyed


def test_an_effect_that_raises_is_not_turned_into_output_by_its_own_handler(
    live_server, agent, tmp_path
):
    """An effect's ``handle_tool_error`` would hand its exception to the model as an
    ordinary output, and the effect would be recorded ``done`` with the error text.
    Journaled, the exception goes on: the attempt ends, and the effect is unknown."""
    ledger_path = tmp_path / "ledger.jsonl"

    def _send_invoice(invoice_id: str) -> str:
        ledger.append(ledger_path, "invoice", invoice_id, {})
        raise ToolException("the mail server timed out reading the answer")

    send_invoice = StructuredTool.from_function(
        _send_invoice, name="send_invoice", description="Send an invoice.", handle_tool_error=True
    )

    specs = {"send_invoice": ss.effect(key=lambda a: ss.intent_key("invoice", id=a["invoice_id"]))}
    client = ss.AsyncClient(live_server.url, agent.token)

    async def attempt() -> None:
        async with client, client.run("invoices-1") as run:
            graph = _tool_graph(journaled(run, [send_invoice], specs))
            await graph.ainvoke(_calling(("send_invoice", {"invoice_id": "inv-7"})))

    with pytest.raises(ToolException, match="timed out"):
        asyncio.run(attempt())
    assert len(ledger.entries(ledger_path)) == 1
    effect = Effect.objects.get(tool="send_invoice")
    assert effect.status == "unknown" and effect.result is None
    assert Run.objects.get(run_key="invoices-1").status == "failed"
