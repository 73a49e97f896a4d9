"""The support-ticket agent of ``examples/support_agent.py``, as a LangChain agent.

    python examples/langchain/agent.py --base-url http://127.0.0.1:8000 \\
        --token "$STARTSAFE_TOKEN" --ticket ticket-4812 --ledger var/ledger.jsonl \\
        [--async] [--crash-after N] [--kill-at POINT[:TOOL]] [--seed S] \\
        [--campaign ID] [--transcript FILE] [--approval-timeout SECONDS] [--supersede]

The same four tools with the same declarations (``support_agent.declare_tools``:
a read, a reply keyed on the inbound message, an import keyed on the file's
SHA-256, a campaign keyed on its id that needs approval) become LangChain tools,
and ``startsafe_client.langchain.journaled`` journals them for LangChain's
``create_agent`` (a LangGraph graph whose ``ToolNode`` runs them).

The model is LangChain's own ``GenericFakeChatModel``, offline: the seeded plan of
``fake_llm.FakeLLM`` (its order and wording change on every attempt) becomes its
scripted tool calls, and it reads each tool's answer in its next turn. An operator's
rejection reaches it as the tool's output ("rejected by an operator: <note>"); a
decision still pending after ``--approval-timeout`` as a tool error naming the
console page, and the attempt then ends for a person to decide (exit 3).

``--async`` runs the graph with ``ainvoke`` on ``AsyncClient`` (the default is
``invoke`` on ``Client``). ``--crash-after N`` ends the process right after the
N-th effect ran, before it was reported; ``--kill-at`` SIGKILLs it at a point of
the protocol (``kill_points.py``; sync only). ``--transcript`` appends each turn
the model was shown, as JSON lines. The LangGraph thread is the ticket, and the
run's key comes from it (``run_key_for``): ``langgraph-thread:<ticket>``.

Exit codes as ``support_agent.py``: 0 answered (or already answered), 3 a person
must decide first, 4 another attempt is live, 5 the restart is blocked, 6 a tool
sent nothing (run again), 137 crashed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import support_agent as plain  # noqa: E402 (the four tools, their specs, the exit codes)
from fake_llm import FakeLLM, Ticket, ticket_for  # noqa: E402
from kill_points import KillAt, parse_kill_point  # noqa: E402
from langchain.agents import create_agent  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import (  # noqa: E402
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_to_dict,
)
from langchain_core.tools import StructuredTool  # noqa: E402
from startsafe_client.langchain import NeedsPerson, journaled, run_key_for  # noqa: E402

from startsafe_client import (  # noqa: E402
    AlreadyRunning,
    AsyncClient,
    Client,
    NotPerformed,
    RestartBlocked,
    RunFinished,
)

DESCRIPTIONS = {
    "lookup_customer": "Look a customer up in the CRM by e-mail address.",
    "send_reply": "Reply to the customer's inbound message (by its message id).",
    "import_dataset": "Import a CSV file into a warehouse table.",
    "send_campaign": "Send an e-mail campaign to a segment (a person approves it first).",
}


class ToolCallingFakeModel(GenericFakeChatModel):
    """LangChain's ``GenericFakeChatModel``, able to take tools (``bind_tools``), that
    keeps every turn it was shown (and appends it to ``transcript``, if given)."""

    turns: list[list[BaseMessage]] = []
    transcript: str | None = None
    attempt: int = 0

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFakeModel:
        return self  # the script names the tools itself

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.turns.append(list(messages))
        result = super()._generate(messages, *args, **kwargs)
        if self.transcript:
            line = {
                "attempt": self.attempt,
                "turn": len(self.turns),
                "messages": messages_to_dict(messages),
                "answer": messages_to_dict([result.generations[0].message])[0],
            }
            with open(self.transcript, "a", encoding="utf-8") as f:
                f.write(json.dumps(line, default=str) + "\n")
        return result


def scripted_model(llm: FakeLLM, ticket: Ticket, transcript: Path | None) -> ToolCallingFakeModel:
    """The fake model, playing ``llm``'s plan one tool call per turn."""
    model = ToolCallingFakeModel(
        messages=iter(()), transcript=str(transcript) if transcript else None, attempt=llm.attempt
    )
    model.turns = []
    model.messages = _play(llm, ticket, model)
    return model


def _play(llm: FakeLLM, ticket: Ticket, model: ToolCallingFakeModel) -> Iterator[AIMessage]:
    """Each turn's answer: the next call of the plan, with the arguments the model
    writes this time; it reads the previous call's answer in the turn after it."""
    customer: dict[str, Any] = {}
    for step, name in enumerate(llm.plan(ticket)):
        call_id = f"call_{llm.attempt}_{step}_{name}"
        args = llm.arguments(name, ticket, customer)
        yield AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}])
        answer = next(
            m for m in model.turns[-1] if isinstance(m, ToolMessage) and m.tool_call_id == call_id
        )
        print(f"  {name}: {answer.status}: {answer.content}", flush=True)
        if name == "lookup_customer" and answer.status == "success":
            customer = json.loads(answer.text)
        elif answer.text.startswith("rejected by an operator"):
            llm.hear(answer.text)  # the operator's note, for the model's next steps
    heard = f" (heard: {'; '.join(llm.heard)})" if llm.heard else ""
    print(f"  model: Ticket {ticket.ticket_id} is answered{heard}.", flush=True)
    yield AIMessage(f"Ticket {ticket.ticket_id} is answered{heard}.")


