"""The HTTP side: one :class:`Client` per agent token, with retries that are safe.

Every ``POST`` carries an ``Idempotency-Key`` (a uuid4) that stays the same across
the retries of one logical request, so a retry after a lost answer gets the first
answer again and never records a call or starts an attempt twice. Network errors
(``httpx.TransportError``) and 5xx answers are retried with exponential back-off
and jitter; ``409 request_in_progress`` is retried after a pause; every other 4xx
is raised at once as a typed exception (:mod:`startsafe_client.errors`).
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import httpx

from .errors import (
    RateLimited,
    RequestInProgress,
    ServiceUnavailable,
    StartsafeError,
    error_from_answer,
)
from .keys import Key

if TYPE_CHECKING:
    from .run import Run

API_PREFIX = "/api/v1"

Args = dict[str, Any]
Result = dict[str, Any]


@dataclass(frozen=True)
class Reconciliation:
    """What a reconcile lookup found at the provider.

    Build it with :meth:`done` or :meth:`not_done`; a lookup that cannot tell
    returns ``None`` instead.

    **Only a lookup that sees the provider's latest state may answer
    ``not_done``.** ``not_done`` releases the effect so it runs again; a search
    index that lags behind (a sent-items search that takes minutes to show a new
    message) would release an effect that happened, and it would happen twice.
    When in doubt, return ``None`` and let a person decide.
    """

    outcome: Literal["done", "not_done"]
    evidence: str
    result: Result | None = None

    @classmethod
    def done(cls, evidence: str, result: Result | None = None) -> Reconciliation:
        """It happened: ``evidence`` says what was looked up and found."""
        return cls("done", evidence, result)

    @classmethod
    def not_done(cls, evidence: str) -> Reconciliation:
        """It did not happen (authoritative, up-to-date lookup only: see the class doc)."""
        return cls("not_done", evidence)

    def __post_init__(self) -> None:
        if self.outcome not in ("done", "not_done"):
            raise ValueError("outcome must be 'done' or 'not_done'")
        if not self.evidence or not self.evidence.strip():
            raise ValueError("a reconciliation needs evidence: what was looked up and found")


ReconcileLookup = Callable[[Args, "str | None"], "Reconciliation | None"]


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
class Tool:
    """A tool declared once with :meth:`Client.tool`; call it with :meth:`Run.call`.

    Calling a ``Tool`` directly runs nothing: every call goes through a run, so it
    is recorded before it is made.

    Attributes:
        fn: the function doing the work; it receives the arguments as keyword
            arguments and returns a dict (the result; ``None`` means ``{}``).
        name: the tool's name in the journal (defaults to the function's name).
        kind: ``"read"`` (journaled, never gated) or ``"effect"``.
        key: ``args -> Key`` built from stable intent, or ``None`` for an unkeyed
            effect (allowed, but it blocks automatic restarts of the run).
        needs_approval, approvals_required, approval_ttl, timeout: declared with the
            effect's first call (api.md, ``POST /runs/{id}/calls``).
        preview: ``args -> str`` (or a fixed text) shown to the approving person.
        reconcile: ``(args, key) -> Reconciliation | None``, looking the effect up
            at the provider when its outcome is unknown.
    """

    fn: Callable[..., Any]
    name: str
    kind: Literal["read", "effect"]
    key: Callable[[Args], Key] | None = None
    needs_approval: bool = False
    approvals_required: int = 1
    approval_ttl: int | None = None
    timeout: int | None = None
    preview: Callable[[Args], str] | str | None = None
    reconcile: ReconcileLookup | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            f"tool {self.name!r} is called through a run, so it is journaled first: "
            f"run.call({self.fn.__name__}, **args)"
        )

    def key_for(self, args: Args) -> Key | None:
        """The key for these arguments (``None`` for reads and unkeyed effects)."""
        if self.key is None:
            return None
        key = self.key(args)
        if not isinstance(key, Key):
            raise TypeError(
                f"tool {self.name!r}: the key rule must return a Key (use provider_key, "
                f"content_key or intent_key), not {key!r}"
            )
        return key

    def preview_for(self, args: Args) -> str | None:
        """The preview text for these arguments, if the tool declares one."""
        if self.preview is None:
            return None
        text = self.preview if isinstance(self.preview, str) else self.preview(args)
        return str(text)[:4000]


class Client:
    """A startsafe client for one agent.

    Args:
        base_url: the server's address, e.g. ``"http://127.0.0.1:8000"`` (a trailing
            ``/api/v1`` is accepted too).
        token: the agent's bearer token (``python manage.py create_agent NAME``).
        timeout: seconds per HTTP request.
        max_retries: retries after the first try, for network errors, 5xx answers
            and ``request_in_progress``; then :class:`ServiceUnavailable` (or
            :class:`RequestInProgress`) is raised.
        backoff: the first retry's delay in seconds; it doubles per retry, with
            jitter, up to ``backoff_max``.
        poll_interval: seconds between two polls of an effect that waits; it grows
            by half per poll up to ``poll_max_interval``.
        approval_timeout: how long a tool call waits for a decision (approval, or
            another attempt's effect in flight) before :class:`ApprovalTimeout`.
        on_wait: called with a :class:`Waiting` once per tool call that begins to
            wait, e.g. to print the console address of the effect a person must
            decide (the client itself prints nothing).
        transport: an ``httpx`` transport (tests inject faults with it).
        sleep: the sleeping function (tests pass a fake one).
        clock: the monotonic clock that bounds waits (tests pass a fake one).

    The client is thread-safe: the run context's heartbeat thread shares it.
    """

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
        on_wait: Callable[[Waiting], None] | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
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
        token = token.strip()
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
        self.on_wait = on_wait
        self.sleep = sleep
        self.clock = clock
        self._http = httpx.Client(
            base_url=base + API_PREFIX,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            timeout=timeout,
            transport=transport,
        )

    # --- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def console_url(self, effect_id: str) -> str:
        """The effect's page in the console (the same server): where a person decides."""
        return f"{self.base_url}/effects/{effect_id}/"

    # --- HTTP with retries ---------------------------------------------------------

    def _delay(self, retry: int) -> float:
        """Exponential back-off with jitter: backoff·2^retry, halved at random, capped."""
        delay = min(self.backoff_max, self.backoff * (2**retry))
        return delay * (0.5 + random.random() / 2)

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> httpx.Response:
        """Send one logical request, retrying it safely; return the answer below 400.

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
        last_error: StartsafeError | None = None
        wait_at_least = 0.0  # the server's Retry-After, when it gave one
        for retry in range(self.max_retries + 1):
            if retry:
                self.sleep(max(self._delay(retry - 1), wait_at_least))
                wait_at_least = 0.0
            try:
                response = self._http.request(
                    method, path, json=json, params=params, headers=all_headers
                )
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

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        """``GET`` a path under ``/api/v1`` and return its JSON body."""
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, params=clean).json()

    def post(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST`` a JSON body to a path under ``/api/v1`` and return its JSON answer."""
        return self.request("POST", path, json=body).json()

    # --- the contract's endpoints, thinly -----------------------------------------

    def get_run(self, run_id: str) -> dict[str, Any]:
        """``GET /runs/{id}``: the run, its attempts, verdict, journal and effects."""
        return self.get(f"/runs/{run_id}")

    def list_runs(self, **filters: Any) -> dict[str, Any]:
        """``GET /runs`` with filters (``status``, ``run_key``, ``restart_ready``, ``limit``…)."""
        return self.get("/runs", **filters)

    def get_effect(self, effect_id: str) -> dict[str, Any]:
        """``GET /effects/{id}``: ``{"effect", "action"}``."""
        return self.get(f"/effects/{effect_id}")

    def list_effects(self, **filters: Any) -> dict[str, Any]:
        """``GET /effects`` with filters (``run_id``, ``status``, ``key``, ``tool``…)."""
        return self.get("/effects", **filters)

    def poll_effect(self, effect_id: str, etag: str | None) -> tuple[dict[str, Any] | None, str]:
        """One approval poll with ``If-None-Match``.

        Returns ``(None, etag)`` when nothing changed (``304``), else the answer
        ``{"effect", "action"}`` and its new ``ETag``.
        """
        headers = {"If-None-Match": etag} if etag else None
        response = self.request("GET", f"/effects/{effect_id}", headers=headers)
        if response.status_code == 304:
            return None, etag or ""
        return response.json(), response.headers.get("ETag", "")

    # --- declaring tools and running ------------------------------------------------

    def tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        kind: Literal["read", "effect"] = "effect",
        key: Callable[[Args], Key] | None = None,
        name: str | None = None,
        needs_approval: bool = False,
        approvals_required: int = 1,
        approval_ttl: int | None = None,
        timeout: int | None = None,
        preview: Callable[[Args], str] | str | None = None,
        reconcile: ReconcileLookup | None = None,
    ) -> Any:
        """Declare a tool once; returns a :class:`Tool` to call with :meth:`Run.call`.

        ::

            @client.tool(kind="read")
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

        The key rule receives the arguments the model generated and must build the
        key from stable intent only (:mod:`startsafe_client.keys`), never from
        generated content. A reconcile lookup receives the effect's recorded
        arguments and key; **only a lookup that sees the provider's latest state may
        answer** :meth:`Reconciliation.not_done`.
        """
        if kind not in ("read", "effect"):
            raise ValueError("kind must be 'read' or 'effect'")
        if kind == "read" and (key or needs_approval or reconcile or preview):
            raise ValueError("a read takes no key, approval, preview or reconcile lookup")
        if not 1 <= approvals_required <= 3:
            raise ValueError("approvals_required must be 1, 2 or 3")
        if approvals_required > 1 and not needs_approval:
            raise ValueError("approvals_required needs needs_approval=True")

        def declare(func: Callable[..., Any]) -> Tool:
            return Tool(
                fn=func,
                name=name or func.__name__,
                kind=kind,
                key=key,
                needs_approval=needs_approval,
                approvals_required=approvals_required,
                approval_ttl=approval_ttl,
                timeout=timeout,
                preview=preview,
                reconcile=reconcile,
            )

        return declare(fn) if fn is not None else declare

    def run(
        self,
        run_key: str,
        *,
        title: str | None = None,
        input: dict[str, Any] | None = None,
        restart_policy: Literal["keyed", "blunt", "manual"] | None = None,
        heartbeat_timeout: int = 60,
        restart_url: str | None = None,
        agent_version: str | None = None,
        supersede: bool | Literal["stale"] = False,
    ) -> Run:
        """A run context: ``with client.run("ticket-4812", ...) as run:``.

        Entering starts the run (or starts it again); see :class:`Run` for what
        happens on a live attempt (``supersede``), while the block runs (heartbeats)
        and on exit (finish completed, or failed and re-raise).
        """
        from .run import Run

        return Run(
            self,
            run_key,
            title=title,
            input=input,
            restart_policy=restart_policy,
            heartbeat_timeout=heartbeat_timeout,
            restart_url=restart_url,
            agent_version=agent_version,
            supersede=supersede,
        )


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
