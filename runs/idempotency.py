"""The ``Idempotency-Key`` header on every API ``POST`` (api.md, "Request idempotency").

A middleware, so it sees every answer the API gives, validation errors included:
1. A body declared over the 1 MiB limit is ``413``, and a body without a
   ``Content-Length`` (``Transfer-Encoding: chunked``) is ``411 length_required``:
   Django reads only ``Content-Length`` bytes, so it would take such a body as empty.
   Neither reads the body.
2. The token is checked before the body is read: a client without a valid token
   cannot hold a worker by sending a body slowly (docs/scaling.md, "The proxy").
3. The request runs in one transaction that first takes the key's advisory lock
   (PostgreSQL, ``pg_try_advisory_xact_lock``): a concurrent duplicate cannot take
   it and answers ``409 request_in_progress`` at once. The same statement resolves
   the token and reads the key's kept answer (docs/performance.md: one round trip
   where a committed claim row took two, and a commit); the body is read after it.
4. A repeat with the same key and the same request gets the first answer again;
   another request with that key is ``422 idempotency_key_reused``.
5. Answers below 500 are kept in the same transaction as the work: a connection
   cut between the two can never leave work done without its answer (which a
   retry would do again). A 5xx rolls the work back and keeps nothing; so does a
   request that died, and the lock goes with its transaction, so the key is free
   at once. (Rows of the earlier design, claimed before the work, still count as
   in progress until their 60-second lease lapses.)

On SQLite (the embedded default) a write transaction takes the whole database
(``BEGIN IMMEDIATE``), so a duplicate waits for the first and gets its answer.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.core.exceptions import RequestDataTooBig
from django.db import IntegrityError, connection, transaction
from django.http import HttpResponse
from django.utils import timezone

from runs.api_auth import (
    AGENT_COLUMNS,
    agent_for_request,
    agent_from_row,
    bearer_token,
    error_response,
    remember_agent,
)
from runs.canonical import NotCanonicalizable, canonical_json
from runs.lifecycle import request_transaction
from runs.models import Agent, IdempotentRequest, hash_token
from runs.ratelimit import RateLimited, check_rate_limit, rate_limited_response

API_PREFIX = "/api/v1/"
MAX_BODY = 1024 * 1024
BODY_METHODS = ("POST", "PUT", "PATCH")
CLAIM_LEASE = timedelta(seconds=60)
RETENTION = timedelta(hours=24)


def request_fingerprint(method: str, path: str, body: bytes) -> str:
    """Method, path and body; the body compared as canonical JSON when it is JSON."""
    try:
        normalized = canonical_json(json.loads(body)) if body else b""
    except (ValueError, NotCanonicalizable, RecursionError):
        normalized = body
    digest = hashlib.sha256()
    digest.update(f"{method} {path}\n".encode())
    digest.update(normalized)
    return digest.hexdigest()


def _valid_key(key: str) -> bool:
    return 1 <= len(key) <= 255 and key.isprintable()


_KEPT_COLUMNS = (
    "id",
    "request_hash",
    "response_status",
    "response_body",
    "completed_at",
    "locked_until",
)
_AGENT_AND_KEY_SQL = (
    f"SELECT {', '.join(f'a.{c}' for c in AGENT_COLUMNS)}, pg_try_advisory_xact_lock(%s), "
    f"{', '.join(f'k.{c}' for c in _KEPT_COLUMNS)} "
    f"FROM {Agent._meta.db_table} a LEFT JOIN {IdempotentRequest._meta.db_table} k "
    "ON k.agent_id = a.id AND k.key = %s WHERE a.token_hash = %s AND a.is_active"
)


def _lock_key(token_hash: str, key: str) -> int:
    """The advisory lock's number: 64 bits of SHA-256 over the token's hash and the key.

    Two keys that share it (one chance in 2**64): the second answers 409 while the
    first runs, and the client retries it."""
    digest = hashlib.sha256(f"{token_hash}\n{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def agent_and_key(request, key: str) -> tuple[Agent | None, bool, IdempotentRequest | None]:
    """The request's agent, whether this transaction holds the key's lock, and the
    key's row if there is one. Call it inside the request's transaction."""
    if connection.vendor != "postgresql":
        agent = agent_for_request(request)
        if agent is None:
            return None, False, None
        return agent, True, IdempotentRequest.objects.filter(agent=agent, key=key).first()
    token = bearer_token(request)
    if token is None or len(token) > 200 or not token.isprintable():
        return agent_for_request(request), False, None  # None: the API answers 401
    digest = hash_token(token)
    with connection.cursor() as cursor:
        cursor.execute(_AGENT_AND_KEY_SQL, [_lock_key(digest, key), key, digest])
        row = cursor.fetchone()
    if row is None:
        remember_agent(request, None)
        return None, False, None
    agent = agent_from_row(row)
    if not agent.token_matches(token):
        remember_agent(request, None)
        return None, False, None
    remember_agent(request, agent)
    n = len(AGENT_COLUMNS)
    locked, kept = row[n], row[n + 1 :]
    if kept[0] is None:
        return agent, locked, None
    return agent, locked, IdempotentRequest.from_db(connection.alias, _KEPT_COLUMNS, kept)


class IdempotencyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        unreadable = _unreadable_body(request)
        if unreadable is not None:
            return unreadable
        key = request.headers.get("Idempotency-Key")
        if request.method != "POST" or key is None:
            return self._unkeyed(request)
        if not _valid_key(key):
            return self._invalid_key(request)
        try:
            with transaction.atomic():
                agent, locked, row = agent_and_key(request, key)
                refused = self._refused(request, agent)
                if refused is not None:
                    return refused
                # The token is good: only now is the body read.
                if _body_over_limit(request):
                    return _too_large()
                fingerprint = request_fingerprint(request.method, request.path, request.body)
                answer = _answer_from_key(row, key, fingerprint, locked)
                if answer is not None:
                    return answer
                with request_transaction():
                    response = self.get_response(request)
                if response.status_code >= 500 or getattr(response, "streaming", False):
                    raise _NotKept(response)  # roll the work back: nothing is kept
                if connection.needs_rollback:
                    # A rule failed (its error is the answer); it ran without a
                    # savepoint, so the request rolls back, and its answer is kept after.
                    raise _RolledBack(response)
                _keep_answer(agent, key, request, fingerprint, row, response)
        except _NotKept as not_kept:
            return not_kept.response
        except _RolledBack as rolled_back:
            try:
                _keep_answer(agent, key, request, fingerprint, row, rolled_back.response)
            except _KeyTaken:
                return self._kept_answer(request, key, fingerprint)
            return rolled_back.response
        except _KeyTaken:
            # A duplicate committed between this transaction's first read and its
            # lock: this work was rolled back, and the first answer is the answer.
            return self._kept_answer(request, key, fingerprint)
        return response

    def _unkeyed(self, request) -> HttpResponse:
        """A request without a key: the API answers it (401 first, before it parses the
        body); a body is read here only for a token that the API will accept."""
        # Not for a GET: the poll resolves its token in its own statement (api_poll.py).
        # The agent is cached on the request: the API's auth asks no second query.
        has_body = request.method in BODY_METHODS
        if has_body and agent_for_request(request) is not None and _body_over_limit(request):
            return _too_large()
        return self.get_response(request)

    @staticmethod
    def _kept_answer(request, key: str, fingerprint: str) -> HttpResponse:
        row = IdempotentRequest.objects.filter(agent=agent_for_request(request), key=key).first()
        return _answer_from_key(row, key, fingerprint, locked=False)

    def _refused(self, request, agent) -> HttpResponse | None:
        """The API's 401 without an agent, or 429 over the rate; None to go on.

        Counted before the work: a refused request must not become the key's kept
        answer, or the client's retry would meet its 429 forever."""
        if agent is None:
            return self.get_response(request)  # the API answers 401
        try:
            check_rate_limit(request, agent)
        except RateLimited as exc:
            return rate_limited_response(exc)
        return None

    def _invalid_key(self, request) -> HttpResponse:
        """400, after the checks every request meets first (the token, the rate)."""
        refused = self._refused(request, agent_for_request(request))
        if refused is not None:
            return refused
        return error_response(
            400,
            "invalid_request",
            "The Idempotency-Key header must be 1 to 255 printable characters.",
            {"fields": {"Idempotency-Key": "1 to 255 printable characters"}},
        )


