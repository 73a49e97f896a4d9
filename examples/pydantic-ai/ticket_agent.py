"""The support-ticket agent of ``examples/support_agent.py``, written for Pydantic AI.

    python examples/pydantic-ai/ticket_agent.py --base-url http://127.0.0.1:8000 \\
        --token "$STARTSAFE_TOKEN" --ticket ticket-4812 --ledger var/ledger.jsonl \\
        [--async] [--transcript FILE] [--crash-after N] [--kill-at POINT[:TOOL]] [--seed S] \\
        [--approval-timeout SECONDS] [--supersede]

The same four tools and declarations (``support_agent.declare_tools``), in a
``FunctionToolset`` wrapped by :class:`startsafe_client.pydantic_ai.JournaledToolset`.
The model is Pydantic AI's own offline ``FunctionModel``, scripted by the seeded fake
LLM of ``fake_llm.py``: every attempt reorders the calls and rewrites their
arguments. It reads what the tools answered: the customer from the lookup, and an
operator's rejection note, after which it proposes the campaign again, revised.

- ``agent.run_sync`` with the blocking ``Client`` by default; ``--async``:
  ``await agent.run`` with ``AsyncClient``.
- ``--crash-after N`` kills the process with SIGKILL right after the N-th effect ran
  and before it was reported (``examples/kill_points.py``'s ``die``); ``--kill-at``
  (blocking client only) at a point of the protocol, as ``support_agent.py``.
- ``--transcript FILE`` appends, at each turn of the model, what it received and
  what it answered (Pydantic AI's own message format, one JSON array per line).

Exit codes as ``support_agent.py``: 0 answered, 3 a person must decide first, 4
another attempt is live, 5 the restart is blocked, 6 a tool sent nothing; killed by
SIGKILL when crashing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, FunctionToolset
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from startsafe_client.pydantic_ai import JournaledToolset

from startsafe_client import (
    AlreadyRunning,
    AsyncClient,
    Client,
    NotPerformed,
    RestartBlocked,
    RunFinished,
)

EXAMPLES = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(EXAMPLES))

import support_agent as base  # noqa: E402 (the tools, their specs and the exit codes)
from fake_llm import FakeLLM, Ticket, ticket_for  # noqa: E402
from kill_points import KillAt, die  # noqa: E402

REJECTED = "rejected by an operator"
PROMPT = "Answer the customer's ticket, import the winter segment and send the winter campaign."


class Crasher(base.Crasher):
    """``support_agent.Crasher``, dying by SIGKILL: no ``finally``, no last report."""

    def effect_performed(self, tool: str) -> None:
        self.performed += 1
        if self.after is not None and self.performed >= self.after:
            die(f"after effect {self.performed} ({tool}), before reporting it")


class TicketModel:
    """The fake LLM's plan and arguments, as a ``FunctionModel`` function.

    One tool call per turn, in ``llm.plan``'s order, with ``llm.arguments``. A
    rejection of the campaign (not final) makes it propose the campaign once more,
    with a revised subject line.
    """

    def __init__(self, llm: FakeLLM, ticket: Ticket, transcript: Path | None = None) -> None:
        self.llm, self.ticket, self.transcript = llm, ticket, transcript
        self.todo = list(llm.plan(ticket))
        self.customer: dict[str, Any] = {}
        self.calls = 0

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        for part in messages[-1].parts:
            if isinstance(part, ToolReturnPart):
                self.hear(part)
        response = ModelResponse(parts=[self.next_part()])
        if self.transcript is not None:
            with self.transcript.open("ab") as f:
                f.write(ModelMessagesTypeAdapter.dump_json([messages[-1], response]) + b"\n")
        return response

    def hear(self, part: ToolReturnPart) -> None:
        print(f"  {part.tool_name} ({part.outcome}) -> {part.content}", flush=True)
        if part.tool_name == "lookup_customer" and isinstance(part.content, dict):
            self.customer = part.content
        if isinstance(part.content, str) and part.content.startswith(REJECTED):
            self.llm.hear(part.content)
            if part.tool_name == "send_campaign" and "(final" not in part.content:
                self.todo.insert(0, "revise_campaign")

    def next_part(self) -> TextPart | ToolCallPart:
        if not self.todo:
            return TextPart(f"Ticket {self.ticket.ticket_id} handled.")
        name = self.todo.pop(0)
        self.calls += 1
        if name == "revise_campaign":
            args = self.llm.arguments("send_campaign", self.ticket, self.customer)
            args["subject"] += " (revised after review)"
            name = "send_campaign"
        else:
            args = self.llm.arguments(name, self.ticket, self.customer)
        return ToolCallPart(name, args, tool_call_id=f"a{self.llm.attempt}-call{self.calls}")


def build(
    client: Client | AsyncClient, options: argparse.Namespace
) -> tuple[FunctionToolset[Any], dict[str, Any]]:
    """The four tools of ``support_agent.py`` as a ``FunctionToolset``, and their specs."""
    tools = base.declare_tools(client, options.ledger, Crasher(options.crash_after))
    toolset = FunctionToolset([tool.fn for tool in tools.values()])
    return toolset, {name: tool.spec for name, tool in tools.items()}


def agent_for(run: Any, ticket: Ticket, options: argparse.Namespace) -> Agent[None, str]:
    notes = ", ".join(n["reason"] for n in run.verdict.get("notes", [])) or "none"
    print(f"run {run.id}: attempt {run.attempt} (verdict notes: {notes})", flush=True)
    model = TicketModel(FakeLLM(options.seed, run.attempt), ticket, options.transcript)
    return Agent(FunctionModel(model, model_name="fake-llm"))


def run_options(ticket: Ticket, options: argparse.Namespace) -> dict[str, Any]:
    return {
        "title": f"Answer support ticket {ticket.ticket_id}",
        "input": {"ticket": ticket.ticket_id, "message_id": ticket.message_id},
        "heartbeat_timeout": options.heartbeat_timeout,
        "agent_version": f"support-agent/pydantic-ai (fake LLM, seed {options.seed})",
        "supersede": True if options.supersede else "stale",
    }


def make_client(options: argparse.Namespace) -> Client | AsyncClient:
    """The client of the path chosen; ``ValueError`` for an empty token."""
    client_class = AsyncClient if options.use_async else Client
    return client_class(
        options.base_url,
        options.token or "",
        approval_timeout=options.approval_timeout,
        poll_interval=options.poll_interval,
        poll_max_interval=max(options.poll_interval, 5.0),
        on_wait=base.say_waiting,
        transport=KillAt(*options.kill_at) if options.kill_at else None,
    )


def answer_sync(client: Client, options: argparse.Namespace, ticket: Ticket) -> None:
    """``agent.run_sync`` with the blocking client."""
    with client:
        toolset, specs = build(client, options)
        with client.run(ticket.ticket_id, **run_options(ticket, options)) as run:
            journaled = JournaledToolset(run, toolset, specs)
            result = agent_for(run, ticket, options).run_sync(PROMPT, toolsets=[journaled])
            finish(journaled, result.output)


async def answer_async(client: AsyncClient, options: argparse.Namespace, ticket: Ticket) -> None:
    """``await agent.run`` with the asyncio client."""
    async with client:
        toolset, specs = build(client, options)
        async with client.run(ticket.ticket_id, **run_options(ticket, options)) as run:
            journaled = JournaledToolset(run, toolset, specs)
            result = await agent_for(run, ticket, options).run(PROMPT, toolsets=[journaled])
            finish(journaled, result.output)


def finish(journaled: JournaledToolset, output: str) -> None:
    """The model's last word; the attempt ends ``failed`` while a call waits for a person."""
    print(f"model: {output}")
    if journaled.waiting:
        raise base.NeedsPerson(
            "waiting for a person: "
            + "; ".join(f"{w.tool}: decide at {w.url}" for w in journaled.waiting)
        )


