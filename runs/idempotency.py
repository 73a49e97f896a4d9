"""The ``Idempotency-Key`` header on every API ``POST`` (api.md, "Request idempotency").

A middleware, so it sees every answer the API gives, validation errors included:
1. The body is checked against the 1 MiB limit before anything parses it.
2. The key is claimed in its own committed row before the work, so a concurrent
   duplicate finds it at once and answers ``409 request_in_progress``.
3. A repeat with the same key and the same request gets the first answer again;
   another request with that key is ``422 idempotency_key_reused``.
4. Answers below 500 are kept, in the same transaction as the work: a connection
   cut between the two can never leave work done without its answer (which a
   retry would do again). A 5xx rolls the work back and frees the key; so does a
   request that died, or its claim lapses after 60 seconds.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, connection, transaction
from django.http import HttpResponse
from django.utils import timezone

from runs.api_auth import agent_for_request, error_response
from runs.canonical import NotCanonicalizable, canonical_json
from runs.models import Agent, IdempotentRequest
from runs.ratelimit import RateLimited, check_rate_limit, rate_limited_response

API_PREFIX = "/api/v1/"
MAX_BODY = 1024 * 1024
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


_CLAIM_FIELDS = [
    ("agent", "agent_id"),
    ("key", "key"),
    ("method", "method"),
    ("path", "path"),
    ("request_hash", "request_hash"),
    ("created_at", "created_at"),
    ("locked_until", "locked_until"),
]
_CLAIM_SQL = (
    f"INSERT INTO {IdempotentRequest._meta.db_table} "
    "(agent_id, key, method, path, request_hash, created_at, locked_until) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (agent_id, key) DO NOTHING RETURNING id"
)


def _insert_claim(row: IdempotentRequest) -> bool:
    """Insert the claim unless the key is taken; whether it was inserted.

    One statement, committed on its own (autocommit): a concurrent duplicate must
    see the claim at once. ``ON CONFLICT DO NOTHING`` instead of catching the
    unique violation saves the transaction and savepoint round trips, and the
    constant SQL the ORM's compiler (a third of a write request's statements are
    this claim and its answer; docs/performance.md).
    """
    # Each value as its field writes it on this database (a UUID is text on SQLite).
    params = [
        IdempotentRequest._meta.get_field(name).get_db_prep_save(getattr(row, attname), connection)
        for name, attname in _CLAIM_FIELDS
    ]
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, params)
        inserted = cursor.fetchone()
    if inserted is None:
        return False
    row.pk = inserted[0]
    row._state.adding = False
    return True


def claim_key(agent: Agent, key: str, method: str, path: str, fingerprint: str):
    """Claim ``key`` for this request. Returns (row, outcome) with outcome one of
    ``new``, ``replay``, ``reused`` or ``in_progress``."""
    now = timezone.now()
    for _ in range(3):
        row = IdempotentRequest(
            agent=agent,
            key=key,
            method=method,
            path=path[:500],
            request_hash=fingerprint,
            created_at=now,
            locked_until=now + CLAIM_LEASE,
        )
        if _insert_claim(row):
            return row, "new"
        row = IdempotentRequest.objects.filter(agent=agent, key=key).first()
        if row is None:
            continue  # freed in between: try the insert again
        if row.request_hash != fingerprint:
            return row, "reused"
        if row.completed_at is not None:
            return row, "replay"
        if row.locked_until > now:
            return row, "in_progress"
        # The request that claimed it died: take its claim over (compare-and-set).
        taken = IdempotentRequest.objects.filter(
            pk=row.pk, completed_at__isnull=True, locked_until=row.locked_until
        ).update(locked_until=now + CLAIM_LEASE, created_at=now)
        return row, "new" if taken else "in_progress"
    return None, "in_progress"


class IdempotencyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        too_large = self._body_too_large(request)
        if too_large is not None:
            return too_large
        key = request.headers.get("Idempotency-Key")
        if request.method != "POST" or key is None:
            return self.get_response(request)
        agent = agent_for_request(request)
        if agent is None:
            return self.get_response(request)  # the API answers 401
        try:
            # Counted before the key is claimed: a refused request must not become the
            # key's stored answer, or the client's retry would meet its 429 forever.
            check_rate_limit(request, agent)
        except RateLimited as exc:
            return rate_limited_response(exc)
        if not _valid_key(key):
            return error_response(
                400,
                "invalid_request",
                "The Idempotency-Key header must be 1 to 255 printable characters.",
                {"fields": {"Idempotency-Key": "1 to 255 printable characters"}},
            )
        fingerprint = request_fingerprint(request.method, request.path, request.body)
        row, outcome = claim_key(agent, key, request.method, request.path, fingerprint)
        if outcome == "replay":
            response = HttpResponse(
                bytes(row.response_body or b""),
                status=row.response_status,
                content_type="application/json",
            )
            response["Idempotent-Replayed"] = "true"
            return response
        if outcome == "reused":
            return error_response(
                422,
                "idempotency_key_reused",
                "This Idempotency-Key was used before with a different request.",
                {"idempotency_key": key},
            )
        if outcome == "in_progress":
            response = error_response(
                409,
                "request_in_progress",
                "A request with this Idempotency-Key is still being processed: retry later.",
                {"idempotency_key": key},
            )
            response["Retry-After"] = "1"
            return response
        try:
            with transaction.atomic():
                response = self.get_response(request)
                if response.status_code >= 500 or getattr(response, "streaming", False):
                    raise _NotKept(response)  # roll the work back with the answer
                _keep_answer(row.pk, response)
        except _NotKept as not_kept:
            _free_claim(row.pk)
            return not_kept.response
        except BaseException:
            _free_claim(row.pk)
            raise
        return response

    @staticmethod
    def _body_too_large(request) -> HttpResponse | None:
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > MAX_BODY:
            return _too_large()
        if request.method in ("POST", "PUT", "PATCH"):
            try:
                if len(request.body) > MAX_BODY:
                    return _too_large()
            except RequestDataTooBig:
                return _too_large()
        return None


_KEEP_SQL = (
    f"UPDATE {IdempotentRequest._meta.db_table} "
    "SET response_status = %s, response_body = %s, completed_at = %s WHERE id = %s"
)


def _keep_answer(pk: int, response: HttpResponse) -> None:
    """The answer, kept with the work (constant SQL, as the claim)."""
    meta = IdempotentRequest._meta
    params = [
        response.status_code,
        meta.get_field("response_body").get_db_prep_save(response.content, connection),
        meta.get_field("completed_at").get_db_prep_save(timezone.now(), connection),
        pk,
    ]
    with connection.cursor() as cursor:
        cursor.execute(_KEEP_SQL, params)


class _NotKept(Exception):  # noqa: N818 - a signal, not an error
    def __init__(self, response: HttpResponse) -> None:
        self.response = response


def _free_claim(pk: int) -> None:
    """Free the key of a request whose answer is not kept, so its retry runs at once.

    The request may have failed because its database connection was cut: then the
    delete goes through a fresh connection. Only an unanswered claim is freed: if
    the commit went through before the connection died, the kept answer stays and
    the retry gets it. If even that fails, the claim lapses after ``CLAIM_LEASE``.
    """
    for _ in range(3):
        try:
            IdempotentRequest.objects.filter(pk=pk, completed_at__isnull=True).delete()
            return
        except DatabaseError:
            connection.close()  # a dead connection: the next query takes a new one


def _too_large() -> HttpResponse:
    return error_response(
        413, "payload_too_large", "The request body is over the 1 MiB limit.", {"limit": MAX_BODY}
    )


def prune_idempotent_requests(now=None) -> int:
    """Forget answers older than the retention (24 hours); returns how many."""
    now = now or timezone.now()
    deleted, _ = IdempotentRequest.objects.filter(created_at__lt=now - RETENTION).delete()
    return deleted
