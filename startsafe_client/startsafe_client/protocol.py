"""The protocol core that :class:`Client` and :class:`AsyncClient` share, written once.

Everything that gives the API's answers their meaning is written here (and in
:mod:`startsafe_client.attempt` for a run's attempt) as *steps*: generators that
never do I/O themselves. A step yields an operation and is sent its outcome:

- :class:`Send` — one HTTP request; the outcome is the ``httpx.Response``, or the
  ``httpx.TransportError`` thrown into the step;
- :class:`Sleep` — a pause (back-off, polling);
- :class:`Invoke` — the agent's own code: a tool, a reconcile lookup, ``on_wait``.

Each client is a thin transport that performs the operations: :class:`Client` with
``httpx.Client`` and plain calls, :class:`AsyncClient` with ``httpx.AsyncClient``,
``await`` and worker threads. So retries, back-off, ``Retry-After``, the
``Idempotency-Key`` of each logical ``POST``, polling with ``ETag`` and the typed
exceptions behave the same in both, by construction.

Every ``POST`` carries an ``Idempotency-Key`` (a uuid4) that stays the same across
the retries of one logical request, so a retry after a lost answer gets the first
answer again and never records a call or starts an attempt twice. Network errors
(``httpx.TransportError``) and 5xx answers are retried with exponential back-off
and jitter; ``409 request_in_progress`` is retried after a pause; ``429`` after the
server's ``Retry-After``; every other 4xx is raised at once as a typed exception
(:mod:`startsafe_client.errors`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import httpx

from .errors import (
    RateLimited,
    RequestInProgress,
    ServiceUnavailable,
    StartsafeError,
    ToolNotRegistered,
    error_from_answer,
)
from .specs import Tool, ToolSpec

if TYPE_CHECKING:
    from .attempt import RunCore

API_PREFIX = "/api/v1"
DECLARE_BATCH = 500  # api.md, POST /tools: 1–500 tools

logger = logging.getLogger("startsafe_client")
NO_REGISTRY = (
    "POST /api/v1/tools answered 404: this startsafe server has no tool registry yet, "
    "so the tools are not declared"
)

T = TypeVar("T")

# The declarations this process sent, by (server, token digest, tool name, declaration
# digest): every client of the process reads it, so each declaration is sent once per
# process (api.md: "once per process, before the first call"), whatever the number of
# clients and runs. ``_DECLARING`` makes the sync clients' check-then-send one step;
# AsyncClient holds an asyncio lock of its loop instead (aio.py).
_DECLARED: set[tuple[str, str, str, str]] = set()
_DECLARING = threading.Lock()


# --- The operations a step asks its transport for ---------------------------------


@dataclass(frozen=True)
class Send:
    """Send one HTTP request (a path under ``/api/v1``)."""

    method: str
    path: str
    json: Mapping[str, Any] | None = None
    params: Mapping[str, Any] | None = None
    headers: Mapping[str, str] | None = None

    def request_args(self) -> dict[str, Any]:
        """The arguments of ``httpx.Client.request`` / ``httpx.AsyncClient.request``."""
        return {
            "method": self.method,
            "url": self.path,
            "json": self.json,
            "params": self.params,
            "headers": self.headers,
        }


@dataclass(frozen=True)
class Sleep:
    """Pause for ``seconds`` (the client's ``sleep``)."""

    seconds: float


@dataclass(frozen=True)
class Invoke:
    """Call the agent's code with these arguments.

    ``blocking`` marks code that may take long or block (a tool, a reconcile
    lookup): :class:`AsyncClient` runs a plain function of that kind in a worker
    thread, and awaits an ``async def`` one. A callback (``on_wait``) is called
    directly.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    blocking: bool = True


Op = Send | Sleep | Invoke
Steps = Generator[Op, Any, T]


class Driven(Generic[T]):
    """Steps being driven by a transport: iterate for the operations, answer each one.

    ``for op in driven:`` yields the next operation; inside ``with
    driven.answering() as answer:`` the transport performs it and calls
    ``answer(outcome)``. An exception raised there is thrown into the steps
    instead (a network error the retries handle, or a tool's own exception).
    ``result`` holds what the steps returned.
    """

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self._outcome: Any = None
        self._error: BaseException | None = None
        self.result: T

    def __iter__(self) -> Iterator[Op]:
        return self

    def __next__(self) -> Op:
        error, self._error = self._error, None
        outcome, self._outcome = self._outcome, None
        try:
            return self._steps.throw(error) if error is not None else self._steps.send(outcome)
        except StopIteration as done:
            self.result = done.value
            raise StopIteration from None

    @contextlib.contextmanager
    def answering(self) -> Iterator[Callable[[Any], None]]:
        """Record the outcome the block passes, or the exception it raises."""
        try:
            yield self._answer
        except BaseException as error:  # noqa: BLE001 (thrown into the steps, which decide)
            self._error = error

    def _answer(self, outcome: Any) -> None:
        self._outcome = outcome


# --- What a client shares with the other ---------------------------------------


@dataclass(frozen=True)
class Waiting:
    """What a tool call waits for: passed to the client's ``on_wait`` callback.

    A call waits when its effect needs a decision (approval, or a person settling
    it) or is in flight in another attempt. The callback is called once per tool
    call, when the wait begins, before the first poll: tell the person who decides
    where to go (``url``).

    Attributes:
        tool: the tool's name.
        effect: the effect as the answer showed it (a dict shaped like the API's Effect).
        url: the effect's page in the console, where a person decides.
        timeout: how long the call waits at most (the client's ``approval_timeout``).
    """

    tool: str
    effect: dict[str, Any]
    url: str
    timeout: float

    @property
    def effect_id(self) -> str:
        return str(self.effect.get("id"))

    @property
    def status(self) -> str | None:
        """The effect's status, e.g. ``awaiting_approval``."""
        return self.effect.get("status")


@dataclass(frozen=True)
class Declared:
    """What a declaration of tools (``POST /api/v1/tools``) came to.

    Attributes:
        tools: the Tool objects the server answered (api.md), with their effective rules.
        refused: the tools the agent's ``closed`` mode refused (their calls are
            refused too, ``409 tool_not_registered``); only a lenient declaration
            goes on without them.
        registry: whether the server has a tool registry (an older one answers 404).
    """

    tools: list[dict[str, Any]]
    refused: tuple[str, ...] = ()
    registry: bool = True


class ClientCore:
    """The options, requests and declarations of :class:`Client` and :class:`AsyncClient`.

    Args:
        base_url: the server's address, e.g. ``"http://127.0.0.1:8000"`` (a trailing
            ``/api/v1`` is accepted too).
        token: the agent's bearer token (``python manage.py create_agent NAME``).
        timeout: seconds per HTTP request.
        max_retries: retries after the first try, for network errors, 5xx answers,
            ``request_in_progress`` and ``429``; then :class:`ServiceUnavailable` (or
            :class:`RequestInProgress`, :class:`RateLimited`) is raised.
        backoff: the first retry's delay in seconds; it doubles per retry, with
            jitter, up to ``backoff_max``.
        poll_interval: seconds between two polls of an effect that waits; it grows
            by half per poll up to ``poll_max_interval``.
        approval_timeout: how long a tool call waits for a decision (approval, or
            another attempt's effect in flight) before :class:`ApprovalTimeout`.
        max_connections: how many requests are sent at once; more wait their turn
            in the client (on a semaphore), so httpcore's connection pool never holds
            a queue: it rescans every connection for every queued request on each
            change (encode/httpcore#1035), which under :class:`AsyncClient` would run
            on the event loop. Idle connections are all kept alive for reuse.
        on_wait: called with a :class:`Waiting` once per tool call that begins to
            wait, e.g. to print the console address of the effect a person must
            decide (the client itself prints nothing).
        transport: an ``httpx`` transport (tests inject faults with it): a
            ``BaseTransport`` for :class:`Client`, an ``AsyncBaseTransport`` for
            :class:`AsyncClient` (``httpx.MockTransport`` serves both).
        sleep: the sleeping function (tests pass a fake one); under
            :class:`AsyncClient` its result is awaited when it is awaitable.
        clock: the monotonic clock that bounds waits (tests pass a fake one).

    Every method that talks to the server is written once here and returns what
    the client's ``_drive`` returns: the answer under :class:`Client`, an awaitable
    of it under :class:`AsyncClient`.
    """

    _default_sleep: Callable[[float], Any]
    _http_class: type[httpx.Client] | type[httpx.AsyncClient]
    _gate_class: Callable[[int], Any]  # a semaphore of the transport's kind
    _run_class: type[RunCore]
    awaits_tools: bool = False  # whether an ``async def`` tool can be called

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        max_retries: int = 5,
        backoff: float = 0.5,
        backoff_max: float = 10.0,
        poll_interval: float = 2.0,
        poll_max_interval: float = 15.0,
        approval_timeout: float = 300.0,
        max_connections: int = 20,
        on_wait: Callable[[Waiting], Any] | None = None,
        transport: Any = None,
        sleep: Callable[[float], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        token = _checked_token(token)
        base = base_url.rstrip("/")
        if base.endswith(API_PREFIX):
            base = base[: -len(API_PREFIX)]
        self.base_url = base
        self.max_retries = max_retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.poll_interval = poll_interval
        self.poll_max_interval = poll_max_interval
        self.approval_timeout = approval_timeout
        self.max_connections = max_connections
        self.on_wait = on_wait
        self.sleep = sleep or type(self)._default_sleep
        self.clock = clock
        self._sending = type(self)._gate_class(max_connections)
        # This client's tools: name -> (declaration, its digest), sent before the first
        # call (``_undeclared``); ``_settled`` is the ``_version`` last found all sent.
        self._token_digest = hashlib.sha256(token.encode()).hexdigest()
        self._declarations: dict[str, tuple[dict[str, Any], str]] = {}
        self._version = 0
        self._settled = 0
        self._http = self._http_class(
            base_url=base + API_PREFIX,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            transport=transport,
        )

    def _drive(self, steps: Steps[T]) -> Any:
        """Perform the steps' operations: the transport of each client."""
        raise NotImplementedError

    def console_url(self, effect_id: str) -> str:
        """The effect's page in the console (the same server): where a person decides."""
        return f"{self.base_url}/effects/{effect_id}/"

    # --- HTTP with retries, as steps ---------------------------------------------------

    def _delay(self, retry: int) -> float:
        """Exponential back-off with jitter: backoff·2^retry, halved at random, capped."""
        delay = min(self.backoff_max, self.backoff * (2**retry))
        return delay * (0.5 + random.random() / 2)

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> Steps[httpx.Response]:
        """One logical request, retried safely; returns the answer below 400.

        1. A ``POST`` gets an ``Idempotency-Key`` (``idempotency_key`` or a new
           uuid4) that every retry repeats.
        2. A network error or a 5xx is retried after an exponential back-off, as is a
           ``409 request_in_progress`` (the first try is still being processed).
        3. A ``429 rate_limited`` is retried after the server's ``Retry-After``
           (capped at ``backoff_max``, never shorter than the back-off).
        4. Any other 4xx raises its typed exception at once; retries running out
           raise :class:`ServiceUnavailable` (or :class:`RequestInProgress`,
           :class:`RateLimited`).
        """
        all_headers = dict(headers or {})
        if method.upper() == "POST":
            all_headers["Idempotency-Key"] = idempotency_key or str(uuid.uuid4())
        send = Send(method, path, json=json, params=params, headers=all_headers)
        last_error: StartsafeError | None = None
        wait_at_least = 0.0  # the server's Retry-After, when it gave one
        for retry in range(self.max_retries + 1):
            if retry:
                yield Sleep(max(self._delay(retry - 1), wait_at_least))
                wait_at_least = 0.0
            try:
                response: httpx.Response = yield send
            except httpx.TransportError as exc:
                last_error = ServiceUnavailable(
                    f"{method} {path}: {type(exc).__name__}: {exc}",
                    details={"exception": type(exc).__name__},
                )
                continue
            if response.status_code >= 500:
                last_error = ServiceUnavailable(
                    f"{method} {path}: the server answered {response.status_code}",
                    status=response.status_code,
                )
                continue
            if response.status_code >= 400:
                error = error_from_answer(response.status_code, _json_or_text(response))
                if isinstance(error, RequestInProgress):
                    last_error = error
                    continue
                if isinstance(error, RateLimited):
                    wait_at_least = min(self.backoff_max, _retry_after(response))
                    last_error = error
                    continue
                raise error
            return response
        assert last_error is not None
        raise last_error

    def _get(self, path: str, params: Mapping[str, Any]) -> Steps[dict[str, Any]]:
        clean = {k: v for k, v in params.items() if v is not None}
        response = yield from self._request("GET", path, params=clean)
        return response.json()

    def _post(self, path: str, body: Mapping[str, Any]) -> Steps[dict[str, Any]]:
        response = yield from self._request("POST", path, json=body)
        return response.json()

    def _poll_effect(
        self, effect_id: str, etag: str | None
    ) -> Steps[tuple[dict[str, Any] | None, str]]:
        headers = {"If-None-Match": etag} if etag else None
        response = yield from self._request("GET", f"/effects/{effect_id}", headers=headers)
        if response.status_code == 304:
            return None, etag or ""
        return response.json(), response.headers.get("ETag", "")

    # --- The contract's endpoints, thinly (answers under Client, awaitables under
    # --- AsyncClient) ---------------------------------------------------------------

    def request(self, method: str, path: str, **options: Any) -> httpx.Response:
        """Send one logical request, retrying it safely; return the answer below 400.

        ``options`` are ``json``, ``params``, ``headers`` and ``idempotency_key``
        (a ``POST`` gets a new uuid4 without one); the retry rules are the protocol
        core's (this module's doc).
        """
        return self._drive(self._request(method, path, **options))

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """``GET`` a path under ``/api/v1`` and return its JSON body."""
        return self._drive(self._get(path, params))

    def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST`` a JSON body to a path under ``/api/v1`` and return its JSON answer."""
        return self._drive(self._post(path, body))

    def get_run(self, run_id: str) -> dict[str, Any]:
        """``GET /runs/{id}``: the run, its attempts, verdict, journal and effects."""
        return self._drive(self._get(f"/runs/{run_id}", {}))

    def list_runs(self, **filters: Any) -> dict[str, Any]:
        """``GET /runs`` with filters (``status``, ``run_key``, ``restart_ready``, ``limit``…)."""
        return self._drive(self._get("/runs", filters))

    def get_effect(self, effect_id: str) -> dict[str, Any]:
        """``GET /effects/{id}``: ``{"effect", "action"}``."""
        return self._drive(self._get(f"/effects/{effect_id}", {}))

    def list_effects(self, **filters: Any) -> dict[str, Any]:
        """``GET /effects`` with filters (``run_id``, ``status``, ``key``, ``tool``…)."""
        return self._drive(self._get("/effects", filters))

    def poll_effect(self, effect_id: str, etag: str | None) -> tuple[dict[str, Any] | None, str]:
        """One approval poll with ``If-None-Match``.

        Returns ``(None, etag)`` when nothing changed (``304``), else the answer
        ``{"effect", "action"}`` and its new ``ETag``.
        """
        return self._drive(self._poll_effect(effect_id, etag))

    # --- Declaring tools to the registry (api.md, POST /tools) ----------------------

    def declare_tools(
        self,
        tools: Mapping[str, ToolSpec] | Iterable[Tool],
        *,
        schemas: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """Declare tools now (``POST /api/v1/tools``); returns the server's Tool objects.

        ``tools``: the specs by name (the ``specs`` an adapter takes) or the tools
        ``@client.tool`` made; ``schemas``: each tool's argument JSON Schema by name,
        where known. They join this client's tools, and count as declared for the
        process: the first call of a run sends nothing more for them.

        A run declares this client's tools by itself before its first call, once per
        process, so this is needed only to declare early, or tools no call names.
        Raises what ``POST`` raises, :class:`ToolNotRegistered` under the agent's
        ``closed`` mode for a tool only an admin may add.
        """
        declarations = self._adopt(_declarations_of(tools, schemas or {}))
        return self._drive(self._declared_tools(self._declare(declarations, lenient=False)))

    def _declared_tools(self, steps: Steps[Declared]) -> Steps[list[dict[str, Any]]]:
        return (yield from steps).tools

    def _adopt(
        self, declarations: Iterable[Mapping[str, Any]], *, replace: bool = True
    ) -> list[dict[str, Any]]:
        """Make these declarations this client's (to be sent before its next call);
        ``replace=False`` keeps a tool's declaration already known (a call's spec does
        not undo an adapter's, which has the schema)."""
        adopted = []
        for given in declarations:
            declared = dict(given)
            if not replace and declared["name"] in self._declarations:
                continue
            digest = _digest(declared)
            if self._declarations.get(declared["name"], (None, ""))[1] != digest:
                self._declarations[declared["name"]] = (declared, digest)
                self._version += 1
            adopted.append(declared)
        return adopted

    def _undeclared(self) -> list[dict[str, Any]]:
        """This client's declarations the process has not sent yet (none, quickly, when
        nothing changed since they were all found sent)."""
        if self._settled == self._version:
            return []
        version = self._version
        waiting = [
            declared
            # a copy: an adapter may add tools from another thread (a Run in a worker)
            for declared, digest in list(self._declarations.values())
            if self._sent_key(declared["name"], digest) not in _DECLARED
        ]
        if not waiting:
            self._settled = version
        return waiting

    def _sent_key(self, name: str, digest: str) -> tuple[str, str, str, str]:
        return (self.base_url, self._token_digest, name, digest)

    def _declare(self, declarations: list[dict[str, Any]], *, lenient: bool) -> Steps[Declared]:
        """``POST /tools`` in batches of 500, with the client's retries; then the process
        counts them as sent.

        Errors are raised as every answer's are, except, when ``lenient`` (a run's own
        declaration before its first call): a tool the ``closed`` mode refuses is left
        out (and the rest declared again), so the tools an admin registered still run
        and the refused one's own call is refused with ``409 tool_not_registered``; and
        a server without a registry (404, older than the registry) is declared nothing.
        """
        answered: list[dict[str, Any]] = []
        refused: list[str] = []
        registry = True
        for start in range(0, len(declarations), DECLARE_BATCH):
            batch = declarations[start : start + DECLARE_BATCH]
            while batch and registry:
                try:
                    answer = yield from self._post("/tools", {"tools": batch})
                except ToolNotRegistered as refusal:
                    if not lenient or refusal.tool not in {d["name"] for d in batch}:
                        raise
                    # The server names one refused tool per answer: keep those the
                    # agent has registered (one listing, not a try per tool), and never
                    # the one it named, so that each round declares fewer.
                    registered = (yield from self._registered()) - {refusal.tool}
                    refused += [d["name"] for d in batch if d["name"] not in registered]
                    batch = [d for d in batch if d["name"] in registered]
                    continue
                except StartsafeError as error:
                    if not (lenient and error.status == 404):
                        raise
                    registry = False
                    break
                answered.extend(answer.get("tools") or [])
                batch = []
        for declared in declarations:
            _DECLARED.add(self._sent_key(declared["name"], _digest(declared)))
        return Declared(answered, tuple(refused), registry)

    def _registered(self) -> Steps[set[str]]:
        """The names of the agent's registered tools (``GET /tools``, every page)."""
        names: set[str] = set()
        cursor = None
        while True:
            page = yield from self._get("/tools", {"limit": 200, "cursor": cursor})
            names.update(tool["name"] for tool in page.get("items") or [])
            cursor = page.get("next_cursor")
            if not cursor:
                return names

    def _say(
        self, declared: Declared, log: logging.Logger = logger, level: int = logging.WARNING
    ) -> None:
        """Log what a lenient declaration left undone: nothing is dropped silently (a
        server without a registry at ``level``)."""
        if declared.refused:
            log.warning(
                "the agent's closed mode refused to register %s: an admin registers them "
                "on the tools page (%s/tools/); until then their calls are refused",
                ", ".join(declared.refused),
                self.base_url,
            )
        if not declared.registry:
            log.log(level, NO_REGISTRY)

    def _needs_declaring(self, tool: Tool) -> bool:
        """Whether a call of ``tool`` must first declare (quick, without a lock: the
        tool is known and every declaration of this client was found sent)."""
        return tool.name not in self._declarations or self._settled != self._version

    def _declaring(self, tool: Tool) -> list[dict[str, Any]]:
        """Under the transport's lock: the tool joins this client's tools (unless one of
        that name is known), and what the process has not sent yet is returned."""
        self._adopt([tool.spec.declaration(tool.name)], replace=False)
        return self._undeclared()

    def _call_declared(self, tool: Tool, steps: Steps[T]) -> Any:
        """A call's steps, after this client's tools are declared (the transport's)."""
        raise NotImplementedError

    # --- Declaring tools and running ------------------------------------------------

    def tool(
        self,
        fn_or_spec: Callable[..., Any] | ToolSpec | None = None,
        *,
        name: str | None = None,
        kind: Literal["read", "effect"] = "effect",
        **declaration: Any,
    ) -> Any:
        """Declare a tool once; returns a :class:`Tool` to call with ``run.call``.

        The declaration is a spec (:func:`read`, :func:`effect`), given as the first
        argument or spelled out as ``kind=`` and the keywords of :func:`effect`
        (``key``, ``needs_approval``, ``approvals_required``, ``approval_ttl``,
        ``timeout``, ``preview``, ``reconcile``, ``not_performed``)::

            @client.tool(read())
            def lookup_customer(email: str) -> dict: ...

            @client.tool(
                kind="effect",
                key=lambda args: intent_key("campaign", campaign_id=args["campaign_id"]),
                needs_approval=True,
                approvals_required=2,
                preview=lambda args: f"Send {args['subject']!r} to segment {args['segment']}",
                reconcile=None,  # a person decides when its outcome is unknown
            )
            def send_campaign(campaign_id: str, subject: str, segment: str) -> dict: ...

        ``name`` is the tool's name in the journal (the function's name by default).
        See :func:`effect` for the key rule, the reconcile lookup and
        ``not_performed``.
        """
        if isinstance(fn_or_spec, ToolSpec):
            if declaration or kind != "effect":
                raise ValueError("give the declaration once: a spec, or keywords")
            spec = fn_or_spec
        else:
            spec = ToolSpec(kind=kind, **declaration)

        def declare(func: Callable[..., Any]) -> Tool:
            tool = Tool(fn=func, name=name or func.__name__, spec=spec)
            self._adopt([spec.declaration(tool.name)])  # declared before the first call
            return tool

        return declare(fn_or_spec) if callable(fn_or_spec) else declare

    def run(self, run_key: str, **options: Any) -> Any:
        """A run context: ``with client.run(...) as run:`` (``async with`` under AsyncClient).

        ``options``: ``title``, ``input``, ``restart_policy`` (``"keyed"``,
        ``"blunt"``, ``"manual"``), ``heartbeat_timeout`` (60 s by default),
        ``restart_url``, ``agent_version`` and ``supersede`` (``False``, ``True`` or
        ``"stale"``). Entering starts the run (or starts it again); see :class:`Run`
        for what happens on a live attempt (``supersede``), while the block runs
        (heartbeats) and on exit (finish completed, or failed and re-raise).
        """
        return self._run_class(self, run_key, **options)


def _declarations_of(
    tools: Mapping[str, ToolSpec] | Iterable[Tool], schemas: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Declarations of specs by name, or of :class:`Tool` objects, with their schemas."""
    named = tools.items() if isinstance(tools, Mapping) else ((t.name, t.spec) for t in tools)
    declarations = []
    for name, spec in named:
        if not isinstance(spec, ToolSpec):
            raise TypeError(f"tool {name!r}: declare it with read() or effect(), not {spec!r}")
        schema = schemas.get(name)
        declarations.append(spec.declaration(name, schema=dict(schema) if schema else None))
    return declarations


def _digest(declared: Mapping[str, Any]) -> str:
    """A declaration's identity in this process (its canonical JSON's SHA-256)."""
    text = json.dumps(declared, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _checked_token(token: str | None) -> str:
    """The token, stripped; refused with what to do when it is empty or not one word."""
    if not token or not token.strip():
        # What `STARTSAFE_TOKEN=$(manage.py create_agent NAME)` leaves when that failed.
        raise ValueError(
            "the token is empty: pass the agent's token, which `python manage.py "
            "create_agent NAME` prints on the server (an empty STARTSAFE_TOKEN usually "
            "means that command failed: see its error)"
        )
    if len(token.split()) != 1:
        raise ValueError(
            "the token has spaces or line breaks: pass only the token, which "
            "`python manage.py create_agent NAME` prints alone on standard output"
        )
    return token.strip()


def _retry_after(response: httpx.Response) -> float:
    """The ``Retry-After`` seconds of an answer (0 when absent or an HTTP date)."""
    try:
        return max(0.0, float(response.headers.get("Retry-After", "0")))
    except ValueError:
        return 0.0


def _json_or_text(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text