def parse(argv: list[str] | None) -> argparse.Namespace:
    """This example's two options, then ``support_agent.py``'s own (its ``--help``)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--transcript", type=Path, default=None, metavar="FILE")
    mine, rest = parser.parse_known_args(argv)
    if {"-h", "--help"} & set(rest):
        print("ticket_agent.py [--async] [--transcript FILE], then support_agent.py's options:")
    options = base.parse(rest)
    if options.think or (options.kill_at and mine.use_async):
        sys.exit("ticket_agent.py: --think is not here, and --kill-at needs the blocking client")
    options.use_async, options.transcript = mine.use_async, mine.transcript
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    ticket = ticket_for(options.ticket)
    try:
        client = make_client(options)
    except ValueError as refused:  # the token (--token, or STARTSAFE_TOKEN) is empty
        print(f"ticket_agent.py: {refused}", file=sys.stderr)
        return 2
    try:
        if isinstance(client, AsyncClient):
            asyncio.run(answer_async(client, options, ticket))
        else:
            answer_sync(client, options, ticket)
    except (base.NeedsPerson, NotPerformed, AlreadyRunning, RestartBlocked, RunFinished) as stopped:
        return base.say_why_it_stopped(stopped, ticket.ticket_id)
    print(f"{ticket.ticket_id} answered: run completed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
