"""The agent API v1 (api.md): django-ninja over the journal's rules in ``runs/lifecycle.py``,
``runs/calls.py`` and ``runs/outcomes.py``.

One auth class sets the agent; one place turns every failure into the contract's
error body (``_error_handlers``); the endpoints are thin: validate (schemas), call a
rule, serialise. Size limits and ``Idempotency-Key`` live in ``runs/api/idempotency.py``.
The rules run with ``savepoint=False``: a ``POST``'s transaction is the rule's
alone (runs/lifecycle.py says why; the idempotency middleware rolls a failed one
back).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Literal
from uuid import UUID

from django.core.exceptions import RequestDataTooBig
from django.db import DataError
from django.http import Http404, HttpRequest
from ninja import Field, NinjaAPI, Query, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser
from ninja.security import HttpBearer

from runs import calls, lifecycle, outcomes, registry
from runs.api.auth import (
    agent_for_request,
    error_response,
    internal_error_response,
    unauthorized_response,
)
from runs.api.poll import poll_response
from runs.api.ratelimit import RateLimited, rate_limit_refusal, rate_limited_response
from runs.api.render import ORJSONRenderer
from runs.api.schemas import (
    NO_NUL,
    AttemptIn,
    CallIn,
    ClaimIn,
    CompleteIn,
    EffectActionOut,
    EffectOnlyOut,
    EffectPage,
    ErrorOut,
    FinishIn,
    ReconcileIn,
    RecordOut,
    RunDetailOut,
    RunOnlyOut,
    RunPage,
    StartIn,
    StartOut,
    ToolPage,
    ToolsIn,
    ToolsOut,
)
from runs.api.serialize import (
    attempt_dict,
    call_dict,
    effect_dict,
    journal_of,
    run_dict,
    tool_dict,
)
from runs.errors import JournalError
from runs.models import Attempt, Effect, Run, Tool
from runs.validation import PayloadTooLarge
from runs.verdict import restart_verdict

logger = logging.getLogger("startsafe.api")


class StrictJsonParser(Parser):
    """UTF-8 JSON only, without NaN or Infinity (RFC 8785 cannot represent them)."""

    def parse_body(self, request: HttpRequest):
        text = request.body.decode("utf-8")  # invalid UTF-8 raises: a 400

        def refuse_constant(name: str):
            raise ValueError(f"{name} is not valid JSON")

        return json.loads(text, parse_constant=refuse_constant)


class AgentToken(HttpBearer):
    """``Authorization: Bearer <token>``: the agent is ``request.auth``; 429 past the rate."""

    def authenticate(self, request: HttpRequest, token: str):
        # agent_for_request reads the same header (as the idempotency middleware did,
        # whose lookup it returns without a second query).
        agent = agent_for_request(request)
        refusal = rate_limit_refusal(request, agent) if agent is not None else None
        if refusal is not None:
            raise refusal  # ninja's way for an auth class to answer: _rate_limited below
        return agent


class AgentAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation) -> str:
        # The published operationIds (``runs_api_<view>``, the schema's links name
        # them) were made from the module runs/api.py; clients generated from the
        # schema keep their method names now that the API is a package.
        return f"runs_api_{operation.view_func.__name__}"


api = AgentAPI(
    title="startsafe agent API",
    version="1",
    description=(
        "Journal the tool calls of agent runs, keyed by idempotency keys from stable "
        "intent; learn whether to execute, skip, wait, review or stop. Every POST accepts "
        "an `Idempotency-Key` header (1–255 printable characters): a repeat gets the first "
        "answer again; another body with the same key is 422 `idempotency_key_reused`; a "
        "repeat while the first is processed is 409 `request_in_progress`. Errors are "
        '`{"error": {"code", "message", "details"}}`. Request bodies are limited to 1 MiB, '
        "and `input`, `args`, `result` to 256 KiB each as canonical JSON (413); a body must "
        "come with a `Content-Length` header (a chunked body is 411 `length_required`). "
        "Each token "
        "may make `STARTSAFE_RATE_LIMIT` requests per window (600 a minute by default); past "
        "it, every request is 429 `rate_limited` with a `Retry-After` header (seconds) until "
        "the window ends."
    ),
    auth=AgentToken(),
    parser=StrictJsonParser(),
    renderer=ORJSONRenderer(),
    urls_namespace="api",
    docs_url="/docs",
    openapi_url="/openapi.json",
)

ERRORS = {
    400: ErrorOut,
    401: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    413: ErrorOut,
    422: ErrorOut,
    429: ErrorOut,
}


# --- Errors: one place ---------------------------------------------------------------


# What pydantic says when a value is merely of another type than one union member
# wanted: the least useful message when another member says what is really wrong.
_TYPE_MISMATCHES = frozenset(
    {
        "string_type",
        "int_type",
        "float_type",
        "bool_type",
        "list_type",
        "dict_type",
        "none_required",
        "model_type",
        "model_attributes_type",
    }
)


def _request_json(request) -> object:
    try:
        return json.loads(request.body)
    except (ValueError, RecursionError):
        return None


def _has_part(value: object, part: object) -> bool:
    if isinstance(value, dict):
        return isinstance(part, str) and part in value
    if isinstance(value, list):
        return isinstance(part, int) and 0 <= part < len(value)
    return False


def _field_path(error: dict, body: object) -> list[str]:
    """The error's place in the request, as the client wrote it.

    pydantic's ``loc`` mixes the request's own keys with its schema's names: ninja's
    ``body``/``payload``/``query``/``filters``, the call's discriminator (``effect``),
    and the members of the JSON value union (``constrained-str``, ``dict[...]``). A
    part is kept when the request has it at that place (walking the parsed body),
    so a client's key named ``effect`` or ``bool`` is kept and a schema name is not.
    """
    loc = list(error.get("loc", ()))
    if loc[:1] == ["query"]:
        return [str(part) for part in loc[1:] if part != "filters"]
    if loc[:2] == ["body", "payload"]:
        loc = loc[2:]
    kind = body.get("kind") if isinstance(body, dict) else None
    if loc and loc[0] in ("read", "effect") and loc[0] == kind:
        loc = loc[1:]  # the discriminated union's tag
    if error.get("type") in ("union_tag_invalid", "union_tag_not_found"):
        discriminator = str((error.get("ctx") or {}).get("discriminator", "kind")).strip("'")
        loc = [*loc, discriminator]
    path: list[str] = []
    value = body
    for index, part in enumerate(loc):
        if _has_part(value, part):
            value = value[part]
        elif index == len(loc) - 1 and error.get("type") in ("missing", "union_tag_not_found"):
            value = None  # a field the request lacks: still the request's own name
        else:
            continue  # a name of the schema, not of the request
        path.append(str(part))
    return path


def _fields_of(errors: list[dict], body: object = None) -> dict[str, str]:
    """``details.fields``: each request field that is wrong, and what is wrong with it.

    Keyed by the field's name in the request (``input``, ``args``, ``limit``); a
    place inside a JSON value is named in the message (``input.a: ...``).
    """
    chosen: dict[str, tuple[bool, str]] = {}
    for error in errors:
        path = _field_path(error, body)
        name = path[0] if path else "body"
        message = str(error.get("msg", "is invalid"))
        if len(path) > 1:
            message = ".".join(path) + ": " + message
        mismatch = error.get("type") in _TYPE_MISMATCHES
        if name not in chosen or (chosen[name][0] and not mismatch):
            chosen[name] = (mismatch, message)
    return {name: message for name, (_, message) in chosen.items()}


@api.exception_handler(ValidationError)
def _validation_error(request, exc: ValidationError):
    errors = list(exc.errors)
    if any(str(e.get("loc", ("",))[0]) == "path" for e in errors):
        # The poll authenticates in its own statement, after validation: a malformed
        # id without an agent's token is still 401, and with one it is counted for the
        # rate as a poll is (for the other endpoints the auth class asked both before
        # validation: these are its kept answers).
        agent = agent_for_request(request)
        if agent is None:
            return unauthorized_response()
        refusal = rate_limit_refusal(request, agent)
        if refusal is not None:
            return rate_limited_response(refusal)
        # A malformed id names no object, exactly like an unknown one.
        return error_response(404, "not_found", "No such object for this agent.")
    body = _request_json(request) if request.method == "POST" else None
    for error in errors:
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, PayloadTooLarge) or "over the 256 KiB limit" in str(error.get("msg")):
            return error_response(
                413,
                "payload_too_large",
                "A JSON value is over its 256 KiB limit as canonical JSON.",
                {"fields": _fields_of([error], body)},
            )
    return error_response(
        400,
        "invalid_request",
        "The request is not valid: see details.fields.",
        {"fields": _fields_of(errors, body)},
    )


@api.exception_handler(AuthenticationError)
def _unauthorized(request, exc):
    return unauthorized_response()


@api.exception_handler(RateLimited)
def _rate_limited(request, exc: RateLimited):
    return rate_limited_response(exc)


@api.exception_handler(JournalError)
def _journal_error(request, exc: JournalError):
    return error_response(exc.status, exc.code, exc.message, exc.details)


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    if exc.status_code == 400:
        return error_response(
            400,
            "invalid_request",
            "The body is not valid UTF-8 JSON.",
            {"fields": {"body": "is not valid UTF-8 JSON"}},
        )
    code = {401: "unauthorized", 404: "not_found", 413: "payload_too_large"}.get(
        exc.status_code, "invalid_request"
    )
    return error_response(exc.status_code, code, str(exc), {})


@api.exception_handler(Http404)
def _not_found(request, exc):
    return error_response(404, "not_found", "No such object for this agent.")


@api.exception_handler(RequestDataTooBig)
def _too_big(request, exc):
    return error_response(413, "payload_too_large", "The request body is over the 1 MiB limit.")


@api.exception_handler(DataError)
def _data_error(request, exc):
    # The last line of defence: a value PostgreSQL refused is the client's input.
    logger.warning("database refused a value: %s", exc)
    return error_response(
        400,
        "invalid_request",
        "A value cannot be stored.",
        {"fields": {"body": "has a value the database cannot store"}},
    )


@api.exception_handler(Exception)
def _unexpected(request, exc):
    logger.exception("unexpected error in the API")
    return internal_error_response()


# --- Helpers ---------------------------------------------------------------------------


def _hot_answer(request, status: int, body: dict):
    """The answer of a write an agent makes on every tool call (record, complete),
    rendered as ninja renders it but not validated again on the way out: its dicts
    are runs/api/serialize.py's, which the response schemas describe, and pydantic's
    round trip through them was 2% of the write path's client CPU (callgrind,
    docs/performance.md). tests/test_api_answers.py holds these answers to their
    schemas; the poll's answer is built the same way (runs/api/poll.py)."""
    return api.create_response(request, body, status=status)


