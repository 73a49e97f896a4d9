"""The support-ticket agent of ``examples/support_agent.py``, on the OpenAI Agents SDK.

    python examples/openai_agents/ticket_agent.py --base-url http://127.0.0.1:8000 \\
        --token "$STARTSAFE_TOKEN" --ticket ticket-4812 --ledger var/ledger.jsonl \\
        [--runner sync|async] [--crash-after N] [--kill-at POINT[:TOOL]] [--seed S] \\
        [--approval-timeout SECONDS] [--supersede]

The same four tools with the same declarations (``support_agent.declare_tools``: a
read, a reply keyed on the inbound message, an import keyed on its SHA-256, a
campaign keyed on its id that needs approval), given to an SDK ``Agent`` as
``@function_tool``s and journaled by ``startsafe_client.openai_agents.journaled``.

The model is the SDK's own offline test model, ``agents.testing.ScriptedModel``: each
of its steps answers from the conversation the SDK sends it, as a model would. The
seeded ``FakeLLM`` of ``fake_llm.py`` picks the order of the calls and rewrites their
arguments on every attempt; the model hears each tool's output on its next turn
(printed: ``model turn N hears TOOL: OUTPUT``), an operator's rejection note included.

``--runner sync`` (the default) runs ``Runner.run_sync`` with the blocking
``Client``; ``--runner async`` awaits ``Runner.run`` with ``AsyncClient``.
``--crash-after N`` exits at once (137) right after the N-th effect ran, before it was
reported; ``--kill-at`` SIGKILLs the process at a point of the protocol
(``kill_points.py``; ``--runner sync`` only, it watches the blocking transport).

Exit codes as ``support_agent.py``: 0 answered (or already answered), 3 a person must
decide first (the printed addresses), 4 another attempt is live, 5 the restart is
blocked, 137 crashed.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(EXAMPLES))

from agents import Agent, Runner, RunResult, function_tool, set_tracing_disabled  # noqa: E402
from agents.testing import (  # noqa: E402
    ModelCall,
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)
from fake_llm import FakeLLM, Ticket, ticket_for  # noqa: E402
from kill_points import KillAt, parse_kill_point  # noqa: E402
from startsafe_client.openai_agents import JournaledTools, journaled  # noqa: E402
from support_agent import (  # noqa: E402
    Crasher,
    NeedsPerson,
    declare_tools,
    say_waiting,
    say_why_it_stopped,
)

from startsafe_client import (  # noqa: E402
    AlreadyRunning,
    AsyncClient,
    AsyncRun,
    Client,
    NotPerformed,
    RestartBlocked,
    Run,
    RunFinished,
)


class TicketModel:
    """The model's side: each turn reads what the SDK sends and makes the next call.

    Its plan and arguments come from ``FakeLLM`` (seeded with the seed and the
    attempt); what it hears is the last tool output of the conversation.
    """

    def __init__(self, llm: FakeLLM, ticket: Ticket) -> None:
        self.llm, self.ticket = llm, ticket
        self.plan = llm.plan(ticket)
        self.customer: dict[str, Any] = {}
        self.turns = 0

    def scripted(self) -> ScriptedModel:
        """One step per planned call, and one for the final answer."""
        return ScriptedModel([ModelStep.respond(self.turn) for _ in range(len(self.plan) + 1)])

    def turn(self, call: ModelCall) -> list[Any]:
        self.turns += 1
        items = (
            [i for i in call.input if isinstance(i, dict)] if isinstance(call.input, list) else []
        )
        called = {i["call_id"]: i["name"] for i in items if i.get("type") == "function_call"}
        outputs = [i for i in items if i.get("type") == "function_call_output"]
        if outputs:
            self.hear(called[outputs[-1]["call_id"]], str(outputs[-1]["output"]))
        done = len(outputs)
        if done < len(self.plan):
            name = self.plan[done]
            print(f"  model turn {self.turns} calls {name}", flush=True)
            arguments = self.llm.arguments(name, self.ticket, self.customer)
            return [function_call(name, arguments, call_id=f"call-{self.llm.attempt}-{done}")]
        heard = f" (heard: {' | '.join(self.llm.heard)})" if self.llm.heard else ""
        return [assistant_message(f"Ticket {self.ticket.ticket_id} answered{heard}.")]

    def hear(self, tool: str, output: str) -> None:
        print(f"  model turn {self.turns} hears {tool}: {output}", flush=True)
        if tool == "lookup_customer":
            self.customer = ast.literal_eval(output)  # the SDK sends a dict as its str()
        elif output.startswith("rejected by an operator"):
            self.llm.hear(output)


def build_agent(
    run: Run | AsyncRun, client: Client | AsyncClient, options: argparse.Namespace, ticket: Ticket
) -> tuple[Agent[Any], JournaledTools]:
    """The SDK agent: support_agent.py's tools as function tools, journaled through ``run``."""
    declared = declare_tools(client, options.ledger, Crasher(options.crash_after))
    tools = journaled(
        run,
        [function_tool(tool.fn, name_override=name) for name, tool in declared.items()],
        {name: tool.spec for name, tool in declared.items()},
    )
    model = TicketModel(FakeLLM(options.seed, run.attempt), ticket)
    agent = Agent(
        name="support-agent",
        instructions="Answer the support ticket: look the customer up, then act.",
        model=model.scripted(),
        tools=tools,
    )
    return agent, tools


