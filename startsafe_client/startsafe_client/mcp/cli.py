"""``startsafe-mcp --config FILE [--run-key K] [--http HOST:PORT]``: run the journaling proxy.

Towards the agent it speaks MCP over stdio (the default: an MCP client starts it as
a server command), or over streamable HTTP at ``http://HOST:PORT/mcp`` with
``--http``. It logs to standard error (``--log-level``; waits for a person's
decision are logged at ``warning``, with the console page).

Exit codes: 0 stopped (the agent closed the session, or SIGTERM / SIGINT), 1 it
could not start (a server, the address, the token), 2 the configuration or the
command line is refused (with the file, the line and what is wrong).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import anyio.abc
import uvicorn
from mcp.server import Server
from mcp.server.stdio import stdio_server

from .config import ConfigError, load_config
from .proxy import open_proxy
from .upstreams import StartFailed

logger = logging.getLogger("startsafe_client.mcp")

STARTED, NOT_STARTED, REFUSED = 0, 1, 2


def main(argv: list[str] | None = None) -> int:
    options = _parse(argv)
    logging.basicConfig(stream=sys.stderr, format="startsafe-mcp %(levelname)s: %(message)s")
    logging.getLogger("startsafe_client").setLevel(options.log_level.upper())
    try:
        config = load_config(options.config)
    except ConfigError as refused:
        print(f"startsafe-mcp: the configuration is refused:\n{refused}", file=sys.stderr)
        return REFUSED
    settings = config.startsafe
    try:
        anyio.run(
            _serve,
            config,
            os.environ.get("STARTSAFE_URL") or settings.url,
            os.environ.get(settings.token_env),
            options.run_key or os.environ.get("STARTSAFE_RUN_KEY") or settings.run_key,
            options.http,
        )
    except BaseException as error:  # noqa: BLE001 (the SDK's task groups wrap errors in groups)
        found = _inner(error, (ConfigError, StartFailed))
        if isinstance(found, ConfigError):
            print(f"startsafe-mcp: the configuration is refused:\n{found}", file=sys.stderr)
            return REFUSED
        if isinstance(found, StartFailed):
            print(f"startsafe-mcp: cannot start: {found}", file=sys.stderr)
            return NOT_STARTED
        raise
    return STARTED


async def _serve(
    config: Any,
    url: str | None,
    token: str | None,
    run_key: str | None,
    http: tuple[str, int] | None,
) -> None:
    async with open_proxy(config, url=url, token=token, run_key=run_key) as proxy:
        server = proxy.mcp_server()
        names = ", ".join(proxy.upstreams.tools)
        if http is None:
            await _serve_stdio(server, f"serving {names} over stdio")
        else:
            host, port = http
            await _serve_http(server, host, port, f"serving {names} at http://{host}:{port}/mcp")


async def _serve_stdio(server: Server[Any], serving: str) -> None:
    """Serve until the agent closes standard input, or a signal stops the proxy."""
    async with anyio.create_task_group() as group:
        await group.start(_stop_on_signal, group.cancel_scope, None)
        async with stdio_server() as (read, write):
            logger.info(serving)
            await server.run(read, write, server.create_initialization_options())
        group.cancel_scope.cancel()


async def _serve_http(server: Server[Any], host: str, port: int, serving: str) -> None:
    """Serve streamable HTTP at ``/mcp`` until a signal stops the proxy."""
    app = server.streamable_http_app(host=host)
    web = _Uvicorn(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    async with anyio.create_task_group() as group:
        await group.start(_stop_on_signal, group.cancel_scope, web)
        group.start_soon(_say_once_listening, web, serving)
        await web.serve()
        group.cancel_scope.cancel()


async def _say_once_listening(web: uvicorn.Server, serving: str) -> None:
    while not web.started:
        await anyio.sleep(0.05)
    logger.info(serving)


class _Uvicorn(uvicorn.Server):
    """uvicorn without its signal handlers: the proxy stops on signals itself, and
    finishes its attempts before it exits (uvicorn re-raises a caught signal at the
    end, which would end the process first)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _stop_on_signal(
    scope: anyio.CancelScope,
    web: _Uvicorn | None,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Stop on SIGTERM or SIGINT: the proxy then finishes its attempts before it exits."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        task_status.started()  # installed before anything is served
        async for signum in signals:
            logger.info("stopping (%s)", signal.Signals(signum).name)
            if web is None:
                scope.cancel()
            else:
                web.should_exit = True  # it closes its connections, then serve() returns
            return


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="startsafe-mcp",
        description="An MCP proxy that journals every tools/call with startsafe before "
        "forwarding it, so a restarted agent or a re-issued call never does an effect twice.",
    )
    parser.add_argument("--config", required=True, help="the configuration file (TOML)")
    parser.add_argument(
        "--run-key",
        help="the run's key (else STARTSAFE_RUN_KEY, else run_key in [startsafe]); a "
        "call's _meta 'startsafe/run_key' wins",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        type=_host_port,
        help="serve streamable HTTP at http://HOST:PORT/mcp instead of stdio",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="what to log on standard error (default: warning)",
    )
    return parser.parse_args(argv)  # a refused command line exits 2, as argparse does


def _host_port(text: str) -> tuple[str, int]:
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (as 127.0.0.1:8765)")
    return host.strip("[]"), int(port)


def _inner(error: BaseException, wanted: tuple[type[BaseException], ...]) -> BaseException | None:
    """The first ``wanted`` exception in ``error`` or the groups it nests."""
    if isinstance(error, wanted):
        return error
    for inner in getattr(error, "exceptions", ()):
        found = _inner(inner, wanted)
        if found is not None:
            return found
    return None


if __name__ == "__main__":
    sys.exit(main())
