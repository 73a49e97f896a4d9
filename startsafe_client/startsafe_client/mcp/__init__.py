"""startsafe-mcp: a journaling proxy between any MCP client and the MCP servers it uses.

::

    startsafe-mcp --config startsafe-mcp.toml [--run-key K] [--http HOST:PORT]

MCP has no idempotency key, and a client whose response stream broke re-issues the
call as a new request: every dropped stream on a write tool is a possible
duplicate, and a restarted agent repeats whatever it did. The proxy lists the tools
of the servers in its configuration and records every ``tools/call`` with startsafe
before forwarding it, keyed by the argument fields its rules name (never by what
the model wrote), so a replay, a re-issued call or a restarted agent is skipped,
waits for a person, or settles an unknown outcome through a reconcile tool.

- :mod:`.config` — the TOML file, refused at start with the file, the line and
  what is wrong;
- :mod:`.upstreams` — the servers (stdio command or URL) and their tools;
- :mod:`.proxy` — classification, keys, and what each answer means to the agent,
  on the protocol core every adapter uses (``AsyncRun.call_spec``);
- :mod:`.cli` — the ``startsafe-mcp`` command.

Installed with the ``mcp`` extra (``pip install 'startsafe-client[mcp]'``), which
brings the official MCP Python SDK; ``import startsafe_client`` alone imports none
of it.
"""

from __future__ import annotations

from .config import Config, ConfigError, Template, load_config
from .proxy import Proxy, open_proxy
from .upstreams import StartFailed

__all__ = ["Config", "ConfigError", "Proxy", "StartFailed", "Template", "load_config", "open_proxy"]