def settle(tools: JournaledTools, result: RunResult) -> None:
    """After the SDK run: what waits for a person ends the attempt failed (exit 3)."""
    print(f"  final output: {result.final_output}")
    if tools.waiting:
        where = "; ".join(f"{e.effect.get('tool')}: decide at {e.url}" for e in tools.waiting)
        raise NeedsPerson(f"waiting for a person: {where}")


def run_options(options: argparse.Namespace, ticket: Ticket) -> dict[str, Any]:
    return {
        "run_key": ticket.ticket_id,
        "title": f"Answer support ticket {ticket.ticket_id}",
        "input": {"ticket": ticket.ticket_id, "message_id": ticket.message_id},
        "heartbeat_timeout": options.heartbeat_timeout,
        "agent_version": f"support-agent/openai-agents (ScriptedModel, seed {options.seed})",
        "supersede": True if options.supersede else "stale",
    }


def answer_sync(client: Client, options: argparse.Namespace, ticket: Ticket) -> None:
    """``Runner.run_sync`` with the blocking client."""
    with client, client.run(**run_options(options, ticket)) as run:
        print(f"run {run.id}: attempt {run.attempt} (Runner.run_sync)", flush=True)
        agent, tools = build_agent(run, client, options, ticket)
        settle(tools, Runner.run_sync(agent, f"Ticket {ticket.ticket_id}"))


async def answer_async(client: AsyncClient, options: argparse.Namespace, ticket: Ticket) -> None:
    """``await Runner.run`` with the asyncio client."""
    async with client, client.run(**run_options(options, ticket)) as run:
        print(f"run {run.id}: attempt {run.attempt} (Runner.run)", flush=True)
        agent, tools = build_agent(run, client, options, ticket)
        settle(tools, await Runner.run(agent, f"Ticket {ticket.ticket_id}"))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", default=os.environ.get("STARTSAFE_TOKEN"))
    parser.add_argument("--ticket", default="ticket-4812")
    parser.add_argument("--ledger", default="var/ledger.jsonl", type=Path)
    parser.add_argument("--runner", choices=("sync", "async"), default="sync")
    parser.add_argument("--crash-after", type=int, default=None, metavar="N")
    parser.add_argument("--kill-at", type=parse_kill_point, default=None, metavar="POINT[:TOOL]")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--approval-timeout", type=float, default=300.0, metavar="SECONDS")
    parser.add_argument("--poll-interval", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument("--heartbeat-timeout", type=int, default=15, metavar="SECONDS")
    parser.add_argument("--supersede", action="store_true")
    options = parser.parse_args(argv)
    if options.kill_at and options.runner != "sync":
        parser.error("--kill-at watches the blocking client's transport: use --runner sync")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    set_tracing_disabled(True)  # offline: no trace exporter
    ticket = ticket_for(options.ticket)
    on_wait = {"approval_timeout": options.approval_timeout, "on_wait": say_waiting}
    polling = {
        "poll_interval": options.poll_interval,
        "poll_max_interval": max(options.poll_interval, 5.0),
    }
    try:
        if options.runner == "async":
            client: Client | AsyncClient = AsyncClient(
                options.base_url, options.token or "", **on_wait, **polling
            )
        else:
            transport = KillAt(*options.kill_at) if options.kill_at else None
            client = Client(
                options.base_url, options.token or "", transport=transport, **on_wait, **polling
            )
    except ValueError as refused:  # the token (--token, or STARTSAFE_TOKEN) is empty
        print(f"ticket_agent.py: {refused}", file=sys.stderr)
        return 2
    try:
        if isinstance(client, AsyncClient):
            asyncio.run(answer_async(client, options, ticket))
        else:
            answer_sync(client, options, ticket)
    except (NeedsPerson, NotPerformed, AlreadyRunning, RestartBlocked, RunFinished) as stopped:
        return say_why_it_stopped(stopped, ticket.ticket_id)
    print(f"{ticket.ticket_id} answered: run completed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
