"""Who did something, and the append-only audit row every change writes."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models.signals import post_save

from runs.models import Agent, AuditEvent, Effect, Run


@dataclass(frozen=True)
class Actor:
    """An agent, an operator (a Django user) or the system."""

    kind: str  # "agent", "operator" or "system"
    label: str  # "agent:<name>", "<username>" or "system"
    user: Any = None
    agent: Agent | None = None

    @classmethod
    def for_agent(cls, agent: Agent) -> Actor:
        return cls(kind="agent", label=agent.label, agent=agent)

    @classmethod
    def for_user(cls, user) -> Actor:
        return cls(kind="operator", label=user.get_username(), user=user)

    @property
    def author(self) -> str:
        """How an argument version names its author."""
        return self.label if self.kind != "operator" else f"operator:{self.label}"


SYSTEM = Actor(kind="system", label="system")


def record_event(actor: Actor, verb: str, **fields: Any) -> AuditEvent:
    """Write one audit event now; ``fields`` as ``new_event`` takes them."""
    event = new_event(actor, verb, **fields)
    event.save(force_insert=True)
    return event


# From this many events on, PostgreSQL gets them by COPY: a sweep of 1,000 stale
# runs writes 3,000, and one multi-row INSERT of them was a third of its time.
COPY_FROM = 100
_COPY_COLUMNS = (
    "at",
    "actor",
    "actor_kind",
    "verb",
    "agent_id",
    "run_id",
    "attempt_number",
    "effect_id",
    "old_status",
    "new_status",
    "note",
    "data",
)


def save_events(events: list[AuditEvent]) -> None:
    """Insert several events at once (one statement, or COPY for many), each logged
    as ``create()`` would. By COPY the events get no primary key back; nothing reads it."""
    if len(events) < COPY_FROM or connection.vendor != "postgresql":
        AuditEvent.objects.bulk_create(events)
    else:
        _copy_events(events)
    for event in events:
        # bulk_create sends no signal; the log line of every event hangs on it.
        post_save.send(
            sender=AuditEvent,
            instance=event,
            created=True,
            update_fields=None,
            raw=False,
            using="default",
        )


def _copy_events(events: list[AuditEvent]) -> None:
    """COPY: the ORM has no statement for it, so psycopg's own ``copy`` is used."""
    from psycopg.types.json import Jsonb

    sql = f"COPY {AuditEvent._meta.db_table} ({', '.join(_COPY_COLUMNS)}) FROM STDIN"
    with connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
        for event in events:
            copy.write_row(
                [*(getattr(event, column) for column in _COPY_COLUMNS[:-1]), Jsonb(event.data)]
            )


def new_event(
    actor: Actor,
    verb: str,
    *,
    at: datetime,
    run: Run | None = None,
    effect: Effect | None = None,
    attempt_number: int | None = None,
    old_status: str = "",
    new_status: str = "",
    note: str = "",
    data: dict | None = None,
) -> AuditEvent:
    """An audit event, not saved yet (``record_event`` or ``save_events`` saves it)."""
    if actor.agent is not None:
        agent_id = actor.agent.pk
    elif run is not None:
        agent_id = run.agent_id
    else:
        agent_id = effect.agent_id if effect is not None else None
    return AuditEvent(
        at=at,
        actor=actor.label,
        actor_kind=actor.kind,
        verb=verb,
        agent_id=agent_id,
        run=run,
        effect=effect,
        attempt_number=attempt_number,
        old_status=old_status or "",
        new_status=new_status or "",
        note=note or "",
        data=data or {},
    )