def _answer_from_key(row, key: str, fingerprint: str, locked: bool) -> HttpResponse | None:
    """What a request answers from its key alone: the kept answer, 422 or 409; None
    when the request is to run."""
    if row is not None and row.request_hash != fingerprint:
        return error_response(
            422,
            "idempotency_key_reused",
            "This Idempotency-Key was used before with a different request.",
            {"idempotency_key": key},
        )
    if row is not None and row.completed_at is not None:
        response = HttpResponse(
            bytes(row.response_body or b""),
            status=row.response_status,
            content_type="application/json",
        )
        response["Idempotent-Replayed"] = "true"
        return response
    lease_lapsed = row is None or row.locked_until <= timezone.now()
    if locked and lease_lapsed:
        return None
    response = error_response(
        409,
        "request_in_progress",
        "A request with this Idempotency-Key is still being processed: retry later.",
        {"idempotency_key": key},
    )
    response["Retry-After"] = "1"
    return response


_KEEP_SQL = (
    f"UPDATE {IdempotentRequest._meta.db_table} "
    "SET response_status = %s, response_body = %s, completed_at = %s "
    "WHERE id = %s AND completed_at IS NULL"
)


def _keep_answer(agent, key, request, fingerprint, row, response: HttpResponse) -> None:
    """Keep the answer with the work: a new row, or the answer on a lapsed claim's row."""
    now = timezone.now()
    if row is not None:
        meta = IdempotentRequest._meta
        params = [
            response.status_code,
            meta.get_field("response_body").get_db_prep_save(response.content, connection),
            meta.get_field("completed_at").get_db_prep_save(now, connection),
            row.pk,
        ]
        with connection.cursor() as cursor:
            cursor.execute(_KEEP_SQL, params)
            if cursor.rowcount == 0:
                raise _KeyTaken  # a duplicate answered the lapsed claim first
        return
    kept = IdempotentRequest(
        agent=agent,
        key=key,
        method=request.method,
        path=request.path[:500],
        request_hash=fingerprint,
        response_status=response.status_code,
        response_body=response.content,
        created_at=now,
        completed_at=now,
        locked_until=now,
    )
    try:
        kept.save(force_insert=True)
    except IntegrityError as exc:
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) not in (
            None,
            _KEY_UNIQUE,
        ):
            raise  # not the key's constraint
        raise _KeyTaken from None


