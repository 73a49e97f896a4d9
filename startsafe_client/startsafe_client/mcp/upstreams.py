"""The MCP servers behind the proxy: started (stdio) or reached (URL), their tools listed once.

Each server of the configuration is an MCP client session of the official SDK
(``mcp.Client``): a stdio server is started by its ``command`` in the configuration
file's folder (or its ``cwd``) with **only the SDK's safe default environment**
(``HOME``, ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM``, ``USER``) **plus the
configuration's** ``env``: the proxy's own environment, the startsafe token
included, never reaches a server. A URL server is reached over streamable HTTP.

Tools keep their upstream definitions (schema, output schema, annotations); the
agent sees them under their own name when there is one server, ``SERVER.TOOL``
when there are several. The journal always names a tool ``SERVER.TOOL``, so adding
a server later changes no tool's name, key or registry entry.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters

from .config import Config

logger = logging.getLogger("startsafe_client.mcp")

LIST_PAGES = 100  # a server that pages forever cannot hang the start


class StartFailed(Exception):
    """The proxy cannot start: a server, the token or a rule; the message says which."""


@dataclass(frozen=True)
class UpstreamTool:
    """One tool of one server.

    Attributes:
        server: the server's name in the configuration.
        definition: the tool as its server lists it (name, schemas, annotations).
        qualified: ``SERVER.TOOL``, its name in the journal and in the rules.
        exposed: the name the agent calls it by.
    """

    server: str
    definition: types.Tool
    qualified: str
    exposed: str

    @property
    def name(self) -> str:
        """The tool's own name, as its server knows it."""
        return self.definition.name

    @property
    def read_only_hint(self) -> bool:
        annotations = self.definition.annotations
        return bool(annotations is not None and annotations.read_only_hint is True)

    def for_agent(self) -> types.Tool:
        """The definition the agent lists: the server's, under the exposed name."""
        return self.definition.model_copy(update={"name": self.exposed})

    def schema_fields(self) -> set[str] | None:
        """The argument names its input schema declares (``None``: it declares none)."""
        properties = self.definition.input_schema.get("properties")
        return set(properties) if isinstance(properties, dict) else None


class Upstreams:
    """The connected servers and their tools; enter :func:`connected` to get one."""

    def __init__(self) -> None:
        self.clients: dict[str, Client] = {}  # the servers still connected
        self.tools: dict[str, UpstreamTool] = {}  # by exposed name
        self.by_qualified: dict[str, UpstreamTool] = {}

    async def call(self, tool: UpstreamTool, arguments: dict[str, Any]) -> types.CallToolResult:
        """Call the tool on its server; the SDK's exceptions go on (an ``MCPError``...).

        Raises:
            ServerGone: its server stopped before the call: nothing was sent.
        """
        client = self.clients.get(tool.server)
        if client is None:
            raise ServerGone(f"server {tool.server} is not running: {tool.qualified} was not sent")
        return await client.call_tool(tool.name, arguments)

    def _add(self, server: str, definitions: list[types.Tool], prefixed: bool) -> None:
        for definition in definitions:
            qualified = f"{server}.{definition.name}"
            tool = UpstreamTool(
                server, definition, qualified, qualified if prefixed else definition.name
            )
            self.tools[tool.exposed] = tool
            self.by_qualified[qualified] = tool


class ServerGone(Exception):
    """The tool's server stopped (its process exited, its connection closed)."""


@asynccontextmanager
async def connected(config: Config) -> AsyncIterator[Upstreams]:
    """Start or reach every server at once, list its tools; close them all on the way out.

    Each server's session lives in a task of its own, so that servers start side by
    side, and one that stops later is only that server gone (its tools answer an
    error), not the proxy.

    Raises:
        StartFailed: a server could not be started, reached or listed.
    """
    upstreams = Upstreams()
    listed: dict[str, list[types.Tool]] = {}
    failed: dict[str, StartFailed] = {}
    ready = {name: anyio.Event() for name in config.servers}
    stop = anyio.Event()

    async def hold(name: str) -> None:
        try:
            async with _client(config, name) as client:
                listed[name] = await _list_all(client)
                upstreams.clients[name] = client
                ready[name].set()
                await stop.wait()
        except Exception as error:  # noqa: BLE001 (said plainly: at start, or as a log line)
            if not ready[name].is_set():
                failed[name] = StartFailed(
                    f"server {name} ({_where(config, name)}): {_first_cause(error)}"
                )
            else:
                logger.warning("server %s stopped: %s", name, _first_cause(error))
        finally:
            upstreams.clients.pop(name, None)
            ready[name].set()

    try:
        async with anyio.create_task_group() as group:
            for name in config.servers:
                group.start_soon(hold, name)
            for event in ready.values():
                await event.wait()
            try:
                if failed:
                    raise next(iter(failed.values()))
                for name in config.servers:  # in the file's order
                    upstreams._add(name, listed[name], prefixed=len(config.servers) > 1)
                yield upstreams
            finally:
                stop.set()
    except Exception as error:
        alone = _alone(error)
        if alone is error:
            raise
        raise alone from None  # the caller's own exception, not the task group's wrapper


def _client(config: Config, name: str) -> Client:
    server = config.servers[name]
    info = types.Implementation(name="startsafe-mcp", version=package_version())
    if server.url is not None:
        return Client(server.url, cache=None, client_info=info)
    assert server.command is not None
    params = StdioServerParameters(
        command=server.command[0],
        args=server.command[1:],
        env=dict(server.env),  # merged over the SDK's safe default environment, nothing else
        cwd=config.cwd_of(name),
    )
    return Client(params, cache=None, client_info=info)


async def _list_all(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


def _where(config: Config, name: str) -> str:
    server = config.servers[name]
    return server.url or " ".join(server.command or [])


def _alone(error: BaseException) -> BaseException:
    """The one exception an exception group of one holds (the group itself otherwise)."""
    while len(getattr(error, "exceptions", ())) == 1:
        error = error.exceptions[0]  # type: ignore[attr-defined]
    return error


def _first_cause(error: BaseException) -> str:
    """The innermost error of an exception group, as ``Type: message``."""
    while getattr(error, "exceptions", None):  # an exception group (Python 3.11+, anyio)
        error = error.exceptions[0]  # type: ignore[attr-defined]
    return f"{type(error).__name__}: {error}"


def package_version() -> str:
    try:
        return importlib.metadata.version("startsafe-client")
    except importlib.metadata.PackageNotFoundError:
        return "0"
