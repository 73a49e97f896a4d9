"""Typed exceptions: one per error code of the API contract, plus the agent-side outcomes.

Every exception is a :class:`StartsafeError` with ``code``, ``status`` (the HTTP
status, or ``None`` when no single answer caused it), ``message`` and ``details``.

How to handle each one (README, "For agent developers"):

=======================  ==================================================================
exception                what to do
=======================  ==================================================================
Unauthorized             fix the token; nothing was recorded
NotFound                 a wrong id, or another agent's: a bug in the caller
AlreadyRunning           another attempt is live: wait, or ``supersede=True`` / ``"stale"``
RestartBlocked           the verdict refuses: an operator must allow the restart (``verdict``)
RunFinished              the run is completed or abandoned: stop, nothing more to do
AttemptSuperseded        a newer attempt took over: stop at once, do nothing more
KeyConflict              two tools name the same key: a bug in a key rule
ToolNotRegistered        the agent's ``closed`` mode takes no new tools: an admin registers ``tool``
ClaimConflict            the effect changed hands (an operator decided): re-read it
RequestInProgress        retried automatically; raised only when retries ran out
IdempotencyKeyReused     the same ``Idempotency-Key`` with another body: a client bug
PayloadTooLarge          arguments or result over the limit: send a reference instead
InvalidRequest           ``details["fields"]`` says which field is wrong
ServiceUnavailable       network errors or 5xx outlasted the retries: try again later
EffectBlocked            rejected or expired: never perform it; hand ``note`` to the model
ApprovalTimeout          nobody decided within the bounded wait: stop, run again later
OutcomeUnknown           it may or may not have happened: a person decides in the console
KeyRefused               the key rule found no key in these arguments: nothing was recorded
=======================  ==================================================================

One exception goes the other way: :class:`NotPerformed` is raised by a *tool*, to
say that it sent nothing (so the effect is reported ``failed`` and may run again).
Any other exception from an effect's tool is not proof that nothing happened: the
client does not report it, and the effect's outcome stays unknown until the next
attempt reconciles it or a person decides.

The outcomes a model should hear about (:class:`EffectBlocked`,
:class:`ApprovalTimeout`, :class:`OutcomeUnknown`, :class:`KeyRefused`) say it in
``for_model``: the text a framework adapter hands back as the tool's output.
"""

from __future__ import annotations

from typing import Any


class StartsafeError(Exception):
    """Base of every error the client raises.

    Attributes:
        code: the contract's error code (``"already_running"``…) or the client's own
            (``"effect_blocked"``, ``"approval_timeout"``, ``"outcome_unknown"``,
            ``"unavailable"``).
        status: the HTTP status of the answer that caused it, or ``None``.
        message: one sentence for a person.
        details: the answer's ``error.details`` (or the client's own details).
    """

    code: str = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status
        self.details: dict[str, Any] = details or {}

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status else ""
        return f"{self.code}{where}: {self.message}"

    @property
    def for_model(self) -> str:
        """The error as the text a framework adapter hands back to the model."""
        return self.message


# --- The contract's error codes ----------------------------------------------


class InvalidRequest(StartsafeError):
    """400: malformed or out-of-range input; ``details["fields"]`` names each field."""

    code = "invalid_request"

    @property
    def fields(self) -> dict[str, Any]:
        """Each wrong field and what is wrong with it."""
        return self.details.get("fields") or {}


class Unauthorized(StartsafeError):
    """401: no token, an unknown token, or a deactivated agent."""

    code = "unauthorized"


class NotFound(StartsafeError):
    """404: no such object for this agent (another agent's ids answer the same)."""

    code = "not_found"


class AlreadyRunning(StartsafeError):
    """409: the run has a live attempt; ``attempt`` and ``heartbeat_at`` help judge it.

    Raised by :meth:`Client.run` with a message in the client's terms: how old the
    attempt's heartbeat is, and which ``supersede=`` takes it over. (A raw
    ``client.post("/runs", ...)`` keeps the API's message, about its ``supersede``
    attempt number.)
    """

    code = "already_running"

    @property
    def attempt(self) -> int | None:
        """The run's current attempt number."""
        return self.details.get("attempt")

    @property
    def heartbeat_at(self) -> str | None:
        """When that attempt last heartbeat (ISO 8601)."""
        return self.details.get("heartbeat_at")


