"""A scripted MCP agent that answers a support ticket through startsafe-mcp.

    python examples/mcp/agent.py --ticket ticket-4812 \\
        [--config examples/mcp/startsafe-mcp.toml | --url http://127.0.0.1:8765/mcp] \\
        [--seed 1] [--transcript var/mcp/transcript.jsonl]

It is an MCP client of the official SDK (``mcp.Client``), as Claude, Cursor or an
SDK agent would be. By default it starts the proxy itself over stdio
(``startsafe-mcp --config FILE``, passing it ``STARTSAFE_TOKEN``: an MCP client
gives a server it starts only the few safe variables it is told to); with
``--url`` it talks to a proxy already serving streamable HTTP. Every call carries
the ticket as its run key (``_meta`` ``"startsafe/run_key"``).

Its model is the fake, seeded one of the other examples (``fake_llm.FakeLLM``): it
looks the customer up, then sends the reply and the campaign, and on every attempt
it rewrites their wording and changes their order. Attempts are counted in the
transcript, which also keeps what each call answered.

The tools it calls are those of the proxy: ``crm.lookup_customer``,
``mail.send_reply`` and ``crm.send_campaign`` (``examples/mcp/*_server.py``).

Exit codes: 0 answered, 3 a call answered an error (read it: a person decides at
the console page it names, or start again later), 137 the proxy died during a call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fake_llm import FakeLLM, ticket_for  # noqa: E402

HERE = Path(__file__).resolve().parent
RUN_KEY_META = "startsafe/run_key"
ANSWERED, SEE_ERRORS, PROXY_DIED = 0, 3, 137
CONNECTION_CLOSED = -32000  # the SDK's code when the server's side went away
# What the proxy's environment needs from ours (the SDK passes on only HOME, PATH...).
PASSED_ON = ("STARTSAFE_TOKEN", "STARTSAFE_URL")


def main(argv: list[str] | None = None) -> int:
    options = _parse(argv)
    attempt = _attempts_so_far(options.transcript, options.ticket) + 1
    _keep(options.transcript, {"ticket": options.ticket, "attempt": attempt, "tool": None})
    print(f"{options.ticket}: attempt {attempt} of the agent", flush=True)
    try:
        return anyio.run(_answer, options, attempt)
    except BaseException as error:  # noqa: BLE001 (the SDK's task groups wrap it in groups)
        closed = _connection_closed(error)
        if closed is None:
            raise
        print(f"!! the proxy died during a call ({closed.message})", flush=True)
        return PROXY_DIED


async def _answer(options: argparse.Namespace, attempt: int) -> int:
    ticket = ticket_for(options.ticket)
    llm = FakeLLM(options.seed, attempt)
    meta = {RUN_KEY_META: options.ticket}
    errors = 0
    async with Client(_proxy(options), cache=None) as proxy:
        names = {t.name.rpartition(".")[2]: t.name for t in (await proxy.list_tools()).tools}
        customer: dict[str, Any] = {}
        for step in [s for s in llm.plan(ticket) if s != "import_dataset"]:
            args = llm.arguments(step, ticket, customer)
            answer = await proxy.call_tool(names[step], args, meta=meta)
            text = _text(answer)
            print(f"  {names[step]}: {'error' if answer.is_error else 'ok'}: {text}", flush=True)
            _keep(
                options.transcript,
                {
                    "ticket": options.ticket,
                    "attempt": attempt,
                    "tool": names[step],
                    "args": args,
                    "is_error": answer.is_error,
                    "text": text,
                    "structured": answer.structured_content,
                },
            )
            if answer.is_error:
                errors += 1
                if text.startswith("rejected by an operator"):
                    llm.hear(text)
            elif step == "lookup_customer":
                customer = answer.structured_content or {}
    if errors:
        print(f"{options.ticket}: {errors} call(s) answered an error: see above", flush=True)
        return SEE_ERRORS
    print(f"{options.ticket} answered.", flush=True)
    return ANSWERED


def _proxy(options: argparse.Namespace) -> Any:
    """The proxy: a URL (streamable HTTP), or the command that starts it over stdio."""
    if options.url:
        return options.url
    command = shutil.which("startsafe-mcp") or str(Path(sys.executable).parent / "startsafe-mcp")
    env = {name: os.environ[name] for name in PASSED_ON if os.environ.get(name)}
    return StdioServerParameters(command=command, args=["--config", str(options.config)], env=env)


def _text(answer: types.CallToolResult) -> str:
    text = " ".join(c.text for c in answer.content if isinstance(c, types.TextContent))
    return " ".join(text.split())[:300]


def _keep(path: Path, line: dict[str, Any]) -> None:
    """One line of the transcript: an attempt's start (``tool`` null), or a call's answer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def _attempts_so_far(path: Path, ticket: str) -> int:
    if not path.exists():
        return 0
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return max((line["attempt"] for line in lines if line["ticket"] == ticket), default=0)


def _connection_closed(error: BaseException) -> MCPError | None:
    if isinstance(error, MCPError) and error.code == CONNECTION_CLOSED:
        return error
    for inner in getattr(error, "exceptions", ()):
        found = _connection_closed(inner)
        if found is not None:
            return found
    return None


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticket", required=True)
    parser.add_argument("--config", type=Path, default=HERE / "startsafe-mcp.toml")
    parser.add_argument("--url", help="a proxy serving streamable HTTP (startsafe-mcp --http)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--transcript", type=Path, default=Path("var/mcp/transcript.jsonl"))
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
