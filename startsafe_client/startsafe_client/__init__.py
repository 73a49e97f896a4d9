"""startsafe_client: journal an agent's tool calls with startsafe, keyed by stable intent.

::

    from startsafe_client import Client, effect, provider_key

    client = Client("http://127.0.0.1:8000", token)

    @client.tool(effect(key=lambda a: provider_key("outlook", "message", a["message_id"])))
    def send_reply(message_id: str, body: str) -> dict: ...

    with client.run("ticket-4812", supersede="stale") as run:
        run.call(send_reply, message_id=msg_id, body=text)

:class:`AsyncClient` is the same client for ``asyncio`` (``async with client.run(...)``,
``await run.call(...)``); both drive one protocol core
(:mod:`startsafe_client.protocol`, :mod:`startsafe_client.attempt`).

**An exception is not proof that nothing happened**: an effect's tool that raises
leaves the effect's outcome unknown (not reported); only :class:`NotPerformed`
reports it ``failed`` so that it runs again.

For framework adapters: declare tools with :func:`read` / :func:`effect`, journal
each call with ``run.call_spec(name, spec, args, perform)``, hand ``for_model`` of
the exceptions it raises back to the model, and :func:`from_result` on a result.

Importable without Django or any agent framework; its only dependency is
``httpx``. See the README's section "For agent developers".
"""

from __future__ import annotations

from .aio import AsyncClient, AsyncRun
from .client import Client
from .errors import (
    AlreadyRunning,
    ApprovalTimeout,
    AttemptStopped,
    AttemptSuperseded,
    ClaimConflict,
    EffectBlocked,
    EffectError,
    IdempotencyKeyReused,
    InvalidRequest,
    KeyConflict,
    KeyRefused,
    NotFound,
    NotPerformed,
    OutcomeUnknown,
    PayloadTooLarge,
    RateLimited,
    RequestInProgress,
    RestartBlocked,
    RunFinished,
    ServiceUnavailable,
    StartsafeError,
    ToolNotRegistered,
    Unauthorized,
)
from .keys import Key, content_key, content_key_of_file, intent_key, provider_key
from .protocol import Waiting
from .run import Run
from .specs import Reconciliation, Tool, ToolSpec, as_result, effect, from_result, read

__all__ = [
    "AlreadyRunning",
    "ApprovalTimeout",
    "AsyncClient",
    "AsyncRun",
    "AttemptStopped",
    "AttemptSuperseded",
    "ClaimConflict",
    "Client",
    "EffectBlocked",
    "EffectError",
    "IdempotencyKeyReused",
    "InvalidRequest",
    "Key",
    "KeyConflict",
    "KeyRefused",
    "NotFound",
    "NotPerformed",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "RateLimited",
    "Reconciliation",
    "RequestInProgress",
    "RestartBlocked",
    "Run",
    "RunFinished",
    "ServiceUnavailable",
    "StartsafeError",
    "Tool",
    "ToolNotRegistered",
    "ToolSpec",
    "Unauthorized",
    "Waiting",
    "as_result",
    "content_key",
    "content_key_of_file",
    "effect",
    "from_result",
    "intent_key",
    "provider_key",
    "read",
]
