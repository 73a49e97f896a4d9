"""The CRM: a small MCP server (the official SDK's ``MCPServer``) for customers and campaigns.

    python examples/mcp/crm_server.py         (stdio: startsafe-mcp starts it)

- ``lookup_customer(email)``: a read (``readOnlyHint``);
- ``send_campaign(campaign_id, segment, subject, recipients)``: sends an e-mail
  campaign, one line in the ledger (``LEDGER`` in its environment). It has no
  lookup: when its outcome is unknown, a person decides.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ledger  # noqa: E402 (examples/ledger.py: the providers' log)
from support_agent import CUSTOMERS  # noqa: E402 (the example's one customer table)

LEDGER = Path(os.environ.get("LEDGER", "ledger.jsonl"))

crm = MCPServer("crm", instructions="A CRM: customers and e-mail campaigns.")


@crm.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_customer(email: str) -> dict[str, Any]:
    """Look a customer up by e-mail address."""
    return {"email": email, **CUSTOMERS.get(email, {"name": "there", "plan": "free"})}


@crm.tool(annotations=ToolAnnotations(destructive_hint=False, open_world_hint=True))
def send_campaign(campaign_id: str, segment: str, subject: str, recipients: int) -> dict[str, Any]:
    """Send an e-mail campaign to a segment (a person approves it first)."""
    details = {"segment": segment, "subject": subject, "recipients": recipients}
    ledger.append(LEDGER, "campaign", campaign_id, details)
    return {"campaign_id": campaign_id, **details}


if __name__ == "__main__":
    crm.run()
