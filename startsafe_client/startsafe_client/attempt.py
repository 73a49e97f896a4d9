"""One attempt of a run, as steps: start, heartbeat, each tool call and what its answer
means, finish. :class:`Run` and :class:`AsyncRun` drive these steps (see
:mod:`startsafe_client.protocol` for what a step is); they add only the context
manager and the heartbeat's thread or task.

A tool call is recorded in the journal *before* it is made, and the answer decides
what happens (api.md, "Action"):

- ``execute`` — the tool runs with ``effect.args`` from the answer (the version to
  execute, possibly edited by an operator), not with what the model generated this
  time; its result is reported ``done``;
- ``skip`` — already done: the recorded result is returned, nothing runs;
- ``wait`` — bounded polling of the effect (with ``ETag``/``If-None-Match``) until
  it can be claimed (then it executes), is done (skip), blocked or in review;
- ``review`` — its outcome is unknown: the spec's reconcile lookup settles it, or
  :class:`OutcomeUnknown` is raised for a person to decide;
- ``blocked`` — :class:`EffectBlocked`, with the decision's note for the model.

**An exception is not proof that nothing happened.** When an effect's tool raises,
the effect is *not* reported: a tool that sent the e-mail and then timed out
reading the answer did the effect. The exception propagates; the attempt ends
(the run context finishes it ``failed``) and the server makes the effect
``unknown``, so the next attempt reconciles it or a person decides. Only a tool
that raises :class:`NotPerformed` (or a type its spec lists in ``not_performed``)
has the effect reported ``failed``, and the next call of that key runs it again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from .errors import (
    AlreadyRunning,
    ApprovalTimeout,
    AttemptStopped,
    ClaimConflict,
    EffectBlocked,
    EffectError,
    OutcomeUnknown,
    StartsafeError,
)
from .protocol import Invoke, Sleep, Steps, Waiting
from .specs import Reconciliation, Tool, ToolSpec, as_result

if TYPE_CHECKING:
    from .protocol import ClientCore

MAX_ERROR_TEXT = 4000
MAX_EVIDENCE_TEXT = 2000


class RunCore:
    """What :class:`Run` and :class:`AsyncRun` share: the attempt's state and its steps.

    Attributes (after entering): ``id``, ``attempt`` (the attempt number),
    ``run`` (the Run object), ``verdict``, ``journal`` (the calls recorded so far,
    by every attempt), ``effects`` (the effects they point to), ``attempt_info``.
    """

    def __init__(
        self,
        client: ClientCore,
        run_key: str,
        *,
        title: str | None = None,
        input: dict[str, Any] | None = None,
        restart_policy: str | None = None,
        heartbeat_timeout: int = 60,
        restart_url: str | None = None,
        agent_version: str | None = None,
        supersede: bool | Literal["stale"] = False,
    ) -> None:
        if supersede not in (True, False, "stale"):
            raise ValueError("supersede must be True, False or 'stale'")
        self.client = client
        self.run_key = run_key
        self._start_body: dict[str, Any] = {"run_key": run_key}
        for name, value in (
            ("title", title),
            ("input", input),
            ("restart_policy", restart_policy),
            ("heartbeat_timeout", heartbeat_timeout),
            ("restart_url", restart_url),
            ("agent_version", agent_version),
        ):
            if value is not None:
                self._start_body[name] = value
        self.supersede = supersede
        self.id: str = ""
        self.attempt: int = 0
        self.run: dict[str, Any] = {}
        self.attempt_info: dict[str, Any] = {}
        self.verdict: dict[str, Any] = {}
        self.journal: list[dict[str, Any]] = []
        self.effects: list[dict[str, Any]] = []
        self._stopped: AttemptStopped | None = None
        self._finished = False

    # --- calls (answers under Run, awaitables under AsyncRun) ------------------------

    def call(self, tool: Tool, /, **args: Any) -> Any:
        """Call a declared tool: record the call, then act on the answer.

        Returns the tool's result: for a read, whatever the function returns; for
        an effect, the result dict (executed now, or the recorded one on skip; a
        value that is not a dict is recorded as ``{"value": ...}``).

        Before the first call, the client's tools (``@client.tool``, an adapter's
        specs, and this one) are declared to the registry (``POST /tools``), once per
        process for each declaration: later runs and clients of the process send
        nothing more until a tool or its declaration is new.

        Raises:
            KeyRefused: the key rule found no key in these arguments; nothing was
                recorded.
            ToolNotRegistered: the agent's ``closed`` mode refuses this tool (``tool``
                names it) until an admin registers it; nothing was recorded.
            EffectBlocked: rejected or expired; ``for_model`` is meant for the model.
            ApprovalTimeout: the bounded wait for a decision ran out.
            OutcomeUnknown: in review and the tool has no lookup (or it could not tell).
            AttemptSuperseded, RunFinished: this attempt must stop.
            NotPerformed (or a type of the spec's ``not_performed``): the tool sent
                nothing; the effect was reported ``failed`` and may run again.
            Any other exception of the tool, unreported: the effect's outcome is
                unknown until the next attempt reconciles it or a person decides.
        """
        if not isinstance(tool, Tool):
            raise TypeError("run.call takes a tool declared with @client.tool")
        return self.client._call_declared(tool, self._call(tool, args))

    def call_spec(
        self,
        name: str,
        spec: ToolSpec,
        args: Mapping[str, Any],
        perform: Callable[[dict[str, Any]], Any],
    ) -> Any:
        """Journal one call of a tool known by its name and spec: the adapters' entry.

        Exactly what :meth:`call` does, for a tool that is not a :class:`Tool`: a
        framework's tool, declared beside it with :func:`read` or :func:`effect`.
        ``perform`` receives the arguments to run with, as one dict: the arguments
        given for a read, ``effect.args`` from the ``execute`` answer for an effect
        (an operator may have edited them). It may be ``async def`` under
        :class:`AsyncRun` (a plain one runs in a worker thread there).

        Returns what :meth:`call` returns (turn an effect's result dict back into
        the tool's value with :func:`from_result`) and raises what it raises:
        :class:`EffectBlocked`, :class:`ApprovalTimeout`, :class:`OutcomeUnknown`
        and :class:`KeyRefused` carry ``for_model``, the text to hand the model.
        """
        tool = Tool(fn=perform, name=name, spec=spec, args_as_dict=True)
        return self.client._call_declared(tool, self._call(tool, args))

    # --- state that needs no I/O ------------------------------------------------------

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between two heartbeats: a third of the run's ``heartbeat_timeout``."""
        return max(0.5, float(self.run.get("heartbeat_timeout") or 60) / 3)

    @property
    def stopped(self) -> AttemptStopped | None:
        """The reason this attempt must stop, once a heartbeat learned it; else ``None``."""
        return self._stopped

    def check(self) -> None:
        """Raise :class:`AttemptSuperseded` / :class:`RunFinished` if the attempt was stopped.

        ``run.call`` checks before every call; call this in long loops that call no
        tool so a superseded attempt stops promptly.
        """
        if self._stopped is not None:
            raise self._stopped

    # --- start, beat, finish ------------------------------------------------------------

    def _start(self) -> Steps[None]:
        """Start (or restart) the run; supersede a live attempt when told to.

        1. ``POST /runs`` starts the run (attempt 1) or starts it again.
        2. On ``409 already_running`` it supersedes the live attempt only when told
           to: ``supersede=True`` always; ``supersede="stale"`` when that attempt's
           last heartbeat is older than the run's ``heartbeat_timeout`` (it is
           presumed dead); ``False`` raises :class:`AlreadyRunning`. A refused
           restart raises :class:`RestartBlocked` with the verdict.
        """
        try:
            answer = yield from self.client._post("/runs", self._start_body)
        except AlreadyRunning as running:
            answer = yield from self._supersede_or_raise(running)
        self.run = answer["run"]
        self.attempt_info = answer["attempt"]
        self.id = self.run["id"]
        self.attempt = int(self.attempt_info["number"])
        self.verdict = answer.get("verdict") or {}
        self.journal = answer.get("journal") or []
        self.effects = answer.get("effects") or []

    def _supersede_or_raise(self, running: AlreadyRunning) -> Steps[dict[str, Any]]:
        """Supersede the live attempt when told to (``_start``, step 2), or raise.

        The :class:`AlreadyRunning` raised speaks the client's terms (``supersede=``),
        not the API's: the caller never sends an attempt number.
        """
        if running.attempt is not None and (yield from self._should_supersede(running)):
            try:
                body = {**self._start_body, "supersede": running.attempt}
                return (yield from self.client._post("/runs", body))
            except AlreadyRunning as again:  # another start took the run over first
                running = again
        message = yield from self._already_running_message(running)
        raise AlreadyRunning(
            message, code=running.code, status=running.status, details=running.details
        ) from None  # the API's wording ("send supersede with its number") misleads here

    def _should_supersede(self, running: AlreadyRunning) -> Steps[bool]:
        if self.supersede is True:
            return True
        age = _heartbeat_age(running)
        if self.supersede != "stale" or age is None:
            return False
        return age > (yield from self._run_heartbeat_timeout())

    def _run_heartbeat_timeout(self) -> Steps[float]:
        """The run's ``heartbeat_timeout``: its first start fixed it, so ask the server."""
        timeout = self._start_body.get("heartbeat_timeout", 60)
        found = (yield from self.client._get("/runs", {"run_key": self.run_key})).get("items")
        if found and found[0].get("run_key") == self.run_key:
            timeout = found[0].get("heartbeat_timeout", timeout)
        return float(timeout)

    def _already_running_message(self, running: AlreadyRunning) -> Steps[str]:
        """What the caller can do about a live attempt, in the terms of ``client.run``."""
        try:
            timeout = yield from self._run_heartbeat_timeout()
        except StartsafeError:  # the message must not hide the refusal behind another error
            timeout = float(self._start_body.get("heartbeat_timeout", 60))
        age = _heartbeat_age(running)
        beat = "no heartbeat yet" if age is None else f"last heartbeat {max(age, 0):.0f} s ago"
        head = f"run {self.run_key!r} already has a running attempt {running.attempt} ({beat})"
        if self.supersede is True:
            return f"{head}: another start took the run over first"
        if self.supersede == "stale":
            return (
                f"{head}, not older than the run's heartbeat_timeout of {timeout:g} s: "
                "start again later, or pass supersede=True to take over now if you know "
                "that it died"
            )
        return (
            f"{head}: pass supersede=True to take over now, or supersede='stale' to take "
            f"over once its heartbeat is older than {timeout:g} s"
        )

    def _beat(self) -> Steps[bool]:
        """One heartbeat; returns whether to go on beating (not once the attempt stopped)."""
        try:
            yield from self.client._post(f"/runs/{self.id}/heartbeat", {"attempt": self.attempt})
        except AttemptStopped as stopped:
            self._stopped = stopped
            return False
        except Exception:  # noqa: BLE001 (a missed beat is retried at the next one)
            return True
        return True

    def _finish(self, outcome: Literal["completed", "failed"], error: str | None) -> Steps[None]:
        if self._finished:
            return
        body: dict[str, Any] = {"attempt": self.attempt, "outcome": outcome}
        if error:
            body["error"] = error[:MAX_ERROR_TEXT]
        answer = yield from self.client._post(f"/runs/{self.id}/finish", body)
        self._finished = True
        self.run = answer.get("run") or self.run

    def _leave(self, exc: BaseException | None) -> Steps[None]:
        """How the run context ends (after its heartbeats stopped).

        A normal exit finishes the attempt ``completed``; an exception finishes it
        ``failed`` with the error text (the effects it left in flight become
        ``unknown``), and the caller re-raises it; an :class:`AttemptStopped`
        (superseded, or run finished) finishes nothing, because the attempt is no
        longer this process's to finish.
        """
        if exc is None:
            yield from self._finish("completed", None)
        elif not isinstance(exc, AttemptStopped):
            try:
                yield from self._finish("failed", f"{type(exc).__name__}: {exc}")
            except StartsafeError as finishing:
                # The block's own exception is the one that matters; keep both.
                exc.__context__ = finishing

    # --- one tool call ----------------------------------------------------------------

    def _call(self, tool: Tool, given: Mapping[str, Any]) -> Steps[Any]:
        """Record the call (after the key rule found a key), then act on the answer."""
        self.check()
        args = dict(given)
        if _is_async(tool.fn) and not self.client.awaits_tools:
            raise TypeError(f"tool {tool.name!r} is async def: call it through AsyncClient")
        body = self._call_body(tool, args)  # a KeyRefused here records nothing
        answer = yield from self.client._post(f"/runs/{self.id}/calls", body)
        self.journal.append(answer["call"])
        if tool.spec.kind == "read":
            return (yield _invoke(tool, args))
        return (yield from self._follow(tool, answer["action"], answer["effect"]))

    def _call_body(self, tool: Tool, args: dict[str, Any]) -> dict[str, Any]:
        """``POST /runs/{id}/calls``'s body: the call, and the effect's declaration."""
        spec = tool.spec
        body: dict[str, Any] = {
            "attempt": self.attempt,
            "tool": tool.name,
            "kind": spec.kind,
            "args": args,
        }
        key = spec.key_for(tool.name, args)
        if key is not None:
            body["key"] = key.value
            body["key_source"] = key.source
        if spec.needs_approval:
            body["needs_approval"] = True
            body["approvals_required"] = spec.approvals_required
            if spec.approval_ttl is not None:
                body["approval_ttl"] = spec.approval_ttl
        preview = spec.preview_for(args)
        if preview is not None:
            body["preview"] = preview
        if spec.timeout is not None:
            body["timeout"] = spec.timeout
        return body

    def _follow(self, tool: Tool, action: str, effect: dict[str, Any]) -> Steps[Any]:
        """Act on an effect's action until it executes, skips, or must stop.

        1. ``execute`` runs it; ``skip`` returns the recorded result.
        2. ``claim`` claims it and goes on with the claim's answer.
        3. ``wait`` polls (bounded by the client's ``approval_timeout``).
        4. ``review`` runs the reconcile lookup once and goes on with its answer,
           else raises :class:`OutcomeUnknown`; ``blocked`` raises :class:`EffectBlocked`.
        """
        deadline: float | None = None
        reconciled = False
        while True:
            if action == "execute":
                return (yield from self._execute(tool, effect))
            if action == "skip":
                return effect.get("result") or {}
            url = self.client.console_url(effect["id"])
            if action == "claim":
                self.check()
                answer = yield from self.client._post(
                    f"/effects/{effect['id']}/claim", {"run_id": self.id, "attempt": self.attempt}
                )
                action, effect = answer["action"], answer["effect"]
            elif action == "blocked":
                raise EffectBlocked(_blocked_message(tool, effect), effect=effect, url=url)
            elif action == "review":
                if tool.spec.reconcile is None or reconciled:
                    why = (
                        "is still in review after the lookup"
                        if reconciled
                        else "is unknown and the tool has no reconcile lookup"
                    )
                    raise self._for_a_person(
                        OutcomeUnknown, effect, f"{tool.name}: the outcome of effect {{}} {why}"
                    )
                reconciled = True
                action, effect = yield from self._reconcile(tool, effect)
            elif action == "wait":
                if deadline is None:  # the wait begins: once per call
                    deadline = self.client.clock() + self.client.approval_timeout
                    yield from self._tell_waiting(tool, effect)
                action, effect = yield from self._wait(tool, effect, deadline)
            else:
                raise StartsafeError(f"unexpected action {action!r}", code="unexpected")

    def _execute(self, tool: Tool, effect: dict[str, Any]) -> Steps[dict[str, Any]]:
        """Run the tool with the effect's recorded args, then report what is known.

        1. The tool returns: its result is reported ``done``.
        2. It raises :class:`NotPerformed` (or a type of the spec's
           ``not_performed``): nothing was sent, so it is reported ``failed``.
        3. It raises anything else: **not reported** (an exception is not proof that
           nothing happened); the exception goes on, and the effect becomes
           ``unknown`` when the attempt ends.
        """
        complete = f"/effects/{effect['id']}/complete"
        base = {"run_id": self.id, "attempt": self.attempt}
        try:
            value = yield _invoke(tool, effect.get("args") or {})
        except Exception as exc:
            if not tool.spec.performed_nothing(exc):
                _note_unreported(exc, tool, effect, self.client.console_url(effect["id"]))
                raise
            error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_TEXT]
            try:
                yield from self.client._post(
                    complete, {**base, "outcome": "failed", "error": error}
                )
            except StartsafeError as reporting:
                exc.__context__ = reporting
            raise
        result = as_result(value)
        answer = yield from self.client._post(
            complete, {**base, "outcome": "done", "result": result}
        )
        recorded = (answer.get("effect") or {}).get("result")
        return recorded if isinstance(recorded, dict) else result

    def _tell_waiting(self, tool: Tool, effect: dict[str, Any]) -> Steps[None]:
        """Call the client's ``on_wait`` with where a person decides (``Waiting``)."""
        if self.client.on_wait is not None:
            waiting = Waiting(
                tool=tool.name,
                effect=effect,
                url=self.client.console_url(effect["id"]),
                timeout=self.client.approval_timeout,
            )
            yield Invoke(self.client.on_wait, (waiting,), blocking=False)

    def _wait(
        self, tool: Tool, effect: dict[str, Any], deadline: float
    ) -> Steps[tuple[str, dict[str, Any]]]:
        """Poll the effect until its action is no longer ``wait``, or the deadline."""
        etag: str | None = None
        interval = self.client.poll_interval
        while True:
            self.check()
            remaining = deadline - self.client.clock()
            if remaining <= 0:
                raise self._for_a_person(
                    ApprovalTimeout,
                    effect,
                    f"{tool.name}: effect {{}} still waits ({effect.get('status')}) after "
                    f"{self.client.approval_timeout:g}s; run again once decided",
                )
            yield Sleep(min(interval, remaining))
            interval = min(interval * 1.5, self.client.poll_max_interval)
            answer, etag = yield from self.client._poll_effect(effect["id"], etag)
            if answer is None:
                continue
            effect = answer["effect"]
            if answer["action"] != "wait":
                return answer["action"], effect

    def _for_a_person(
        self, error: type[EffectError], effect: dict[str, Any], what: str
    ) -> EffectError:
        """The exception that stops a call until a person decides: ``what`` (with ``{}``
        for the effect's id), and the console page where the person decides."""
        url = self.client.console_url(effect["id"])
        return error(
            f"{what.format(effect['id'])}; a person decides at {url}", effect=effect, url=url
        )

    def _reconcile(self, tool: Tool, effect: dict[str, Any]) -> Steps[tuple[str, dict[str, Any]]]:
        """Run the spec's lookup and report what it found; ``None`` means nobody knows."""
        lookup = tool.spec.reconcile
        assert lookup is not None
        found = yield Invoke(lookup, (effect.get("args") or {}, effect.get("key")))
        if found is None:
            raise self._for_a_person(
                OutcomeUnknown,
                effect,
                f"{tool.name}: the lookup could not tell whether effect {{}} happened",
            )
        if not isinstance(found, Reconciliation):
            raise TypeError("a reconcile lookup returns a Reconciliation or None")
        body: dict[str, Any] = {
            "run_id": self.id,
            "attempt": self.attempt,
            "outcome": found.outcome,
            "evidence": found.evidence[:MAX_EVIDENCE_TEXT],
        }
        if found.result is not None:
            body["result"] = found.result
        try:
            answer = yield from self.client._post(f"/effects/{effect['id']}/reconcile", body)
        except ClaimConflict:
            # Settled meanwhile (a person decided, or a late report came): go on from it.
            answer = yield from self.client._get(f"/effects/{effect['id']}", {})
        return answer["action"], answer["effect"]


def _invoke(tool: Tool, args: dict[str, Any]) -> Invoke:
    """The operation that runs the tool with these arguments."""
    if tool.args_as_dict:
        return Invoke(tool.fn, (args,))
    return Invoke(tool.fn, kwargs=args)


def _is_async(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` gives a coroutine (``async def``, a partial of one, or an
    object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (a callable object's own method)
    )


def _note_unreported(exc: BaseException, tool: Tool, effect: dict[str, Any], url: str) -> None:
    """Say on the exception (Python 3.11's notes) why the effect was not reported."""
    add_note = getattr(exc, "add_note", None)
    if add_note is not None:
        add_note(
            f"startsafe: {tool.name} raised, so effect {effect['id']} was not reported: an "
            "exception is not proof that nothing happened. It becomes unknown when this "
            f"attempt ends; the next attempt reconciles it, or a person decides at {url}. "
            "A tool that sent nothing raises NotPerformed to have it run again."
        )


def _blocked_message(tool: Tool, effect: dict[str, Any]) -> str:
    decision = effect.get("decision") or {}
    verb = decision.get("verb") or effect.get("status") or "blocked"
    note = decision.get("note") or ""
    text = f"{tool.name}: effect {effect['id']} is {effect.get('status')} ({verb})"
    return f"{text}: {note}" if note else text


def _heartbeat_age(running: AlreadyRunning) -> float | None:
    """Seconds since the live attempt's last heartbeat (``None`` when not given)."""
    if not running.heartbeat_at:
        return None
    now = datetime.now(timezone.utc)  # noqa: UP017 (the client supports Python 3.10)
    return (now - _parse_time(running.heartbeat_at)).total_seconds()


def _parse_time(text: str) -> datetime:
    """An ISO 8601 time (``Z`` accepted, as Python 3.10 does not)."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)  # noqa: UP017