def _agent(request):
    return request.auth


def _run_of(request, run_id: UUID) -> Run:
    run = Run.objects.filter(pk=run_id, agent=_agent(request)).first()
    if run is None:
        raise Http404
    return run


def _whole_run(run: Run, attempt: Attempt | None = None) -> dict:
    journal, effects = journal_of(run)
    body = {
        "run": run_dict(run),
        "verdict": restart_verdict(run).as_dict(),
        "journal": journal,
        "effects": effects,
    }
    if attempt is not None:
        body["attempt"] = attempt_dict(attempt)
    return body


# A cursor is "<created_at in microseconds since the epoch>.<id as 32 hex digits>":
# every string of that shape is a valid position, so the schema can state it exactly.
CURSOR_PATTERN = r"^[0-9]{1,16}\.[0-9a-f]{32}$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _encode_cursor(created_at: datetime, pk: UUID) -> str:
    micros = (created_at - _EPOCH) // timedelta(microseconds=1)
    return f"{micros}.{pk.hex}"


def _decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    micros, _, hex_id = cursor.partition(".")
    return _EPOCH + timedelta(microseconds=int(micros)), UUID(hex=hex_id)


def _page(queryset, limit: int, cursor: str | None, serialize):
    """Newest first, keyset-paginated on (created_at, id)."""
    if cursor:
        created_at, pk = _decode_cursor(cursor)
        queryset = queryset.filter(created_at__lte=created_at).exclude(
            created_at=created_at, pk__gte=pk
        )
    rows = list(queryset.order_by("-created_at", "-pk")[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": [serialize(row) for row in rows],
        "next_cursor": _encode_cursor(rows[-1].created_at, rows[-1].pk) if more and rows else None,
    }


class RunFilters(Schema):
    status: Literal["running", "interrupted", "completed", "failed", "abandoned"] | None = None
    # No U+0000: PostgreSQL cannot compare text with it, and no key contains one.
    run_key: str | None = Field(None, pattern=NO_NUL)
    restart_ready: bool | None = None
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = Field(None, pattern=CURSOR_PATTERN)


class EffectFilters(Schema):
    run_id: UUID | None = None
    status: (
        Literal[
            "pending",
            "awaiting_approval",
            "approved",
            "rejected",
            "expired",
            "in_flight",
            "done",
            "failed",
            "unknown",
        ]
        | None
    ) = None
    key: str | None = Field(None, pattern=NO_NUL)
    tool: str | None = Field(None, pattern=NO_NUL)
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = Field(None, pattern=CURSOR_PATTERN)


class ToolFilters(Schema):
    name: str | None = Field(None, pattern=NO_NUL)
    state: Literal["registered", "confirmed", "changed"] | None = None
    limit: int = Field(50, ge=1, le=200)
    cursor: str | None = Field(None, pattern=CURSOR_PATTERN)


def _unknown_params(request, filters: type[Schema]):
    """Refuse unknown query parameters (a typo must not silently list everything) and
    repeated ones (each takes one value, as the schema says; ninja kept only one)."""
    unknown = sorted(set(request.GET) - set(filters.model_fields))
    if unknown:
        return error_response(
            400,
            "invalid_request",
            "Unknown query parameters: " + ", ".join(unknown) + ".",
            {"fields": {name: "unknown parameter" for name in unknown}},
        )
    repeated = sorted(name for name, values in request.GET.lists() if len(values) > 1)
    if repeated:
        return error_response(
            400,
            "invalid_request",
            "Query parameters given more than once: " + ", ".join(repeated) + ".",
            {"fields": {name: "given more than once" for name in repeated}},
        )
    return None


# --- OpenAPI links ---------------------------------------------------------------------
# How the answers feed the next requests (OpenAPI 3 "links"): a start's run id and
# attempt number drive its heartbeat, calls and finish; a call's effect id drives
# the poll, claim, complete and reconcile. Documentation for client authors, and
# the map schemathesis' stateful tests walk (tests/test_api_stateful.py).

_RUN_ID = {"run_id": "$response.body#/run/id"}
_ATTEMPT = "$response.body#/attempt/number"


def _links(status: int | tuple[int, ...], links: dict) -> dict:
    statuses = status if isinstance(status, tuple) else (status,)
    # Integer keys, as ninja's own responses have: ninja merges openapi_extra into
    # them key by key, and a "200" beside 200 would be written twice into the JSON
    # (a duplicated key, which Swagger UI refuses to render).
    return {"responses": {code: {"links": links} for code in statuses}}


START_LINKS = _links(
    (200, 201),
    {
        "GetRun": {"operationId": "runs_api_get_run", "parameters": _RUN_ID},
        "Heartbeat": {
            "operationId": "runs_api_heartbeat",
            "parameters": _RUN_ID,
            "requestBody": {"attempt": _ATTEMPT},
        },
        "RecordCall": {
            "operationId": "runs_api_record_call",
            "parameters": _RUN_ID,
            "requestBody": {
                "attempt": _ATTEMPT,
                "kind": "effect",
                "tool": "send_email",
                "key": "outlook:message:1",
                "key_source": "provider",
                "args": {"subject": "Hello"},
            },
        },
        "Finish": {
            "operationId": "runs_api_finish",
            "parameters": _RUN_ID,
            "requestBody": {"attempt": _ATTEMPT, "outcome": "completed"},
        },
        "ListEffectsOfRun": {
            "operationId": "runs_api_list_effects",
            "parameters": {"run_id": "$response.body#/run/id"},
        },
    },
)

_EFFECT_ID = {"effect_id": "$response.body#/effect/id"}
_HOLDER = {"run_id": "$request.path.run_id", "attempt": "$request.body#/attempt"}
CALL_LINKS = _links(
    201,
    {
        "PollEffect": {"operationId": "runs_api_poll_effect", "parameters": _EFFECT_ID},
        "ClaimEffect": {
            "operationId": "runs_api_claim",
            "parameters": _EFFECT_ID,
            "requestBody": _HOLDER,
        },
        "CompleteEffect": {
            "operationId": "runs_api_complete",
            "parameters": _EFFECT_ID,
            "requestBody": {**_HOLDER, "outcome": "done", "result": {"id": "sent-1"}},
        },
        "ReconcileEffect": {
            "operationId": "runs_api_reconcile",
            "parameters": _EFFECT_ID,
            "requestBody": {**_HOLDER, "outcome": "done", "evidence": "found in sent items"},
        },
    },
)


# --- Runs ------------------------------------------------------------------------------


@api.post(
    "/runs",
    response={200: StartOut, 201: StartOut, **ERRORS},
    summary="Start a run, or start it again",
    tags=["runs"],
    openapi_extra=START_LINKS,
)
def start_run(request, payload: StartIn):
    """A new `run_key` creates the run and attempt 1 (201). An existing one is a restart:
    decided by the verdict or an operator's override (200), or refused with
    `restart_blocked`, `already_running` (with `details.attempt` and
    `details.heartbeat_at`) or `run_finished`. `title`, `input`, `restart_policy`,
    `heartbeat_timeout` and `restart_url` are fixed by the first start."""
    started = lifecycle.start_run(
        _agent(request),
        payload.run_key,
        title=payload.title or "",
        input=payload.input,
        restart_policy=payload.restart_policy,
        heartbeat_timeout=payload.heartbeat_timeout,
        restart_url=payload.restart_url,
        supersede=payload.supersede,
        agent_version=payload.agent_version,
        savepoint=False,
    )
    return Status(201 if started.created else 200, _whole_run(started.run, started.attempt))


@api.get("/runs", response={200: RunPage, **ERRORS}, summary="The agent's runs", tags=["runs"])
def list_runs(request, filters: Query[RunFilters]):
    """Newest first; filter by `status`, `run_key`, `restart_ready=true`."""
    unknown = _unknown_params(request, RunFilters)
    if unknown:
        return unknown
    runs = Run.objects.filter(agent=_agent(request))
    if filters.status:
        runs = runs.filter(status=filters.status)
    if filters.run_key is not None:
        runs = runs.filter(run_key=filters.run_key)
    if filters.restart_ready is not None:
        runs = runs.filter(restart_ready=filters.restart_ready)
    return _page(runs, filters.limit, filters.cursor, run_dict)


@api.get(
    "/runs/{run_id}",
    response={200: RunDetailOut, **ERRORS},
    summary="A run with its attempts, verdict, journal and effects",
    tags=["runs"],
)
def get_run(request, run_id: UUID):
    run = _run_of(request, run_id)
    body = _whole_run(run)
    body["attempts"] = [attempt_dict(a) for a in run.attempts.order_by("number")]
    return body


@api.post(
    "/runs/{run_id}/heartbeat",
    response={200: RunOnlyOut, **ERRORS},
    summary="Keep the running attempt alive",
    tags=["runs"],
)
def heartbeat(request, run_id: UUID, payload: AttemptIn):
    """`409 attempt_superseded` (or `run_finished`) tells an attempt that is no longer
    running to stop."""
    run = lifecycle.heartbeat(_agent(request), run_id, attempt=payload.attempt)
    return {"run": run_dict(run)}


@api.post(
    "/runs/{run_id}/finish",
    response={200: RunOnlyOut, **ERRORS},
    summary="Finish the attempt and the run as completed or failed",
    tags=["runs"],
)
def finish(request, run_id: UUID, payload: FinishIn):
    """Effects still in flight under this attempt become `unknown`."""
    run = lifecycle.finish_run(
        _agent(request),
        run_id,
        attempt=payload.attempt,
        outcome=payload.outcome,
        error=payload.error,
        savepoint=False,
    )
    return {"run": run_dict(run)}


@api.post(
    "/runs/{run_id}/calls",
    response={201: RecordOut, **ERRORS},
    summary="Record a tool call before making it",
    tags=["runs"],
    openapi_extra=CALL_LINKS,
)
def record_call(request, run_id: UUID, payload: CallIn):
    """Answers the action: `execute` (you hold the claim: perform `effect.args`, then
    complete), `skip` (done: `effect.result`), `wait` (poll), `review` (outcome
    unknown: poll), `blocked` (never perform it). The first call naming a key
    declares `needs_approval`, `approvals_required`, `timeout`, `approval_ttl` and
    `preview`; later calls cannot change them. `approvals_required` above 1 needs
    `needs_approval`. The same key for another tool is `409 key_conflict`."""
    if payload.kind == "read":
        recorded = calls.record_call(
            _agent(request),
            run_id,
            attempt=payload.attempt,
            tool=payload.tool,
            kind="read",
            args=payload.args,
            savepoint=False,
        )
    else:
        if payload.key is not None and payload.key_source is None:
            return error_response(
                400,
                "invalid_request",
                "key_source is required with key.",
                {"fields": {"key_source": "required with key"}},
            )
        recorded = calls.record_call(
            _agent(request),
            run_id,
            attempt=payload.attempt,
            tool=payload.tool,
            kind="effect",
            args=payload.args,
            key=payload.key,
            key_source=payload.key_source if payload.key is not None else None,
            needs_approval=payload.needs_approval,
            approvals_required=payload.approvals_required if payload.needs_approval else 1,
            preview=payload.preview or "",
            approval_ttl=payload.approval_ttl,
            timeout=payload.timeout,
            savepoint=False,
        )
    return _hot_answer(
        request,
        201,
        {
            "call": call_dict(recorded.call),
            "action": recorded.action,
            "effect": effect_dict(recorded.effect) if recorded.effect is not None else None,
        },
    )


# --- Effects ---------------------------------------------------------------------------


@api.get(
    "/effects/{effect_id}",
    response={200: EffectActionOut, 304: None, **ERRORS},
    summary="The approval poll",
    tags=["effects"],
    # The poll authenticates itself: the token and the effect are one statement
    # (runs/api/poll.py). The schema still shows the bearer token it requires.
    auth=None,
    openapi_extra={"security": [{"AgentToken": []}]},
)
def poll_effect(request, effect_id: UUID):
    """One indexed lookup, no writes. The action is `claim`, `skip`, `wait`, `review` or
    `blocked` (never `execute`). Send the `ETag` back as `If-None-Match` to get `304`
    with no body while nothing changed."""
    return poll_response(request, effect_id)


@api.get(
    "/effects",
    response={200: EffectPage, **ERRORS},
    summary="The agent's effects",
    tags=["effects"],
)
def list_effects(request, filters: Query[EffectFilters]):
    """Newest first; `run_id` lists the effects that run's calls point to."""
    unknown = _unknown_params(request, EffectFilters)
    if unknown:
        return unknown
    effects = Effect.objects.filter(agent=_agent(request))
    if filters.run_id:
        effects = effects.filter(calls__run_id=filters.run_id).distinct()
    if filters.status:
        effects = effects.filter(status=filters.status)
    if filters.key is not None:
        effects = effects.filter(key=filters.key)
    if filters.tool is not None:
        effects = effects.filter(tool=filters.tool)
    return _page(effects, filters.limit, filters.cursor, effect_dict)


@api.post(
    "/effects/{effect_id}/claim",
    response={200: EffectActionOut, **ERRORS},
    summary="Claim a released effect",
    tags=["effects"],
)
def claim(request, effect_id: UUID, payload: ClaimIn):
    """The run must have recorded a call to the effect (else `claim_conflict`) and the
    attempt must be running (else `attempt_superseded`). A `pending`, `approved` or
    `failed` effect is claimed (`execute`); otherwise the current action is returned."""
    effect, action = outcomes.claim_effect(
        _agent(request),
        effect_id,
        run_id=payload.run_id,
        attempt=payload.attempt,
        savepoint=False,
    )
    return {"effect": effect_dict(effect), "action": action}


@api.post(
    "/effects/{effect_id}/complete",
    response={200: EffectOnlyOut, **ERRORS},
    summary="Report what happened",
    tags=["effects"],
)
def complete(request, effect_id: UUID, payload: CompleteIn):
    """From the attempt that holds the claim, even after it stopped (the effect is
    `unknown`): the truth is recorded. A repeated `done` keeps the first result. Any
    other report is `409 claim_conflict`, and is still kept for operators."""
    effect = outcomes.complete_effect(
        _agent(request),
        effect_id,
        run_id=payload.run_id,
        attempt=payload.attempt,
        outcome=payload.outcome,
        result=payload.result,
        error=payload.error,
        savepoint=False,
    )
    return _hot_answer(request, 200, {"effect": effect_dict(effect)})


@api.post(
    "/effects/{effect_id}/reconcile",
    response={200: EffectActionOut, **ERRORS},
    summary="Settle an unknown outcome with evidence",
    tags=["effects"],
)
def reconcile(request, effect_id: UUID, payload: ReconcileIn):
    """Only for an `unknown` effect, from a running attempt of a run that recorded a
    call to it. `done` records the result; `not_done` releases the effect to be claimed
    again. Only a lookup that sees the provider's latest state may answer `not_done`."""
    effect, action = outcomes.reconcile_effect(
        _agent(request),
        effect_id,
        run_id=payload.run_id,
        attempt=payload.attempt,
        outcome=payload.outcome,
        evidence=payload.evidence,
        result=payload.result,
        savepoint=False,
    )
    return {"effect": effect_dict(effect), "action": action}


# --- Tools -----------------------------------------------------------------------------


@api.post(
    "/tools",
    response={200: ToolsOut, **ERRORS},
    summary="Declare the tools the agent will call",
    tags=["tools"],
    by_alias=True,  # ToolOut's "schema" (a field named apart from BaseModel.schema)
)
def declare_tools(request, payload: ToolsIn):
    """1–500 tools. Registers new tools and records a changed declaration as a change
    (`state: changed`: kept and shown, never adopted where it is looser than the
    declaration in force). Idempotent: the same declaration twice changes nothing.
    Answers each tool with its effective rule, in the order declared. Under the
    agent's `closed` mode a tool that is not registered is `409 tool_not_registered`
    (`details.tool`), and nothing is registered."""
    tools = registry.declare_tools(
        _agent(request),
        [
            {
                "name": tool.name,
                "kind": tool.kind,
                "key_source": tool.key_source,
                "needs_approval": tool.needs_approval,
                "approvals_required": tool.approvals_required,
                "schema": tool.schema_,
                "annotations": tool.annotations,
            }
            for tool in payload.tools
        ],
    )
    return {"tools": [tool_dict(tool) for tool in tools]}


@api.get(
    "/tools",
    response={200: ToolPage, **ERRORS},
    summary="The agent's tools, with their effective rules",
    tags=["tools"],
    by_alias=True,
)
def list_tools(request, filters: Query[ToolFilters]):
    """Newest first; filter by `name`, `state`."""
    unknown = _unknown_params(request, ToolFilters)
    if unknown:
        return unknown
    tools = registry.with_policy(Tool.objects.filter(agent=_agent(request)))
    if filters.name is not None:
        tools = tools.filter(name=filters.name)
    if filters.state:
        tools = tools.filter(state=filters.state)
    return _page(tools, filters.limit, filters.cursor, tool_dict)
