"""make bench's peer comparison: one four-step agent, made durable three ways, and
the floor of the HTTP way.

    python -m bench.peers startsafe|floor|dbos|langgraph     (started by bench/run.py)

The agent reads a ticket, then performs three keyed effects (send the reply,
update the CRM, notify the team); its tools do nothing and return a small dict,
so what is measured is what each way of making it durable costs:

- **startsafe**, over HTTP, as an agent's author writes it: the Python client
  (``startsafe_client``), one ``with client.run(...)`` per agent (it starts the run
  and finishes it), ``run.call`` per tool. The read is recorded; each effect is
  recorded and completed; every ``POST`` carries an ``Idempotency-Key``; the client
  keeps connections alive (gunicorn's sync workers, as in production, close each
  one after its answer). The project's server, database and settings of the load
  phase.
- **the HTTP floor**: not a way to make the agent durable, but the cheapest the
  startsafe peer could be. The same requests, sent the same way (``httpx``, one
  keep-alive ``httpx.Client``, one request at a time; gunicorn closes each
  connection, as startsafe's), to the baseline of the load phase
  (``bench/baseline/``: a minimal Django project whose one view reads one row by
  primary key; no middleware, no authentication, no writes), on its own gunicorn
  with the project's flags: a ``GET`` where startsafe sends a request, so one for
  the read, two for each effect (record, complete), and one each to start and
  finish the run. It is the cost of the HTTP requests and of Django answering them
  with no work but a read by primary key; an effect step that is two HTTP requests
  to a Django server cannot be cheaper than this row's, whatever the journal does.
  Its ids are the load phase's (``BENCH_TARGETS``, the file ``bench/lua/read.lua``
  reads), in turn.
- **DBOS** (``dbos``): a ``@DBOS.workflow`` calling four ``@DBOS.step`` functions,
  its system database on the same PostgreSQL server (a database of its own).
- **LangGraph** (``langgraph``, ``langgraph-checkpoint-postgres``): a graph of four
  nodes in a line, compiled with ``PostgresSaver`` (its own database on the same
  server, ``setup()`` once), invoked with ``durability="sync"`` (each step's
  checkpoint written before the next step starts) and a ``thread_id`` per agent.

Each peer runs in a process of its own, started once and warmed, so no library's
threads or imports share an interpreter with another's; ``bench/run.py`` drives
them in interleaved rounds (startsafe, the floor, DBOS, LangGraph, again), one
agent at a time, so that the shared machine's slow seconds fall on all four alike.

What is timed, in the peer's process, with ``time.perf_counter``:

- **a step** where the agent's code calls it: startsafe's ``run.call`` (record, the
  tool, complete); the floor's requests and the tool in the same order; the call
  of a DBOS step function (look up a recorded output, the tool, record its
  output). LangGraph has no such call: its loop runs the nodes, and writes each
  step's checkpoint between them; a step there is from a node's start to the next
  node's start, the last one to ``invoke``'s return.
- **the whole agent**, start to return: startsafe's run started, four calls, the
  run finished; the floor's nine requests; DBOS's workflow with its status rows;
  LangGraph's ``invoke`` with its input checkpoint.

The protocol on stdin/stdout: the worker prints ``BENCH_READY`` once set up, then
answers each ``run N STAMP`` line with one ``BENCH_JSON {...}`` line (each agent's
milliseconds and its four steps'), and leaves on ``quit``.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ("startsafe", "floor", "dbos", "langgraph")  # startsafe first: the others' ratios
LABELS = {
    "startsafe": "startsafe (HTTP)",
    "floor": "HTTP floor: a minimal Django view",
    "dbos": "DBOS",
    "langgraph": "LangGraph",
}
SHORT = {"startsafe": "startsafe", "floor": "HTTP floor", "dbos": "DBOS", "langgraph": "LangGraph"}


# --- The agent's tools: no-ops, the same four for every peer ------------------------


def lookup_ticket(ticket: str) -> dict:
    return {"ticket": ticket, "customer": "c-42", "subject": "Where is my refund?"}


def send_reply(ticket: str) -> dict:
    return {"message_id": f"m-{ticket}"}


def update_crm(ticket: str) -> dict:
    return {"crm_case": f"case-{ticket}", "status": "answered"}


def notify_team(ticket: str) -> dict:
    return {"posted": True}


TOOLS = (lookup_ticket, send_reply, update_crm, notify_team)  # a read, three effects

# ticket -> (milliseconds of the whole agent, milliseconds of each of its four steps)
Agent = Callable[[str], tuple[float, list[float]]]


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000


# --- The peers, each set up in its own process --------------------------------------


def startsafe_agent() -> tuple[Agent, Callable[[], None]]:
    from startsafe_client import Client, effect, intent_key, read

    client = Client(os.environ["BENCH_PEER_URL"], os.environ["BENCH_TOKEN"])
    tools = [client.tool(read())(TOOLS[0])] + [
        client.tool(effect(key=lambda args, name=fn.__name__: intent_key(name, **args)))(fn)
        for fn in TOOLS[1:]
    ]

    def agent(ticket: str) -> tuple[float, list[float]]:
        started = time.perf_counter()
        steps = []
        # No heartbeat during the agent: its thread waits heartbeat_timeout / 3.
        with client.run(f"peer-{ticket}", heartbeat_timeout=3600) as run:
            for tool in tools:
                step = time.perf_counter()
                run.call(tool, ticket=ticket)
                steps.append(_ms(step))
        return _ms(started), steps

    return agent, client.close


def floor_agent() -> tuple[Agent, Callable[[], None]]:
    import httpx

    lines = Path(os.environ["BENCH_TARGETS"]).read_text().splitlines()
    ids = [line.split()[0] for line in lines if line.strip()]
    http = httpx.Client(base_url=os.environ["BENCH_PEER_URL"])
    turn = 0

    def get() -> None:
        nonlocal turn
        answer = http.get(f"/baseline/{ids[turn % len(ids)]}")
        turn += 1
        answer.raise_for_status()  # a 404 would be cheaper than the floor
        answer.json()

    def agent(ticket: str) -> tuple[float, list[float]]:
        started = time.perf_counter()
        steps = []
        get()  # where startsafe's run starts
        for n, tool in enumerate(TOOLS):
            step = time.perf_counter()
            get()  # the read's one request; an effect's record
            tool(ticket)
            if n:
                get()  # an effect's complete
            steps.append(_ms(step))
        get()  # where startsafe's run finishes
        return _ms(started), steps

    return agent, http.close


def dbos_agent() -> tuple[Agent, Callable[[], None]]:
    from dbos import DBOS

    DBOS(
        config={
            "name": "startsafe-bench-peer",
            "system_database_url": os.environ["BENCH_PEER_URL"],
            "log_level": "WARNING",
        }
    )
    steps = [DBOS.step()(fn) for fn in TOOLS]

    @DBOS.workflow()
    def ticket_workflow(ticket: str) -> list[float]:
        times = []
        for step in steps:
            started = time.perf_counter()
            step(ticket)
            times.append(_ms(started))
        return times

    DBOS.launch()

    def agent(ticket: str) -> tuple[float, list[float]]:
        started = time.perf_counter()
        times = ticket_workflow(ticket)
        return _ms(started), times

    return agent, DBOS.destroy


def langgraph_agent() -> tuple[Agent, Callable[[], None]]:
    from typing import TypedDict

    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        ticket: str
        lookup_ticket_result: dict
        send_reply_result: dict
        update_crm_result: dict
        notify_team_result: dict

    node_starts: list[float] = []

    def node(fn):
        def run(state: State) -> dict:
            node_starts.append(time.perf_counter())
            return {f"{fn.__name__}_result": fn(state["ticket"])}

        return run

    builder = StateGraph(State)
    previous = START
    for fn in TOOLS:
        builder.add_node(fn.__name__, node(fn))
        builder.add_edge(previous, fn.__name__)
        previous = fn.__name__
    builder.add_edge(previous, END)
    saver_context = PostgresSaver.from_conn_string(os.environ["BENCH_PEER_URL"])
    saver = saver_context.__enter__()
    saver.setup()
    graph = builder.compile(checkpointer=saver)

    def agent(ticket: str) -> tuple[float, list[float]]:
        node_starts.clear()
        started = time.perf_counter()
        graph.invoke({"ticket": ticket}, {"configurable": {"thread_id": ticket}}, durability="sync")
        ended = time.perf_counter()
        marks = [*node_starts, ended]
        return (ended - started) * 1000, [
            (b - a) * 1000 for a, b in zip(marks, marks[1:], strict=False)
        ]

    return agent, lambda: saver_context.__exit__(None, None, None)


SETUP = {
    "startsafe": startsafe_agent,
    "floor": floor_agent,
    "dbos": dbos_agent,
    "langgraph": langgraph_agent,
}


def serve(name: str) -> None:
    """The worker: set the peer up, then run the agents the orchestrator asks for."""
    agent, close = SETUP[name]()
    print("BENCH_READY", flush=True)
    try:
        for line in sys.stdin:
            command = line.split()
            if not command or command[0] == "quit":
                break
            count, stamp = int(command[1]), command[2]
            runs = [agent(f"{stamp}-{n}") for n in range(count)]
            answer = {"agents": [ms for ms, _ in runs], "steps": [steps for _, steps in runs]}
            print("BENCH_JSON " + json.dumps(answer), flush=True)
    finally:
        close()


# --- The orchestrator's side (bench/run.py) ----------------------------------------


class Worker:
    def __init__(self, name: str, env: dict) -> None:
        self.name = name
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.peers", name],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._read("BENCH_READY")

    def _read(self, prefix: str) -> str:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
            sys.stderr.write(f"[{self.name}] {line}")
        raise SystemExit(f"the {self.name} peer ended early (exit {self.process.wait()})")

    def run(self, count: int, stamp: str) -> dict:
        assert self.process.stdin is not None
        self.process.stdin.write(f"run {count} {stamp}\n")
        self.process.stdin.flush()
        return json.loads(self._read("BENCH_JSON"))

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
                self.process.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def measure(envs: dict[str, dict], rounds: int, agents: int, log=print) -> dict:
    """Interleaved rounds of ``agents`` agents per peer; medians, p90s and ratios.

    ``envs``: each peer's environment (``BENCH_PEER_URL``: the startsafe server's
    address, the baseline's, or the peer's own database; the floor's
    ``BENCH_TARGETS``).
    """
    workers: dict[str, Worker] = {}
    try:
        for name in PEERS:
            workers[name] = Worker(name, envs[name])
        for name in PEERS:  # warm: imports done, connections open, plans cached
            workers[name].run(max(5, agents // 4), f"warm{os.getpid()}")
        got: dict[str, list[dict]] = {name: [] for name in PEERS}
        for r in range(rounds):
            for name in PEERS:
                answer = workers[name].run(agents, f"r{r}x{os.getpid()}")
                got[name].append(answer)
                effects = [ms for steps in answer["steps"] for ms in steps[1:]]
                log(
                    f"  round {r + 1} {name}: effect step p50 "
                    f"{statistics.median(effects):.1f} ms, agent p50 "
                    f"{statistics.median(answer['agents']):.1f} ms"
                )
    finally:
        for worker in workers.values():
            worker.close()
    return summarize(got)


def summarize(got: dict[str, list[dict]]) -> dict:
    peers: dict[str, dict] = {}
    for name, answers in got.items():
        steps = [s for answer in answers for s in answer["steps"]]
        agents = [ms for answer in answers for ms in answer["agents"]]
        effects = [ms for s in steps for ms in s[1:]]
        reads = [s[0] for s in steps]
        peers[name] = {
            "agents": len(agents),
            "step_p50": statistics.median(ms for s in steps for ms in s),
            "step_p90": p90([ms for s in steps for ms in s]),
            "effect_p50": statistics.median(effects),
            "effect_p90": p90(effects),
            "read_p50": statistics.median(reads),
            "agent_p50": statistics.median(agents),
            "agent_p90": p90(agents),
            "round_effect_p50": [
                statistics.median(ms for s in answer["steps"] for ms in s[1:]) for answer in answers
            ],
        }
    return peers


def render(peers: dict, rounds: int) -> list[str]:
    """The report's peer table (bench/run.py puts it after the load table)."""
    ours, floor = peers["startsafe"], peers["floor"]
    lines = [
        f"Peers: the same four-step agent (a read, three keyed effects; no-op tools), "
        f"{ours['agents']} agents for each peer, one at a time, in {rounds} interleaved "
        f"rounds ({', '.join(SHORT[name] for name in PEERS)}), each peer "
        "in a process of its own; milliseconds (`bench/peers.py` says what each "
        "measures). The HTTP floor sends startsafe's requests as `GET`s to the baseline's "
        "view, which reads one row and writes nothing: an effect step of two HTTP "
        "requests to Django cannot be cheaper than the floor's.",
        "",
        "| peer | effect step p50 ms | p90 ms | read step p50 ms | any step p50 ms "
        "| p90 ms | whole agent p50 ms | p90 ms | startsafe's effect step ÷ this "
        "| startsafe's agent ÷ this |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name in PEERS:
        p = peers[name]
        lines.append(
            f"| {LABELS[name]} | {p['effect_p50']:.1f} | {p['effect_p90']:.1f} | "
            f"{p['read_p50']:.1f} | {p['step_p50']:.1f} | {p['step_p90']:.1f} | "
            f"{p['agent_p50']:.1f} | {p['agent_p90']:.1f} | "
            f"{ours['effect_p50'] / p['effect_p50']:.2f} | "
            f"{ours['agent_p50'] / p['agent_p50']:.2f} |"
        )

    def by_round(of: dict, peer_names: tuple[str, ...]) -> str:
        return "; ".join(
            f"{SHORT[name]} "
            + ", ".join(
                f"{a / b:.2f}"
                for a, b in zip(
                    of["round_effect_p50"], peers[name]["round_effect_p50"], strict=True
                )
            )
            for name in peer_names
        )

    libraries = tuple(name for name in PEERS if name not in ("startsafe", "floor"))
    lines += [
        "",
        "Round by round, startsafe's effect step (median) over the peer's of the same "
        f"round: {by_round(ours, PEERS[1:])}. The HTTP floor's over the libraries' "
        f"(what two requests cost before any journal work): {by_round(floor, libraries)}.",
        "",
    ]
    return lines


if __name__ == "__main__":
    serve(sys.argv[1])
