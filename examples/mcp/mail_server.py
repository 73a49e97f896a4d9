"""The mailbox: a small MCP server (the official SDK's ``MCPServer``) that sends replies.

    python examples/mcp/mail_server.py        (stdio: startsafe-mcp starts it)

- ``send_reply(message_id, to, subject, body)`` sends a reply to an inbound message:
  one line in the ledger, which stands in for the provider;
- ``find_reply(message_id)`` looks the reply up in the sent items (the ledger, read
  in full as it is now: the provider's latest state), marked ``readOnlyHint``. It
  answers ``found`` and, when found, ``result``: what ``send_reply`` answered. It is
  the reconcile tool of ``send_reply`` in ``startsafe-mcp.toml``.

Its environment comes from the proxy's configuration (``env``): ``LEDGER``, the
ledger file; ``MAILBOX_CRASH_FLAG``, a file that arms a crash. When that file
exists, ``send_reply`` removes it and, once the reply is in the ledger, kills the
process that started this server (the proxy) with SIGKILL: the agent's side dies
after the effect and before its report, the worst moment.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ledger  # noqa: E402 (examples/ledger.py: the providers' log)

LEDGER = Path(os.environ.get("LEDGER", "ledger.jsonl"))
CRASH_FLAG = os.environ.get("MAILBOX_CRASH_FLAG")

mailbox = MCPServer("mail", instructions="A mailbox: reply to inbound messages.")


@mailbox.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False))
def send_reply(message_id: str, to: str, subject: str, body: str) -> dict[str, Any]:
    """Reply to the customer's inbound message (by its message id)."""
    crash = CRASH_FLAG is not None and _consume(Path(CRASH_FLAG))
    ledger.append(LEDGER, "reply", message_id, {"to": to, "subject": subject, "body": body})
    if crash:
        print("!! mailbox: reply sent; SIGKILL to the proxy before it reports", file=sys.stderr)
        os.kill(os.getppid(), signal.SIGKILL)
    return {"in_reply_to": message_id, "to": to, "subject": subject}


@mailbox.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_reply(message_id: str) -> dict[str, Any]:
    """Look for a reply to the inbound message in the sent items."""
    found = ledger.find(LEDGER, "reply", message_id)
    if found is None:
        return {"found": False, "searched": "the sent items, in full"}
    line, entry = found
    details = entry["details"]
    return {
        "found": True,
        "sent_at": entry["at"],
        "ledger_line": line,
        "result": {"in_reply_to": message_id, "to": details["to"], "subject": details["subject"]},
    }


def _consume(flag: Path) -> bool:
    try:
        flag.unlink()
    except FileNotFoundError:
        return False
    return True


if __name__ == "__main__":
    mailbox.run()
