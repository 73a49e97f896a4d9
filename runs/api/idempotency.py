"""The ``Idempotency-Key`` header on every API ``POST`` (api.md, "Request idempotency").

A middleware, so it sees every answer the API gives, validation errors included:
1. A body declared over the 1 MiB limit is ``413``, and a body without a
   ``Content-Length`` (``Transfer-Encoding: chunked``) is ``411 length_required``:
   Django reads only ``Content-Length`` bytes, so it would take such a body as empty.
   Neither reads the body.
2. The token (``agent_for_request``, the API's one token lookup) and the rate are
   checked before the body is read: a client without a valid token cannot hold a
   worker by sending a body slowly (docs/scaling.md, "The proxy").
3. A ``POST`` runs in one transaction, from the token's lookup to its answer (one
   commit). A keyed one takes the key's advisory lock in it before its work
   (PostgreSQL, ``pg_try_advisory_xact_lock``): a concurrent duplicate cannot
   take it and answers ``409 request_in_progress`` at once. The key's kept answer
   is read after the lock, in a statement of its own: its snapshot sees whatever a
   duplicate that held the lock before committed.
4. A repeat with the same key and the same request gets the first answer again;
   another request with that key is ``422 idempotency_key_reused``.
5. Answers below 500 are kept in the same transaction as the work: a connection
   cut between the two can never leave work done without its answer (which a
   retry would do again). A rule that fails dooms the request's transaction (the
   API's rules take no savepoint): it is rolled back, and the error answer kept in
   a short transaction of its own. A 5xx rolls the work back and keeps nothing;
   so does a request that died, and the lock goes with its transaction, so the
   key is free at once. (Rows of the earlier design, claimed before the work,
   still count as in progress until their 60-second lease lapses.)

On SQLite (the embedded default) a write transaction takes the whole database
(``BEGIN IMMEDIATE``), so a duplicate waits for the first and gets its answer;
a POST takes it from its token's lookup on, its body's reading included.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from django.core.exceptions import RequestDataTooBig
from django.db import connection, transaction
from django.http import HttpResponse
from django.utils import timezone

from runs.api.auth import agent_for_request, error_response
from runs.api.ratelimit import rate_limit_refusal, rate_limited_response
from runs.canonical import NotCanonicalizable, canonical_json
from runs.models import Agent, IdempotentRequest

API_PREFIX = "/api/v1/"
MAX_BODY = 1024 * 1024
BODY_METHODS = ("POST", "PUT", "PATCH")
CLAIM_LEASE = timedelta(seconds=60)
RETENTION = timedelta(hours=24)
PRUNE_BATCH = 5_000


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


def _lock_key(token_hash: str, key: str) -> int:
    """The advisory lock's number: 64 bits of SHA-256 over the token's hash and the key.

    Two keys that share it (one chance in 2**64): the second answers 409 while the
    first runs, and the client retries it."""
    digest = hashlib.sha256(f"{token_hash}\n{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def lock_key(agent: Agent, key: str) -> bool:
    """Take the key's lock for this transaction; False when a duplicate holds it.

    Raw SQL: the ORM has no advisory locks. SQLite has none either, and needs none:
    its write transaction holds the whole database (``BEGIN IMMEDIATE``)."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_lock_key(agent.token_hash, key)])
        return cursor.fetchone()[0]


class IdempotencyMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith(API_PREFIX):
            return self.get_response(request)
        unreadable = _unreadable_body(request)
        if unreadable is not None:
            return unreadable
        if request.method not in BODY_METHODS:
            return self.get_response(request)  # the API's auth looks the token up
        if request.method != "POST":
            return _refusal(request) or self.get_response(request)
        # The token, the rate and the body come first, outside any transaction: a
        # client sending its body slowly holds no transaction open (on SQLite, the
        # embedded default, that would be the database's one write lock). The token's
        # lookup is a read-only transaction of its own, which writes no WAL. Then the
        # POST is one transaction from the key's lock to its answer (kept, for a
        # key): one commit. The API's rules run in it without a savepoint of their
        # own (runs/outcomes.py).
        refusal = _refusal(request)
        agent = agent_for_request(request)  # kept on the request: no second query
        if refusal is not None or agent is None:
            return refusal or self.get_response(request)
        key = request.headers.get("Idempotency-Key")
        if key is not None and not _valid_key(key):
            return _invalid_key()
        fingerprint = key and request_fingerprint(request.method, request.path, request.body)
        with transaction.atomic():
            if key is None:
                return self._work(request)
            row, answer = _lock_and_read(agent, key, fingerprint)
            if answer is not None:
                return answer
            response = self._work(request)
            keep = response.status_code < 500 and not getattr(response, "streaming", False)
            if keep and not transaction.get_rollback():
                _keep_answer(agent, key, request, fingerprint, row, response)
                return response
            transaction.set_rollback(True)  # _work did, but for a streaming answer
        # Rolled back. After a 5xx nothing is kept: the retry runs it anew.
        return _keep_apart(agent, key, request, fingerprint, response) if keep else response

    def _work(self, request) -> HttpResponse:
        """The view's answer; its work rolled back after a 5xx, or when a rule failed
        (without a savepoint, a rule's failure dooms the request's transaction)."""
        response = self.get_response(request)
        if response.status_code >= 500 or transaction.get_rollback():
            transaction.set_rollback(True)
        return response


