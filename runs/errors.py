"""Errors of the journal's rules, each with the contract's code and HTTP status.

The API turns them into ``{"error": {"code", "message", "details"}}``; the console
into a 4xx page showing the current state.
"""

from __future__ import annotations


class JournalError(Exception):
    code = "invalid_request"
    status = 400

    def __init__(self, message: str, details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or {}


class InvalidRequest(JournalError):
    code = "invalid_request"
    status = 400


class NotFound(JournalError):
    code = "not_found"
    status = 404


class AlreadyRunning(JournalError):
    code = "already_running"
    status = 409


class RestartBlocked(JournalError):
    code = "restart_blocked"
    status = 409


class RunFinished(JournalError):
    code = "run_finished"
    status = 409


class AttemptSuperseded(JournalError):
    code = "attempt_superseded"
    status = 409


class KeyConflict(JournalError):
    code = "key_conflict"
    status = 409


class ToolNotRegistered(JournalError):
    """Under an agent's ``closed`` mode, a tool that is not registered."""

    code = "tool_not_registered"
    status = 409


class ClaimConflict(JournalError):
    code = "claim_conflict"
    status = 409


class Forbidden(JournalError):
    """A person without the permission for this decision."""

    code = "forbidden"
    status = 403


class NotAllowed(JournalError):
    """A decision the current status does not allow (the console's 409)."""

    code = "not_allowed"
    status = 409


class StaleArgs(JournalError):
    """A decision for an ``args_hash`` that is no longer the current one."""

    code = "stale_args"
    status = 409
