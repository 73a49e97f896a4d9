"""What the startsafe-mcp tests share: a configuration over real MCP servers of the SDK,
the proxy as a process (streamable HTTP), and the SDK's own client driven from a test.

The servers are the example's mailbox and CRM (``examples/mcp/``) and the tests' notes
service (``tests/mcp_notes_server.py``), started by the proxy over stdio with this
interpreter; they write to a ledger in the test's folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PROXY = Path(sys.executable).parent / "startsafe-mcp"  # the console script, as installed

SERVERS = {
    "mail": (EXAMPLES / "mcp" / "mail_server.py", "trust_annotations = true"),
    "crm": (EXAMPLES / "mcp" / "crm_server.py", ""),
    "notes": (ROOT / "tests" / "mcp_notes_server.py", ""),
}

RULES = """
[tools."crm.lookup_customer"]
kind = "read"

[tools."mail.send_reply"]
key = "outlook:message:{message_id}"
key_source = "provider"
reconcile = "mail.find_reply"
preview = "Reply to {to}: {subject}"

[tools."crm.send_campaign"]
key = "campaign:{campaign_id}"
key_source = "intent"
needs_approval = true
preview = "Send {subject} to {recipients} recipients of segment {segment}"

[tools."notes.post_note"]
key = "note:{note_id}"
key_source = "intent"

[tools."notes.environment"]
kind = "read"
"""


def write_config(
    folder: Path,
    url: str,
    *,
    servers: tuple[str, ...] = ("mail", "crm", "notes"),
    heartbeat_timeout: int = 30,
    supersede: str = '"stale"',
    approval_timeout: float = 60,
    rules: str = RULES,
    notes_delay: float = 0,
    ledger_path: Path | None = None,
) -> Path:
    """A configuration of these servers (their rules included), in ``folder``; the servers
    write to ``ledger_path`` (``ledger.jsonl`` there by default)."""
    folder.mkdir(parents=True, exist_ok=True)
    ledger_path = ledger_path or folder / "ledger.jsonl"
    parts = [
        "[startsafe]",
        f'url = "{url}"',
        f"supersede = {supersede}",
        f"heartbeat_timeout = {heartbeat_timeout}",
        f"approval_timeout = {approval_timeout}",
        "poll_interval = 0.2",
    ]
    for name in servers:
        script, trust = SERVERS[name]
        env = (
            f'LEDGER = "{ledger_path}", MAILBOX_CRASH_FLAG = "{folder / "crash-after-send"}", '
            f'NOTES_DELAY = "{notes_delay}", NOTES_MARK = "configured"'
        )
        parts += [
            "",
            f"[servers.{name}]",
            f'command = ["{sys.executable}", "{script}"]',
            f"env = {{ {env} }}",
            trust,
        ]
    wanted = [
        rule
        for rule in rules.strip().split("\n\n")
        if re.match(r'\[tools\."(\w+)\.', rule).group(1) in servers  # type: ignore[union-attr]
    ]
    path = folder / "startsafe-mcp.toml"
    path.write_text("\n".join(parts) + "\n" + "\n\n".join(wanted) + "\n", encoding="utf-8")
    return path


def proxy_env(token: str, **extra: str) -> dict[str, str]:
    """The proxy's environment: the token, and no more than a shell would need."""
    return {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **extra} | {
        "STARTSAFE_TOKEN": token
    }


def stdio_proxy(config: Path, token: str, *args: str) -> StdioServerParameters:
    """The proxy as an MCP client starts it: a command, with the token in its environment."""
    return StdioServerParameters(
        command=str(PROXY), args=["--config", str(config), *args], env={"STARTSAFE_TOKEN": token}
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def http_proxy(config: Path, token: str, *args: str, timeout: float = 120) -> Iterator[str]:
    """``startsafe-mcp --http``, serving until the block ends (then SIGTERM); yields its URL."""
    port = free_port()
    command = [str(PROXY), "--config", str(config), "--http", f"127.0.0.1:{port}"]
    log = config.parent / f"proxy-{port}.log"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [*command, "--log-level", "info", *args],
            stdin=subprocess.DEVNULL,
            stderr=stderr,
            env=proxy_env(token),
            cwd=config.parent,
        )
    try:
        deadline = time.monotonic() + timeout
        while "serving" not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the proxy did not start: {log.read_text()}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.send_signal(signal.SIGTERM)  # it finishes its attempts, then exits
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise AssertionError(f"the proxy did not stop: {log.read_text()}") from None


class Agent:
    """The MCP SDK's own client, connected to the proxy, called from a synchronous test.

    Its event loop runs in a thread of its own (an anyio portal), so the test keeps the
    database to itself and can decide as an operator while a call waits.
    """

    def __init__(self, portal: BlockingPortal, client: Client) -> None:
        self.portal = portal
        self.client = client

    def call(self, name: str, run_key: str | None = None, /, **args: Any) -> Any:
        """``tools/call``, with ``_meta`` ``startsafe/run_key`` when ``run_key`` is given."""
        return self.portal.call(self._call, name, args, run_key)

    async def _call(self, name: str, args: dict[str, Any], run_key: str | None) -> Any:
        meta = {"startsafe/run_key": run_key} if run_key else None
        return await self.client.call_tool(name, args, meta=meta)

    def tools(self) -> list[Any]:
        return self.portal.call(self.client.list_tools).tools


@contextlib.contextmanager
def connect(server: Any, **options: Any) -> Iterator[Agent]:
    """An :class:`Agent` connected to ``server`` (a URL, or stdio parameters)."""
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(Client(server, cache=None, **options)) as client,
    ):
        yield Agent(portal, client)


def text(result: Any) -> str:
    """The text of a ``CallToolResult``."""
    return " ".join(getattr(block, "text", "") for block in result.content)