def _keep_apart(agent: Agent, key: str, request, fingerprint: str, response: HttpResponse):
    """Keep the answer of a rule that failed, in a short transaction of its own.

    The API's rules take no savepoint (runs/outcomes.py says why): a rule that
    fails dooms the request's transaction, which is rolled back with its writes.
    The key's lock went with it, so a duplicate may have run meanwhile: then its
    answer is the key's (or a 409 while it runs). Errors are rare."""
    with transaction.atomic():
        row, answer = _lock_and_read(agent, key, fingerprint)
        if answer is not None:
            return answer
        _keep_answer(agent, key, request, fingerprint, row, response)
    return response


def _lock_and_read(agent: Agent, key: str, fingerprint: str):
    """Take the key's lock, then read its row (a statement after the lock: see 3.
    above): the row, and the answer from the key alone (None: the request runs)."""
    locked = lock_key(agent, key)
    row = _kept(agent, key)
    return row, _answer_from_key(row, key, fingerprint, locked)


def _refusal(request) -> HttpResponse | None:
    """What refuses an API request with a body before its work, from the token, the
    rate and the body's size, in this order; None for a request to run. The token
    is looked up (``agent_for_request``, kept on the request) before the body is
    read. Without a valid one this is None too: the API's auth answers 401."""
    agent = agent_for_request(request)
    if agent is None:
        return None
    # Counted before the work: a refused request must not become the key's kept
    # answer, or the client's retry would meet its 429 forever.
    refusal = rate_limit_refusal(request, agent)
    if refusal is not None:
        return rate_limited_response(refusal)
    # The token is good: only now is the body read.
    if _body_over_limit(request):
        return _too_large()
    return None


def _kept(agent: Agent, key: str) -> IdempotentRequest | None:
    """The key's row, if any. By get(): (agent, key) is unique, so no ORDER BY to
    compile and sort, as first() would add."""
    try:
        return IdempotentRequest.objects.get(agent=agent, key=key)
    except IdempotentRequest.DoesNotExist:
        return None


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


def _keep_answer(agent, key, request, fingerprint, row, response: HttpResponse) -> None:
    """Keep the answer with the work: a new row, or the answer on a lapsed claim's row
    (the key's lock is held, so no one else writes either)."""
    now = timezone.now()
    if row is not None:
        IdempotentRequest.objects.filter(pk=row.pk).update(
            response_status=response.status_code,
            response_body=response.content,
            completed_at=now,
        )
        return
    IdempotentRequest.objects.create(
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


def _invalid_key() -> HttpResponse:
    return error_response(
        400,
        "invalid_request",
        "The Idempotency-Key header must be 1 to 255 printable characters.",
        {"fields": {"Idempotency-Key": "1 to 255 printable characters"}},
    )


def _too_large() -> HttpResponse:
    return error_response(
        413, "payload_too_large", "The request body is over the 1 MiB limit.", {"limit": MAX_BODY}
    )


def prune_idempotent_requests(now=None, batch: int | None = None) -> int:
    """Forget answers older than the retention (24 hours); returns how many.

    In batches of ``batch`` rows, each its own short transaction: a day of keys can
    be millions of rows, and one ``DELETE`` of them all would hold its locks and
    its WAL for as long as it takes. A batch is the oldest rows by ``created_at``
    (its index), deleted by primary key; ``batch`` is ``PRUNE_BATCH`` unless given."""
    cutoff = (now or timezone.now()) - RETENTION
    batch = batch or PRUNE_BATCH
    old = IdempotentRequest.objects.filter(created_at__lt=cutoff).order_by("created_at")
    total = 0
    while True:
        ids = list(old.values_list("pk", flat=True)[:batch])
        if not ids:
            return total
        total += IdempotentRequest.objects.filter(pk__in=ids).delete()[0]