# The one constraint whose violation means a duplicate kept its answer first.
_KEY_UNIQUE = next(
    c.name
    for c in IdempotentRequest._meta.constraints
    if tuple(getattr(c, "fields", ())) == ("agent", "key")
)


class _NotKept(Exception):  # noqa: N818 - a signal, not an error
    def __init__(self, response: HttpResponse) -> None:
        self.response = response


class _KeyTaken(Exception):  # noqa: N818 - a signal, not an error
    pass


class _RolledBack(Exception):  # noqa: N818 - a signal, not an error
    def __init__(self, response: HttpResponse) -> None:
        self.response = response


def _unreadable_body(request) -> HttpResponse | None:
    """413 for a body declared over the limit, 411 for one without ``Content-Length``:
    both from the headers alone, without reading the body."""
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > MAX_BODY:
        return _too_large()
    if "HTTP_TRANSFER_ENCODING" in request.META and not request.META.get("CONTENT_LENGTH"):
        # gunicorn passes a chunked body on, but Django reads only CONTENT_LENGTH bytes:
        # without this answer the body would be taken as empty (issue 15).
        return error_response(
            411,
            "length_required",
            "A request body must come with a Content-Length header (no chunked bodies).",
        )
    return None


def _body_over_limit(request) -> bool:
    """The body as read is over the limit (a body whose Content-Length said less
    cannot be: Django reads no more than it said; this is for servers that pass a
    body without one, such as an ASGI server over HTTP/2)."""
    if request.method not in BODY_METHODS:
        return False
    try:
        return len(request.body) > MAX_BODY
    except RequestDataTooBig:
        return True


def _too_large() -> HttpResponse:
    return error_response(
        413, "payload_too_large", "The request body is over the 1 MiB limit.", {"limit": MAX_BODY}
    )


def prune_idempotent_requests(now=None) -> int:
    """Forget answers older than the retention (24 hours); returns how many."""
    now = now or timezone.now()
    deleted, _ = IdempotentRequest.objects.filter(created_at__lt=now - RETENTION).delete()
    return deleted