class RestartBlocked(StartsafeError):
    """409: the verdict says the restart is not safe; ``verdict`` says why."""

    code = "restart_blocked"

    @property
    def verdict(self) -> dict[str, Any]:
        """The verdict: ``safe``, ``policy``, ``blocking`` and ``notes``."""
        return self.details.get("verdict") or {}


class AttemptStopped(StartsafeError):
    """This attempt may no longer act: it was superseded, or the run is finished.

    Catch this one base to stop on either.
    """


class RunFinished(AttemptStopped):
    """409: the run is ``completed`` or ``abandoned``."""

    code = "run_finished"


class AttemptSuperseded(AttemptStopped):
    """409: this attempt is no longer the run's current running attempt: stop."""

    code = "attempt_superseded"


class KeyConflict(StartsafeError):
    """409: the key already belongs to another tool (``tool`` names it)."""

    code = "key_conflict"

    @property
    def tool(self) -> str | None:
        """The tool that owns the key."""
        return self.details.get("tool")


class ToolNotRegistered(StartsafeError):
    """409: under the agent's ``closed`` mode, ``tool`` is not registered: only an admin
    adds tools (the tools page), and nothing was recorded."""

    code = "tool_not_registered"

    @property
    def tool(self) -> str | None:
        """The tool that is not registered."""
        return self.details.get("tool")


class ClaimConflict(StartsafeError):
    """409: this attempt cannot hold the effect now; ``effect_status`` is its status."""

    code = "claim_conflict"

    @property
    def effect_status(self) -> str | None:
        """The effect's status when the claim or report was refused."""
        return self.details.get("status")


class RequestInProgress(StartsafeError):
    """409: the same ``Idempotency-Key`` is still being processed.

    The client retries it after a pause by itself; this is raised only once its
    retries ran out. Retrying later with the same key is safe.
    """

    code = "request_in_progress"


class IdempotencyKeyReused(StartsafeError):
    """422: the ``Idempotency-Key`` was used before with a different body."""

    code = "idempotency_key_reused"


class PayloadTooLarge(StartsafeError):
    """413: the body is over 1 MiB, or ``input``/``args``/``result`` over 256 KiB."""

    code = "payload_too_large"


class RateLimited(StartsafeError):
    """429: this token made too many requests in the server's window.

    The client waits ``Retry-After`` seconds and retries by itself; this is raised
    only once its retries ran out. ``retry_after`` is the server's last advice.
    """

    code = "rate_limited"

    @property
    def retry_after(self) -> float | None:
        value = self.details.get("retry_after")
        return float(value) if isinstance(value, (int, float)) else None


class ServiceUnavailable(StartsafeError):
    """Network errors or 5xx answers outlasted the retries (``status`` is the last 5xx)."""

    code = "unavailable"


ERRORS_BY_CODE: dict[str, type[StartsafeError]] = {
    cls.code: cls
    for cls in (
        InvalidRequest,
        Unauthorized,
        NotFound,
        AlreadyRunning,
        RestartBlocked,
        RunFinished,
        AttemptSuperseded,
        KeyConflict,
        ToolNotRegistered,
        ClaimConflict,
        RequestInProgress,
        IdempotencyKeyReused,
        PayloadTooLarge,
        RateLimited,
    )
}


