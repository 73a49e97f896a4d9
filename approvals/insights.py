"""The insights page's figures (product.md, "Sign-in, export, insights").

Per tool and per operator over a period ``[since, until)``, each figure one grouped
query, whatever the number of rows:

- asked: effects that entered ``awaiting_approval`` (an audit event whose new
  status is awaiting and whose old status was not: a revision asking again counts);
- decided, approved, approval rate: a person's approval or rejection of an
  awaiting effect (the decision events from ``awaiting_approval``, by an operator);
- time to decide: from the effect's latest entry into awaiting to that decision;
  median and p90 (PostgreSQL's ``percentile_cont``);
- expired: awaiting effects whose deadline passed undecided (``expired``, or the
  system's rejection when the tool's policy says ``on_expiry: reject``);
- escalated: the audit verb ``escalated`` (approvals/escalation.py);
- drift holds: effects recorded with the hold ``key_drift`` (runs/policies.py);
- duplicates prevented: calls answered from a keyed effect an earlier call had
  already recorded (``Call.prevented_duplicate``, set when the call is recorded by
  ``runs.calls.prevents_duplicate``; the tools page counts the same): ``skip``
  (done: the call repeats one that ran) or ``wait`` (in flight for another attempt,
  or awaiting approval since an earlier call). The first call of an effect that
  needs approval is answered ``wait`` too, at its effect's creation: no duplicate.

Each reads a partial index added for it (runs migration 0012) over the period, and
each row's effect by its primary key: the audit figures ``audit_awaiting_at_idx``
(events from or to awaiting_approval only), drift holds ``effect_held_created_idx``,
duplicates ``call_duplicate_at_idx`` (index only: it holds the duplicates alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import (
    Aggregate,
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    Subquery,
)

from approvals.escalation import VERB as ESCALATED
from runs.models import AuditEvent, Call, Effect, EffectStatus
from runs.policies import HOLD_KEY_DRIFT

AWAITING = EffectStatus.AWAITING_APPROVAL


class PercentileCont(Aggregate):
    """PostgreSQL's ``percentile_cont(f) WITHIN GROUP (ORDER BY x)``, an ordered-set
    aggregate django.contrib.postgres.aggregates does not provide (Django 5.2).
    ``fraction`` is a float the code chooses, never user input."""

    function = "percentile_cont"
    template = "%(function)s(%(fraction)s) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression, fraction: float, **extra):
        super().__init__(expression, fraction=float(fraction), **extra)


@dataclass(frozen=True)
class Period:
    since: datetime
    until: datetime


def _in(period: Period, field: str = "at") -> Q:
    return Q(**{f"{field}__gte": period.since, f"{field}__lt": period.until})


def _entered_awaiting() -> Q:
    return Q(new_status=AWAITING) & ~Q(old_status=AWAITING)


def _decisions(period: Period):
    """A person's approval or rejection of an awaiting effect, with ``wait``: the time
    since the effect last entered awaiting (on ``audit_effect_idx``)."""
    entered = (
        AuditEvent.objects.filter(_entered_awaiting(), effect=OuterRef("effect"))
        .filter(at__lte=OuterRef("at"))
        .order_by("-at", "-id")
        .values("at")[:1]
    )
    return (
        AuditEvent.objects.filter(
            _in(period),
            verb__in=("approved", "rejected"),
            actor_kind="operator",
            old_status=AWAITING,
        )
        .order_by()
        .alias(
            wait=ExpressionWrapper(
                F("at") - Subquery(entered, output_field=DateTimeField()),
                output_field=DurationField(),
            )
        )
    )


def _percentile(values: list[timedelta], fraction: float) -> timedelta | None:
    """percentile_cont's linear interpolation, for the embedded default (SQLite has
    no ordered-set aggregates), so both databases show the same figure."""
    if not values:
        return None
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def decision_figures(period: Period, by: str, *, postgres: bool | None = None) -> dict[str, dict]:
    """Decided, approved, median and p90 time to decide, grouped by ``by``
    (``"effect__tool"`` or ``"actor"``): one query (two on SQLite, which computes
    the percentiles in Python; ``postgres=False`` takes that path on PostgreSQL too,
    so the tests hold it to percentile_cont's figures)."""
    decisions = _decisions(period)
    counts = {
        "decided": Count("id"),
        "approved": Count("id", filter=Q(verb="approved")),
    }
    if postgres is None:
        postgres = connection.vendor == "postgresql"
    if postgres:
        counts["median"] = PercentileCont("wait", 0.5, output_field=DurationField())
        counts["p90"] = PercentileCont("wait", 0.9, output_field=DurationField())
    rows = {row[by]: row for row in decisions.values(by).annotate(**counts)}
    if not postgres:
        waits: dict[str, list[timedelta]] = {}
        for key, wait in decisions.annotate(waited=F("wait")).values_list(by, "waited"):
            if wait is not None:
                waits.setdefault(key, []).append(wait)
        for key, row in rows.items():
            row["median"] = _percentile(waits.get(key, []), 0.5)
            row["p90"] = _percentile(waits.get(key, []), 0.9)
    return rows


def _count_by_tool(queryset, tool: str = "effect__tool") -> dict[str, int]:
    # count(*), not count(id): the duplicates' index holds (at, tool) only, so a
    # column outside it would send every counted row to the table.
    return dict(queryset.order_by().values_list(tool).annotate(n=Count("*")))


def asked(period: Period) -> dict[str, int]:
    return _count_by_tool(AuditEvent.objects.filter(_in(period), _entered_awaiting()))


def expired(period: Period) -> dict[str, int]:
    deadline = Q(verb="expired") | Q(verb="rejected", actor_kind="system")
    return _count_by_tool(AuditEvent.objects.filter(_in(period), deadline, old_status=AWAITING))


def escalated(period: Period) -> dict[str, int]:
    # An escalation is recorded on an awaiting effect (approvals/escalation.py): saying
    # so lets the query use audit_awaiting_at_idx.
    escalations = AuditEvent.objects.filter(_in(period), verb=ESCALATED, new_status=AWAITING)
    return _count_by_tool(escalations)


def drift_holds(period: Period) -> dict[str, int]:
    # hold__isnull=False: the condition of effect_held_created_idx, so it is used.
    held = Effect.objects.filter(_in(period, "created_at"), hold__isnull=False)
    return _count_by_tool(held.filter(hold__reason=HOLD_KEY_DRIFT), "tool")


def duplicates_prevented(period: Period) -> dict[str, int]:
    # prevented_duplicate: the condition of call_duplicate_at_idx (runs/calls.py sets it).
    return _count_by_tool(Call.objects.filter(_in(period), prevented_duplicate=True), "tool")


def _rate(row: dict) -> float | None:
    return row["approved"] / row["decided"] if row.get("decided") else None


def insights(period: Period) -> dict:
    """Every figure of the page: ``tools`` and ``operators``, rows sorted by name."""
    per_tool = {
        "asked": asked(period),
        "expired": expired(period),
        "escalated": escalated(period),
        "drift_holds": drift_holds(period),
        "duplicates": duplicates_prevented(period),
    }
    decided = decision_figures(period, "effect__tool")
    names = sorted(set(decided).union(*per_tool.values()) - {None})
    empty = {"decided": 0, "approved": 0, "median": None, "p90": None}
    tools = [
        {
            "name": name,
            **{figure: counts.get(name, 0) for figure, counts in per_tool.items()},
            **{k: decided.get(name, empty)[k] for k in empty},
            "rate": _rate(decided.get(name, empty)),
        }
        for name in names
    ]
    by_operator = decision_figures(period, "actor")
    operators = [
        {"name": name, **{k: row[k] for k in empty}, "rate": _rate(row)}
        for name, row in sorted(by_operator.items())
    ]
    return {"tools": tools, "operators": operators}
