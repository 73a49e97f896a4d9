"""The run context: start or restart a run, heartbeat, call tools, finish.

::

    with client.run("ticket-4812", title="Answer ticket 4812", supersede="stale") as run:
        customer = run.call(lookup_customer, email="ana@example.com")
        run.call(send_reply, message_id=msg_id, body="Hello Ana, ...")

A tool is called with ``run.call(tool, **args)``: the call is recorded in the
journal *before* it is made, and the answer decides what happens (api.md,
"Action"):

- ``execute`` — the function runs with ``effect.args`` from the answer (the
  version to execute, possibly edited by an operator), not with what the model
  generated this time; its result is reported ``done`` (or ``failed`` with the
  error, which is re-raised);
- ``skip`` — already done: the recorded result is returned, nothing runs;
- ``wait`` — bounded polling of the effect (with ``ETag``/``If-None-Match``) until
  it can be claimed (then it executes), is done (skip), blocked or in review;
- ``review`` — its outcome is unknown: the tool's reconcile lookup settles it, or
  :class:`OutcomeUnknown` is raised for a person to decide;
- ``blocked`` — :class:`EffectBlocked`, with the decision's note for the model.

**When the attempt is stopped.** The heartbeat thread learns that this attempt was
superseded (or the run finished) from the server. It cannot interrupt your code,
so it sets a flag: the next ``run.call`` (or :meth:`Run.check`, for loops that
call no tool) raises :class:`AttemptSuperseded` (or :class:`RunFinished`). The
block then ends without finishing the run, since it is no longer this attempt's.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from .client import Reconciliation, Tool, Waiting
from .errors import (
    AlreadyRunning,
    ApprovalTimeout,
    AttemptStopped,
    ClaimConflict,
    EffectBlocked,
    OutcomeUnknown,
    StartsafeError,
)

if TYPE_CHECKING:
    from .client import Client

MAX_ERROR_TEXT = 4000
MAX_EVIDENCE_TEXT = 2000


class Run:
    """One attempt of a run, as a context manager (made by :meth:`Client.run`).

    Entering it:

    1. ``POST /runs`` starts the run (attempt 1) or starts it again.
    2. On ``409 already_running`` it supersedes the live attempt only when told to:
       ``supersede=True`` always; ``supersede="stale"`` when that attempt's last
       heartbeat is older than the run's ``heartbeat_timeout`` (it is presumed
       dead); ``False`` raises :class:`AlreadyRunning`. A refused restart raises
       :class:`RestartBlocked` with the verdict.
    3. A daemon thread heartbeats every ``heartbeat_timeout / 3`` seconds.

    Leaving it: a normal exit finishes the attempt ``completed``; an exception
    finishes it ``failed`` with the error text and is re-raised; an
    :class:`AttemptStopped` (superseded, or run finished) is re-raised without
    finishing, because the attempt is no longer this process's to finish.

    Attributes (after entering): ``id``, ``attempt`` (the attempt number),
    ``run`` (the Run object), ``verdict``, ``journal`` (the calls recorded so far,
    by every attempt), ``effects`` (the effects they point to), ``attempt_info``.
    """

    def __init__(
        self,
        client: Client,
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
        for field, value in (
            ("title", title),
            ("input", input),
            ("restart_policy", restart_policy),
            ("heartbeat_timeout", heartbeat_timeout),
            ("restart_url", restart_url),
            ("agent_version", agent_version),
        ):
            if value is not None:
                self._start_body[field] = value
        self.supersede = supersede
        self.id: str = ""
        self.attempt: int = 0
        self.run: dict[str, Any] = {}
        self.attempt_info: dict[str, Any] = {}
        self.verdict: dict[str, Any] = {}
        self.journal: list[dict[str, Any]] = []
        self.effects: list[dict[str, Any]] = []
        self._stopped: AttemptStopped | None = None
        self._stop_heartbeat = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._finished = False

    # --- start and finish -----------------------------------------------------------

    def start(self) -> Run:
        """Start (or restart) the run and begin heartbeating; ``__enter__`` calls it."""
        try:
            answer = self.client.post("/runs", self._start_body)
        except AlreadyRunning as running:
            answer = self._supersede_or_raise(running)
        self._adopt(answer)
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name=f"startsafe-heartbeat-{self.id}", daemon=True
        )
        self._heartbeat_thread.start()
        return self

    def _adopt(self, answer: dict[str, Any]) -> None:
        self.run = answer["run"]
        self.attempt_info = answer["attempt"]
        self.id = self.run["id"]
        self.attempt = int(self.attempt_info["number"])
        self.verdict = answer.get("verdict") or {}
        self.journal = answer.get("journal") or []
        self.effects = answer.get("effects") or []

    def _supersede_or_raise(self, running: AlreadyRunning) -> dict[str, Any]:
        """Supersede the live attempt when told to (class doc, step 2), or raise.

        The :class:`AlreadyRunning` raised speaks the client's terms (``supersede=``),
        not the API's: the caller never sends an attempt number.
        """
        if running.attempt is not None and self._should_supersede(running):
            try:
                return self.client.post("/runs", {**self._start_body, "supersede": running.attempt})
            except AlreadyRunning as again:  # another start took the run over first
                running = again
        raise AlreadyRunning(
            self._already_running_message(running),
            code=running.code,
            status=running.status,
            details=running.details,
        ) from None  # the API's wording ("send supersede with its number") misleads here

    def _should_supersede(self, running: AlreadyRunning) -> bool:
        """Whether to supersede the live attempt (see the class doc, step 2)."""
        if self.supersede is True:
            return True
        age = _heartbeat_age(running)
        if self.supersede != "stale" or age is None:
            return False
        return age > self._run_heartbeat_timeout()

    def _run_heartbeat_timeout(self) -> float:
        """The run's ``heartbeat_timeout``: its first start fixed it, so ask the server."""
        timeout = self._start_body.get("heartbeat_timeout", 60)
        found = self.client.list_runs(run_key=self.run_key).get("items") or []
        if found and found[0].get("run_key") == self.run_key:
            timeout = found[0].get("heartbeat_timeout", timeout)
        return float(timeout)

    def _already_running_message(self, running: AlreadyRunning) -> str:
        """What the caller can do about a live attempt, in the terms of ``client.run``."""
        try:
            timeout = self._run_heartbeat_timeout()
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

    def finish(self, outcome: Literal["completed", "failed"], error: str | None = None) -> None:
        """Finish this attempt (``__exit__`` calls it); stops the heartbeat first."""
        self._stop_heartbeats()
        if self._finished:
            return
        body: dict[str, Any] = {"attempt": self.attempt, "outcome": outcome}
        if error:
            body["error"] = error[:MAX_ERROR_TEXT]
        answer = self.client.post(f"/runs/{self.id}/finish", body)
        self._finished = True
        self.run = answer.get("run") or self.run

    def __enter__(self) -> Run:
        return self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        if exc is None:
            self.finish("completed")
        elif isinstance(exc, AttemptStopped):
            self._stop_heartbeats()
        else:
            try:
                self.finish("failed", f"{type(exc).__name__}: {exc}")
            except StartsafeError as finishing:
                # The block's own exception is the one that matters; keep both.
                exc.__context__ = finishing
        return False

    # --- heartbeats and stopping ----------------------------------------------------

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between two heartbeats: a third of the run's ``heartbeat_timeout``."""
        return max(0.5, float(self.run.get("heartbeat_timeout") or 60) / 3)

    def _heartbeat_loop(self) -> None:
        while not self._stop_heartbeat.wait(self.heartbeat_interval):
            try:
                self.client.post(f"/runs/{self.id}/heartbeat", {"attempt": self.attempt})
            except AttemptStopped as stopped:
                self._stopped = stopped
                return
            except Exception:
                continue  # a missed beat is retried at the next one

    def _stop_heartbeats(self) -> None:
        self._stop_heartbeat.set()
        thread = self._heartbeat_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

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

    # --- tool calls -----------------------------------------------------------------

    def call(self, tool: Tool, /, **args: Any) -> Any:
        """Call a declared tool: record the call, then act on the answer.

        Returns the tool's result: for a read, whatever the function returns; for
        an effect, the result dict (executed now, or the recorded one on skip).

        Raises:
            EffectBlocked: rejected or expired; ``note`` is meant for the model.
            ApprovalTimeout: the bounded wait for a decision ran out.
            OutcomeUnknown: in review and the tool has no lookup (or it could not tell).
            AttemptSuperseded, RunFinished: this attempt must stop.
            Any exception of the tool's function, after reporting the effect failed.
        """
        if not isinstance(tool, Tool):
            raise TypeError("run.call takes a tool declared with @client.tool")
        self.check()
        args = dict(args)
        body: dict[str, Any] = {
            "attempt": self.attempt,
            "tool": tool.name,
            "kind": tool.kind,
            "args": args,
        }
        if tool.kind == "read":
            self._record(body)
            return tool.fn(**args)
        key = tool.key_for(args)  # a ValueError here records nothing
        if key is not None:
            body["key"] = key.value
            body["key_source"] = key.source
        if tool.needs_approval:
            body["needs_approval"] = True
            body["approvals_required"] = tool.approvals_required
            if tool.approval_ttl is not None:
                body["approval_ttl"] = tool.approval_ttl
        preview = tool.preview_for(args)
        if preview is not None:
            body["preview"] = preview
        if tool.timeout is not None:
            body["timeout"] = tool.timeout
        answer = self._record(body)
        return self._follow(tool, answer["action"], answer["effect"])

    def _record(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.client.post(f"/runs/{self.id}/calls", body)
        self.journal.append(answer["call"])
        return answer

    def _follow(self, tool: Tool, action: str, effect: dict[str, Any]) -> Any:
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
                return self._execute(tool, effect)
            if action == "skip":
                return effect.get("result") or {}
            if action == "claim":
                self.check()
                answer = self.client.post(
                    f"/effects/{effect['id']}/claim", {"run_id": self.id, "attempt": self.attempt}
                )
                action, effect = answer["action"], answer["effect"]
            elif action == "blocked":
                raise EffectBlocked(_blocked_message(tool, effect), effect=effect)
            elif action == "review":
                if tool.reconcile is None:
                    raise OutcomeUnknown(
                        f"{tool.name}: the outcome of effect {effect['id']} is unknown and "
                        "the tool has no reconcile lookup; a person decides at "
                        f"{self.client.console_url(effect['id'])}",
                        effect=effect,
                    )
                if reconciled:
                    raise OutcomeUnknown(
                        f"{tool.name}: effect {effect['id']} is still in review after the "
                        f"lookup; a person decides at {self.client.console_url(effect['id'])}",
                        effect=effect,
                    )
                reconciled = True
                action, effect = self._reconcile(tool, effect)
            elif action == "wait":
                if deadline is None:  # the wait begins: once per call
                    deadline = self.client.clock() + self.client.approval_timeout
                    self._tell_waiting(tool, effect)
                action, effect = self._wait(tool, effect, deadline)
            else:
                raise StartsafeError(f"unexpected action {action!r}", code="unexpected")

    def _execute(self, tool: Tool, effect: dict[str, Any]) -> dict[str, Any]:
        """Run the function with the effect's recorded args, then report the outcome."""
        complete = f"/effects/{effect['id']}/complete"
        base = {"run_id": self.id, "attempt": self.attempt}
        try:
            result = tool.fn(**(effect.get("args") or {}))
        except Exception as exc:
            try:
                self.client.post(
                    complete,
                    {**base, "outcome": "failed", "error": f"{type(exc).__name__}: {exc}"[:4000]},
                )
            except StartsafeError as reporting:
                exc.__context__ = reporting
            raise
        result = _as_result(result)
        answer = self.client.post(complete, {**base, "outcome": "done", "result": result})
        recorded = (answer.get("effect") or {}).get("result")
        return recorded if isinstance(recorded, dict) else result

    def _tell_waiting(self, tool: Tool, effect: dict[str, Any]) -> None:
        """Call the client's ``on_wait`` with where a person decides (``Waiting``)."""
        if self.client.on_wait is not None:
            self.client.on_wait(
                Waiting(
                    tool=tool.name,
                    effect=effect,
                    url=self.client.console_url(effect["id"]),
                    timeout=self.client.approval_timeout,
                )
            )

    def _wait(
        self, tool: Tool, effect: dict[str, Any], deadline: float
    ) -> tuple[str, dict[str, Any]]:
        """Poll the effect until its action is no longer ``wait``, or the deadline."""
        etag: str | None = None
        interval = self.client.poll_interval
        while True:
            self.check()
            remaining = deadline - self.client.clock()
            if remaining <= 0:
                raise ApprovalTimeout(
                    f"{tool.name}: effect {effect['id']} still waits ({effect.get('status')}) "
                    f"after {self.client.approval_timeout:g}s; decide at "
                    f"{self.client.console_url(effect['id'])} and run again",
                    effect=effect,
                )
            self.client.sleep(min(interval, remaining))
            interval = min(interval * 1.5, self.client.poll_max_interval)
            answer, etag = self.client.poll_effect(effect["id"], etag)
            if answer is None:
                continue
            effect = answer["effect"]
            if answer["action"] != "wait":
                return answer["action"], effect

    def _reconcile(self, tool: Tool, effect: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """Run the tool's lookup and report what it found; ``None`` means nobody knows."""
        assert tool.reconcile is not None
        found = tool.reconcile(effect.get("args") or {}, effect.get("key"))
        if found is None:
            raise OutcomeUnknown(
                f"{tool.name}: the lookup could not tell whether effect {effect['id']} "
                f"happened; a person decides at {self.client.console_url(effect['id'])}",
                effect=effect,
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
            answer = self.client.post(f"/effects/{effect['id']}/reconcile", body)
        except ClaimConflict:
            # Settled meanwhile (a person decided, or a late report came): go on from it.
            answer = self.client.get_effect(effect["id"])
        return answer["action"], answer["effect"]


def _as_result(value: Any) -> dict[str, Any]:
    """A tool's return value as the effect's result object: ``None`` → ``{}``."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return value
    return {"value": value}


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