def error_from_answer(status: int, body: Any) -> StartsafeError:
    """Build the typed exception for an error answer ``{"error": {code, message, details}}``."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return StartsafeError(
            f"Unexpected answer without an error body: {str(body)[:200]}",
            code="unexpected",
            status=status,
        )
    code = str(error.get("code") or "error")
    message = str(error.get("message") or code)
    details = error.get("details") if isinstance(error.get("details"), dict) else {}
    cls = ERRORS_BY_CODE.get(code, StartsafeError)
    return cls(message, code=code, status=status, details=details)


# --- What a tool call can end in -----------------------------------------------


class NotPerformed(Exception):
    """Raised by a tool to say that it sent nothing: the effect did not happen.

    **An exception is not proof that nothing happened.** A tool that sent the
    e-mail and then timed out reading the answer did the effect, so the client
    never reports an ordinary exception from an effect's tool: the effect stays in
    flight, becomes ``unknown`` when the attempt ends, and the next attempt
    reconciles it (or a person decides). Only ``NotPerformed`` (or an exception type
    the spec declares with ``effect(not_performed=...)``) is reported ``failed``, so
    the next call of that key runs the tool again.

    Raise it only where nothing can have left the process yet::

        try:
            connection = smtp.connect()
        except OSError as refused:
            raise NotPerformed("the mail server refused the connection") from refused
        connection.send(message)  # from here on, an exception leaves it unknown
    """


class KeyRefused(StartsafeError, ValueError):
    """The key rule found no key in these arguments: the call was refused, nothing recorded.

    A key is never built from nothing: a missing, ``None`` or empty field makes the
    rule (or the key helpers it calls) refuse, and the call is refused before it is
    recorded. ``tool`` names the tool. It is a ``ValueError`` too.
    """

    code = "key_refused"

    @property
    def tool(self) -> str | None:
        """The tool whose key rule refused."""
        return self.details.get("tool")


class EffectError(StartsafeError):
    """Base of the outcomes of a tool call that mean "do not perform it now".

    ``effect`` is the effect as last seen (a dict shaped like the API's Effect);
    ``url`` is its page in the console, where a person decides.
    """

    def __init__(
        self, message: str, *, effect: dict[str, Any], url: str = "", **kwargs: Any
    ) -> None:
        super().__init__(message, **kwargs)
        self.effect = effect
        self.url = url

    @property
    def effect_id(self) -> str | None:
        """The effect's id, for the console address ``/effects/<id>/``."""
        return self.effect.get("id")

    @property
    def tool(self) -> str:
        """The tool whose effect this is."""
        return str(self.effect.get("tool") or "")


class EffectBlocked(EffectError):
    """The effect was rejected or its approval expired: never perform it.

    ``note`` is the rejection note written for the model: hand it back so it can
    change course (a revision with other arguments asks for approval again,
    unless the rejection was final). ``for_model`` says so in one line.
    """

    code = "effect_blocked"

    @property
    def note(self) -> str:
        """The decision's note (empty for an expiry without one)."""
        decision = self.effect.get("decision") or {}
        return str(decision.get("note") or "")

    @property
    def final(self) -> bool:
        """True when the rejection was final: no revision can ask again."""
        decision = self.effect.get("decision") or {}
        return bool(decision.get("final"))

    @property
    def for_model(self) -> str:
        """``"rejected by an operator: <note>"`` (or why it expired), for the model."""
        if self.effect.get("status") == "expired":
            head = "not performed: nobody approved it in time"
        else:
            head = "rejected by an operator"
            if self.final:
                head += " (final: do not propose it again)"
        return f"{head}: {self.note}" if self.note else head


class ApprovalTimeout(EffectError):
    """The bounded wait ran out while the effect still waited (or awaited review).

    Nothing was performed. Starting the run again later resumes the wait.
    """

    code = "approval_timeout"

    @property
    def for_model(self) -> str:
        """That it did not run yet, and the console page where a person decides."""
        return (
            f"not performed yet: it waits ({self.effect.get('status')}) for a person's "
            f"decision at {self.url}"
        )


class OutcomeUnknown(EffectError):
    """The effect may or may not have happened and the client cannot tell.

    Raised on ``review`` when the tool declares no reconcile lookup, or when its
    lookup could not tell. A person settles it in the console (mark done, release
    or reject at ``/effects/<id>/``); start the run again afterwards.
    """

    code = "outcome_unknown"

    @property
    def for_model(self) -> str:
        """That it may have happened, and where a person settles it: do not retry."""
        return (
            f"it may or may not have happened; do not try it again: a person decides at {self.url}"
        )