def build_agent(run: Any, ticket: Ticket, options: argparse.Namespace) -> tuple[Any, Any]:
    """The journaled tools and the agent; the tools come from ``support_agent.py``."""
    declared = plain.declare_tools(run.client, options.ledger, plain.Crasher(options.crash_after))
    tools = [
        StructuredTool.from_function(t.fn, name=t.name, description=DESCRIPTIONS[t.name])
        for t in declared.values()
    ]
    journaled_tools = journaled(run, tools, {t.name: t.spec for t in declared.values()})
    llm = FakeLLM(options.seed, run.attempt)
    model = scripted_model(llm, ticket, options.transcript)
    agent = create_agent(model, journaled_tools, system_prompt="You answer support tickets.")
    return agent, journaled_tools


def _client_options(options: argparse.Namespace) -> dict[str, Any]:
    return {
        "approval_timeout": options.approval_timeout,
        "poll_interval": options.poll_interval,
        "poll_max_interval": max(options.poll_interval, 5.0),
        "on_wait": plain.say_waiting,
    }


def _run_options(options: argparse.Namespace, ticket: Ticket, config: dict) -> dict[str, Any]:
    return {
        "run_key": run_key_for(config),
        "title": f"Answer support ticket {ticket.ticket_id} (LangChain)",
        "input": {"ticket": ticket.ticket_id, "message_id": ticket.message_id},
        "heartbeat_timeout": options.heartbeat_timeout,
        "agent_version": f"support-agent/langchain (fake model, seed {options.seed})",
        "supersede": True if options.supersede else "stale",
    }


def _started(run: Any) -> None:
    notes = ", ".join(n["reason"] for n in run.verdict.get("notes", [])) or "none"
    print(f"run {run.id} ({run.run_key}): attempt {run.attempt} (verdict notes: {notes})")


def _request(ticket: Ticket) -> dict[str, Any]:
    text = f"Ticket {ticket.ticket_id}: answer {ticket.message_id} from {ticket.customer_email}."
    return {"messages": [HumanMessage(text)]}


def answer_sync(options: argparse.Namespace, ticket: Ticket, config: dict) -> None:
    """``agent.invoke`` on the sync ``Client``."""
    transport = KillAt(*options.kill_at) if options.kill_at else None
    client = Client(
        options.base_url, options.token, transport=transport, **_client_options(options)
    )
    with client, client.run(**_run_options(options, ticket, config)) as run:
        _started(run)
        agent, tools = build_agent(run, ticket, options)
        agent.invoke(_request(ticket), config)
        tools.raise_if_waiting()  # the attempt ends failed, for a person to decide


async def answer_async(options: argparse.Namespace, ticket: Ticket, config: dict) -> None:
    """``agent.ainvoke`` on ``AsyncClient``: nothing blocks the event loop."""
    client = AsyncClient(options.base_url, options.token, **_client_options(options))
    async with client, client.run(**_run_options(options, ticket, config)) as run:
        _started(run)
        agent, tools = build_agent(run, ticket, options)
        await agent.ainvoke(_request(ticket), config)
        tools.raise_if_waiting()


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Answer a support ticket with LangChain.")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default=os.environ.get("STARTSAFE_TOKEN"))
    parser.add_argument("--ticket", default="ticket-4812")
    parser.add_argument("--campaign", default=None, help="the campaign id (the ticket's default)")
    parser.add_argument("--ledger", default="var/ledger.jsonl", type=Path)
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--crash-after", type=int, default=None, metavar="N")
    parser.add_argument("--kill-at", type=parse_kill_point, default=None, metavar="POINT[:TOOL]")
    parser.add_argument("--transcript", type=Path, default=None, metavar="FILE")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--approval-timeout", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("--poll-interval", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument("--heartbeat-timeout", type=int, default=15, metavar="SECONDS")
    parser.add_argument("--supersede", action="store_true", help="take over a live attempt now")
    options = parser.parse_args(argv)
    if options.use_async and options.kill_at:
        parser.error("--kill-at watches the sync client's transport: drop --async")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    if not options.token:
        print("agent.py: no token: --token or STARTSAFE_TOKEN", file=sys.stderr)
        return 2
    ticket = ticket_for(options.ticket)
    if options.campaign:
        ticket = dataclasses.replace(ticket, campaign_id=options.campaign)
    config = {"configurable": {"thread_id": ticket.ticket_id}}
    try:
        if options.use_async:
            asyncio.run(answer_async(options, ticket, config))
        else:
            answer_sync(options, ticket, config)
    except (NeedsPerson, NotPerformed, AlreadyRunning, RestartBlocked, RunFinished) as stopped:
        return plain.say_why_it_stopped(stopped, ticket.ticket_id)
    print(f"{ticket.ticket_id} answered: run completed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
