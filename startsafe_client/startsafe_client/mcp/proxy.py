"""The journaling proxy: every ``tools/call`` is recorded by startsafe before it is forwarded.

The proxy is an MCP server towards the agent and an MCP client towards each server
of its configuration (:mod:`.upstreams`). A call goes through the protocol core,
``AsyncRun.call_spec`` (the same as every framework adapter), so what each answer
means is written once, in :mod:`startsafe_client.attempt`; the proxy only says how
a tool is declared, how it is forwarded, and what the agent hears:

- ``execute``: forwarded to its server with ``effect.args`` (an operator may have
  edited them); the ``CallToolResult`` (content, structured content) is reported as
  the effect's result, and the agent gets it. A result with ``isError``, or a call
  its server refuses as a request (an unknown tool, invalid parameters), did not
  happen: reported ``failed``, and the next call of its key runs it again;
- ``skip``: the recorded result, not forwarded;
- ``wait``: polled for at most ``approval_timeout``, then an error result naming the
  effect's console page;
- ``blocked``: an error result with the operator's note;
- ``review``: the rule's reconcile tool, called with the effect's arguments (those
  its schema names); its structured content says ``found`` (true or false), and
  ``result``, what the effect returned. Without one, or when it cannot tell, an error
  result naming the console page;
- a key template with a missing or empty field: an error result, nothing recorded,
  nothing forwarded.

**An exception is not proof that nothing happened.** A forwarded effect whose call
breaks off (the server died, the report could not be sent) has an unknown outcome:
the proxy ends that attempt (``failed``, so the effect becomes ``unknown``) and the
run's next call starts the next attempt, where the reconcile tool or a person
settles it. It is never forwarded again on its own.

**One proxy process is one attempt** of each run it serves (the run key of the
configuration, ``--run-key`` or ``STARTSAFE_RUN_KEY``, or a call's ``_meta``
``startsafe/run_key``, which wins), started at the run's first call, heartbeating
while the process lives, finished ``failed`` when it stops (so that the next proxy
continues the run: the verdict decides). A proxy started again supersedes a stale
attempt (``supersede``). A call keeps going when the agent drops its request (a
broken stream the agent re-issues with a new request id): the re-issued call has
the same key, so it waits for the first one or skips; it never executes twice.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.shared.exceptions import MCPError

from ..aio import AsyncClient, AsyncRun
from ..errors import (
    AlreadyRunning,
    ApprovalTimeout,
    AttemptStopped,
    EffectBlocked,
    KeyRefused,
    NotPerformed,
    OutcomeUnknown,
    RestartBlocked,
    RunFinished,
    StartsafeError,
)
from ..protocol import Waiting
from ..specs import Reconciliation, ToolSpec, effect, read
from .config import Config, ToolRule
from .upstreams import (
    ServerGone,
    StartFailed,
    Upstreams,
    UpstreamTool,
    connected,
    package_version,
)

logger = logging.getLogger("startsafe_client.mcp")

RUN_KEY_META = "startsafe/run_key"
# JSON-RPC errors by which a server refuses a request before running it.
REFUSED_CODES = frozenset(
    {types.PARSE_ERROR, types.INVALID_REQUEST, types.METHOD_NOT_FOUND, types.INVALID_PARAMS}
)
MAX_RECORDED = 200_000  # characters of JSON; api.md: a result is up to 256 KiB
SESSION_ENDED = (
    "startsafe-mcp stopped (its MCP session ended); a proxy started again with this "
    "run key goes on with the run"
)


class Proxy:
    """The tools, their specs, the runs of this process, and each journaled call.

    Made by :func:`open_proxy`; :meth:`mcp_server` is the MCP server the agent talks to.
    """

    def __init__(
        self, config: Config, upstreams: Upstreams, client: AsyncClient, run_key: str | None
    ) -> None:
        self.config = config
        self.upstreams = upstreams
        self.client = client
        self.run_key = run_key
        self.specs: dict[str, ToolSpec] = {}  # by qualified name
        self.runs: dict[str, AsyncRun] = {}  # this process's attempt of each run
        self.stopped: dict[str, AttemptStopped] = {}  # runs another attempt took over
        self._starting: dict[str, asyncio.Lock] = {}
        self._calls: set[asyncio.Task[types.CallToolResult]] = set()

    # --- tools: their specs and their declaration ----------------------------------

    def check_rules(self) -> None:
        """Refuse rules that name no tool of their server (with the file's line)."""
        problems = []
        for name, rule in self.config.tools.items():
            if name not in self.upstreams.by_qualified:
                problems.append(self.config.problem(("tools", name), "no server offers this tool"))
            if rule.reconcile and rule.reconcile not in self.upstreams.by_qualified:
                problems.append(
                    self.config.problem(
                        ("tools", name, "reconcile"), f"no server offers {rule.reconcile}"
                    )
                )
        if problems:
            raise self.config.refuse(problems)

    def classify(self, confirmed: frozenset[str] = frozenset()) -> None:
        """Each tool's spec: its rule, else a read if it says ``readOnlyHint`` and its
        server is trusted (or an admin confirmed it in the registry), else an unkeyed
        effect (the MCP spec's defaults: destructive, not idempotent, open world)."""
        for qualified, tool in self.upstreams.by_qualified.items():
            rule = self.config.tools.get(qualified)
            if rule is not None:
                self.specs[qualified] = self._spec_of(rule)
            elif tool.read_only_hint and (self._trusted(tool) or qualified in confirmed):
                self.specs[qualified] = read()
            else:
                self.specs[qualified] = effect()

    def check_reconcile_tools(self) -> None:
        """Refuse a reconcile tool that is not a read: looking up must change nothing."""
        problems = [
            self.config.problem(
                ("tools", name, "reconcile"),
                f'{rule.reconcile} is not a read: give it a rule with kind = "read", or '
                "trust its server's annotations if it says readOnlyHint",
            )
            for name, rule in self.config.tools.items()
            if rule.reconcile and self.specs[rule.reconcile].kind != "read"
        ]
        if problems:
            raise self.config.refuse(problems)

    def _trusted(self, tool: UpstreamTool) -> bool:
        return self.config.servers[tool.server].trust_annotations

    def _spec_of(self, rule: ToolRule) -> ToolSpec:
        if rule.kind == "read":
            return read()
        key, preview, source = rule.key_template, rule.preview_template, rule.key_source
        return effect(
            key=(lambda args: key.key(args, source or "intent")) if key else None,
            needs_approval=rule.needs_approval,
            approvals_required=rule.approvals_required,
            approval_ttl=rule.approval_ttl,
            timeout=rule.timeout,
            preview=preview.preview if preview else None,
            reconcile=self._lookup(self.upstreams.by_qualified[rule.reconcile])
            if rule.reconcile
            else None,
        )

    async def declare_tools(self) -> frozenset[str]:
        """``POST /api/v1/tools`` once, with each tool's schema and annotations, through
        the client's declaration (its batches, retries and process-wide record, so the
        calls' own declaration finds them sent and sends nothing more).

        Returns the tools an admin confirmed in the registry. A server without the
        registry answers 404: the step is skipped (a debug line says so). Under the
        agent's ``closed`` mode the tools it refuses are left out with a warning; their
        calls are refused (``tool_not_registered``) while the others run.
        """
        declarations = self.client._adopt(
            self._declaration(t) for t in self.upstreams.by_qualified.values()
        )
        try:
            declared = await self.client._drive(self.client._declare(declarations, lenient=True))
        except StartsafeError as error:
            raise StartFailed(f"declaring the tools to startsafe failed: {error}") from error
        self.client._say(declared, logger, logging.DEBUG)
        return frozenset(t["name"] for t in declared.tools if t.get("state") == "confirmed")

    def _declaration(self, tool: UpstreamTool) -> dict[str, Any]:
        rule = self.config.tools.get(tool.qualified)
        spec = self.specs.get(tool.qualified) or (self._spec_of(rule) if rule else effect())
        declared: dict[str, Any] = {
            "name": tool.qualified,
            "kind": spec.kind,
            "schema": tool.definition.input_schema,
        }
        if rule is not None and rule.key_source:
            declared["key_source"] = rule.key_source
        if spec.needs_approval:
            declared["needs_approval"] = True
            declared["approvals_required"] = spec.approvals_required
        if tool.definition.annotations is not None:
            declared["annotations"] = tool.definition.annotations.model_dump(
                mode="json", by_alias=True, exclude_none=True
            )
        return declared

    # --- one call ---------------------------------------------------------------------

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None, meta: Any = None
    ) -> types.CallToolResult:
        """Journal the call, then act on the answer (the module doc says how).

        The work runs in a task of its own: when the agent drops the request (a
        broken stream, a cancellation), the call still finishes and is reported.
        """
        task = asyncio.create_task(self._journaled(name, dict(arguments or {}), meta or {}))
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return await asyncio.shield(task)

    async def _journaled(self, name: str, args: dict[str, Any], meta: Any) -> types.CallToolResult:
        """One call, from the agent's request to what it reads.

        1. The tool and the run key (``_meta`` first); this process's attempt of the
           run, started at its first call (a refused start is an error result).
        2. ``call_spec`` records the call and acts on the answer; ``perform`` forwards
           it to the server when it is to run.
        3. What the core raises becomes the agent's error result; a forwarded effect
           that broke off ends the attempt (its outcome is unknown).
        """
        tool = self.upstreams.tools.get(name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown tool: {name}")
        run_key = meta.get(RUN_KEY_META) or self.run_key
        if not isinstance(run_key, str) or not run_key.strip():
            return _error(
                f"{name} was not called: no run key. Set run_key in [startsafe], start "
                f"startsafe-mcp with --run-key or STARTSAFE_RUN_KEY, or send _meta "
                f'"{RUN_KEY_META}" with the call'
            )
        try:
            run = await self._attempt(run_key)
        except StartsafeError as refused:
            return _error(f"{name} was not called: {await self._start_refused(run_key, refused)}")
        spec = self.specs[tool.qualified]
        forwarded = False
        refusal: types.CallToolResult | None = None
        answered: types.CallToolResult | None = None  # executed now: the server's own answer

        async def perform(given: dict[str, Any]) -> Any:
            nonlocal forwarded, refusal, answered
            forwarded = True
            try:
                result = await self.upstreams.call(tool, given)
            except ServerGone as gone:
                if spec.kind == "effect":
                    raise NotPerformed(str(gone)) from gone
                raise
            except MCPError as error:
                if spec.kind == "effect" and error.code in REFUSED_CODES:
                    refusal = _error(f"{name}: its server refused the call: {error.message}")
                    raise NotPerformed(error.message) from error
                raise
            if spec.kind == "read":
                return result
            if result.is_error:  # the tool says it failed: reported failed, runs again
                refusal = result
                raise NotPerformed(_text_of(result) or "the tool answered isError")
            answered = result
            return _recorded(result)

        try:
            value = await run.call_spec(tool.qualified, spec, args, perform)
        except (EffectBlocked, ApprovalTimeout, OutcomeUnknown, KeyRefused) as told:
            return _error(told.for_model)
        except NotPerformed as nothing:
            return refusal or _error(f"{name}: not performed: {nothing}")
        except AttemptStopped as stopped:
            return _error(self._attempt_stopped(run_key, run, stopped))
        except Exception as error:
            if spec.kind == "effect" and forwarded:
                return _error(await self._outcome_unknown(run_key, run, name, error))
            if isinstance(error, StartsafeError):
                return _error(f"{name} was not called: startsafe answered {error}")
            logger.warning("%s failed: %s: %s", name, type(error).__name__, error)
            return _error(f"{name} failed: {type(error).__name__}: {error}")
        if spec.kind == "read":
            return value
        return answered or _replayed(value)

    async def _attempt(self, run_key: str) -> AsyncRun:
        """This process's attempt of the run, started at the run's first call."""
        if run_key in self.stopped:
            raise self.stopped[run_key]
        lock = self._starting.setdefault(run_key, asyncio.Lock())
        async with lock:
            run = self.runs.get(run_key)
            if run is None:
                settings = self.config.startsafe
                run = self.client.run(
                    run_key,
                    supersede=settings.supersede,
                    heartbeat_timeout=settings.heartbeat_timeout,
                    agent_version=f"startsafe-mcp {package_version()}",
                )
                await run.start()
                self.runs[run_key] = run
                logger.info("run %s: attempt %s started", run_key, run.attempt)
            return run

    async def _start_refused(self, run_key: str, refused: StartsafeError) -> str:
        """Why the run could not start, and where a person can act on it."""
        if isinstance(refused, RestartBlocked):
            page = await self._run_page(run_key)
            where = f" at {page}" if page else " in the console"
            return f"{refused.message} An operator may allow the restart{where}."
        if isinstance(refused, RunFinished):
            return f"run {run_key!r} is finished (completed or abandoned): use another run key"
        if run_key in self.stopped:
            return (
                f"another attempt took run {run_key!r} over: this proxy no longer calls its "
                "tools; start the proxy again to take it back"
            )
        if isinstance(refused, AlreadyRunning):
            return (
                f"{refused.message} (startsafe-mcp takes a run over by its supersede in "
                f"[startsafe] of {self.config.path})"
            )
        return f"startsafe answered {refused}"

    async def _run_page(self, run_key: str) -> str | None:
        try:
            found = (await self.client.list_runs(run_key=run_key)).get("items") or []
        except StartsafeError:
            return None
        match = [r for r in found if r.get("run_key") == run_key]
        return f"{self.client.base_url}/runs/{match[0]['id']}/" if match else None

    def _attempt_stopped(self, run_key: str, run: AsyncRun, stopped: AttemptStopped) -> str:
        if self.runs.get(run_key) is not run:  # an attempt this proxy ended itself
            return "this call's attempt ended (an outcome became unknown): call again"
        self.runs.pop(run_key, None)
        self.stopped[run_key] = stopped
        logger.warning("run %s: %s; this proxy stops journaling it", run_key, stopped.message)
        return (
            f"another attempt took run {run_key!r} over, or it finished ({stopped.message}): "
            "this proxy no longer calls its tools; start the proxy again to take it back"
        )

    async def _outcome_unknown(
        self, run_key: str, run: AsyncRun, name: str, error: BaseException
    ) -> str:
        """A forwarded effect broke off: end the attempt, so its effect becomes unknown."""
        why = f"{type(error).__name__}: {error}"
        if self.runs.get(run_key) is run:
            self.runs.pop(run_key)
            try:
                await run.finish("failed", f"{name}: its outcome is unknown ({why})")
            except StartsafeError as finishing:
                logger.warning("run %s: the attempt could not be finished: %s", run_key, finishing)
        logger.warning("%s: the outcome is unknown (%s); attempt %s ended", name, why, run.attempt)
        return (
            f"{name}: it may or may not have happened ({why}); do not try it again now. "
            "This attempt ended: the next call starts the next one, where the reconcile "
            f"tool or a person at {self.client.base_url}/ settles it"
        )

    def _lookup(self, target: UpstreamTool) -> Any:
        """The reconcile lookup: the reconcile tool, called with the effect's arguments."""

        async def lookup(args: dict[str, Any], key: str | None) -> Reconciliation | None:
            fields = target.schema_fields()
            given = {k: v for k, v in args.items() if fields is None or k in fields}
            try:
                answer = await self.upstreams.call(target, given)
            except Exception as error:  # noqa: BLE001 (it cannot tell: a person decides)
                logger.warning("%s failed: %s: %s", target.qualified, type(error).__name__, error)
                return None
            structured = answer.structured_content
            found = structured.get("found") if isinstance(structured, dict) else None
            if answer.is_error or not isinstance(found, bool):
                logger.warning("%s did not say found: true or false", target.qualified)
                return None
            evidence = f"{target.qualified} answered: {_text_of(answer) or json.dumps(structured)}"
            if not found:
                return Reconciliation.not_done(evidence[:2000])
            result: dict[str, Any] = {"content": [{"type": "text", "text": evidence}]}
            if "result" in structured:
                result["structuredContent"] = structured["result"]
            return Reconciliation.done(evidence[:2000], result)

        return lookup

    # --- the server towards the agent, and the end ------------------------------------

    def mcp_server(self) -> Server[Any]:
        """The MCP server the agent talks to (stdio or streamable HTTP)."""

        async def list_tools(
            ctx: Any, params: types.PaginatedRequestParams | None
        ) -> types.ListToolsResult:
            return types.ListToolsResult(
                tools=[t.for_agent() for t in self.upstreams.tools.values()]
            )

        async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
            return await self.call_tool(params.name, params.arguments, params.meta)

        def input_schema(name: str) -> dict[str, Any] | None:
            tool = self.upstreams.tools.get(name)
            return tool.definition.input_schema if tool else None

        return Server(
            "startsafe-mcp",
            version=package_version(),
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            get_tool_input_schema=input_schema,
        )

    async def close(self) -> None:
        """Stop the calls still going, then finish each attempt ``failed``.

        A call stopped here while its effect was forwarded is not reported: the
        effect becomes ``unknown`` with the attempt, and the next proxy settles it.
        """
        for task in list(self._calls):
            task.cancel()
        if self._calls:
            await asyncio.wait(list(self._calls), timeout=10)
        for run_key, run in list(self.runs.items()):
            try:
                await run.finish("failed", SESSION_ENDED)
            except StartsafeError as error:
                logger.warning("run %s: the attempt could not be finished: %s", run_key, error)
        self.runs.clear()


@asynccontextmanager
async def open_proxy(
    config: Config,
    *,
    url: str | None,
    token: str | None,
    run_key: str | None,
    transport: Any = None,
) -> AsyncIterator[Proxy]:
    """Start the servers, check the rules against their tools, declare the tools.

    Raises:
        StartFailed: the address or the token is missing, or a server cannot start.
        ConfigError: a rule names a tool no server offers, or a reconcile tool that
            is not a read (with the file's line).
    """
    settings = config.startsafe
    if not url:
        raise StartFailed(f"no startsafe address: set url in [startsafe] of {config.path}")
    if not token or not token.strip():
        raise StartFailed(
            f"{settings.token_env} is empty: set it to the agent's token, which "
            "`python manage.py create_agent NAME` prints on the startsafe server"
        )
    async with connected(config) as upstreams:
        proxy = Proxy(config, upstreams, _client(config, url, token, transport), run_key)
        try:
            proxy.check_rules()
            proxy.classify()
            proxy.classify(await proxy.declare_tools())
            proxy.check_reconcile_tools()
            yield proxy
        finally:
            await proxy.close()
            await proxy.client.aclose()


def _client(config: Config, url: str, token: str, transport: Any) -> AsyncClient:
    settings = config.startsafe
    try:
        return AsyncClient(
            url,
            token,
            approval_timeout=settings.approval_timeout,
            poll_interval=settings.poll_interval,
            on_wait=_say_waiting,
            transport=transport,
        )
    except ValueError as wrong:  # the token has spaces or line breaks
        raise StartFailed(f"{settings.token_env}: {wrong}") from None


def _say_waiting(waiting: Waiting) -> None:
    logger.warning(
        "%s waits (%s, up to %g s) for a decision at %s",
        waiting.tool,
        waiting.status,
        waiting.timeout,
        waiting.url,
    )


def _error(text: str) -> types.CallToolResult:
    """An error result: what the agent (its model) reads instead of the tool's output."""
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def _recorded(result: types.CallToolResult) -> dict[str, Any]:
    """The effect's result as recorded: the ``CallToolResult``'s content and structured content.

    A result too large to record (api.md: 256 KiB) is recorded as the start of its
    text: the effect happened, and a replay must not make it look otherwise.
    """
    recorded = result.model_dump(
        mode="json", by_alias=True, exclude_none=True, include={"content", "structured_content"}
    )
    size = len(json.dumps(recorded))
    if size <= MAX_RECORDED:
        return recorded
    start = _text_of(result)[:2000]
    note = f"(done; its result of {size} characters was too large to record; it began:) {start}"
    return {"content": [{"type": "text", "text": note}]}


def _replayed(recorded: dict[str, Any]) -> types.CallToolResult:
    """The ``CallToolResult`` of a recorded result (executed now, or on a replay).

    A result an operator recorded (mark done) has no ``content``: the agent reads
    that it is already done, with the recorded object as structured content.
    """
    if isinstance(recorded.get("content"), list):
        return types.CallToolResult.model_validate(recorded)
    text = "already done" + (f": {json.dumps(recorded)}" if recorded else "")
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=recorded)


def _text_of(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent)).strip()
