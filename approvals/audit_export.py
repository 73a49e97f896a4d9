"""The audit log, filtered like the history page, and its export as CSV and NDJSON.

One home for each part (product.md, "Sign-in, export, insights"): ``AuditFilterForm``
reads the filters (from the history page's query string or the command's options),
``audit_events`` turns them into the one queryset the page lists and the export
streams, ``audit_rows`` gives each event's row (the columns in README "Exporting the
audit log"), and ``EXPORT_FORMATS`` encodes rows as lines. The console's
``/history/export.csv`` and ``manage.py export_audit`` both go through all four, so
their output is the same bytes.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from datetime import timedelta

import orjson
from django import forms
from django.db.models import QuerySet

from runs.models import AuditEvent

# Rows fetched per round trip. On PostgreSQL ``iterator()`` reads through a server-side
# cursor, so the process holds one chunk at a time, however many rows match.
EXPORT_CHUNK = 2000

# (column, field read from the database): the export's columns, in order.
COLUMNS = [
    ("at", "at"),
    ("actor", "actor"),
    ("actor_kind", "actor_kind"),
    ("verb", "verb"),
    ("agent", "agent__name"),
    ("run_id", "run_id"),
    ("run_key", "run__run_key"),
    ("attempt", "attempt_number"),
    ("effect_id", "effect_id"),
    ("tool", "effect__tool"),
    ("key", "effect__key"),
    ("old_status", "old_status"),
    ("new_status", "new_status"),
    ("note", "note"),
    ("data", "data"),
]
HEADER = [name for name, _ in COLUMNS]


class AuditFilterForm(forms.Form):
    """The audit log's filters. An invalid value is left out of ``cleaned_data``: the
    page then ignores it (as it ignores an unknown attempt status), the command
    refuses it."""

    agent = forms.CharField(required=False, max_length=200)
    verb = forms.CharField(required=False, max_length=40)
    # Inclusive; a date alone is its midnight in TIME_ZONE.
    since = forms.DateTimeField(required=False)
    # A date alone means the whole of that day (the page's date inputs send dates);
    # a date and time is exclusive.
    until = forms.DateTimeField(required=False)
    run = forms.UUIDField(required=False)

    def clean_until(self):
        until = self.cleaned_data["until"]
        raw = (self.data.get("until") or "").strip()
        if until is not None and len(raw) == len("2026-01-31"):
            return until + timedelta(days=1)
        return until


def audit_filters(data) -> dict:
    """The valid, non-empty filters in ``data`` (a QueryDict or the command's options).

    U+0000 is dropped first: PostgreSQL cannot compare text with it (a 500)."""
    cleaned = {
        name: str(value).replace("\x00", "").strip()
        for name in AuditFilterForm.base_fields
        if (value := data.get(name)) is not None
    }
    form = AuditFilterForm(cleaned)
    form.is_valid()
    return {name: value for name, value in form.cleaned_data.items() if value not in (None, "")}


def audit_events(filters: dict) -> QuerySet[AuditEvent]:
    """The audit log with ``filters`` (from ``audit_filters``), newest first: what the
    history page lists and the export writes."""
    events = AuditEvent.objects.order_by("-at", "-id")
    if "agent" in filters:
        events = events.filter(agent__name=filters["agent"])
    if "verb" in filters:
        events = events.filter(verb=filters["verb"])
    if "since" in filters:
        events = events.filter(at__gte=filters["since"])
    if "until" in filters:
        events = events.filter(at__lt=filters["until"])
    if "run" in filters:
        events = events.filter(run_id=filters["run"])
    return events


def audit_rows(events: QuerySet[AuditEvent]) -> Iterator[dict]:
    """Each event as a row of the export: plain values (text, numbers, None), ``data``
    as the stored JSON object. Values only, no model instances, read in chunks."""
    fields = [field for _, field in COLUMNS]
    for values in events.values_list(*fields).iterator(chunk_size=EXPORT_CHUNK):
        row = dict(zip(HEADER, values, strict=True))
        row["at"] = row["at"].isoformat()
        for name in ("run_id", "effect_id"):
            if row[name] is not None:
                row[name] = str(row[name])
        yield row


class _Echo:
    """A file whose ``write`` hands back the line: csv.writer formats one row at a
    time, nothing accumulates (Django's "Streaming large CSV files")."""

    def write(self, value: str) -> str:
        return value


def _batched(lines: Iterable[str], size: int = 500) -> Iterator[str]:
    """Lines joined ``size`` at a time: a million one-line writes cost the server far
    more than two thousand larger ones, and the memory held stays one batch."""
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) == size:
            yield "".join(batch)
            batch = []
    if batch:
        yield "".join(batch)


def csv_lines(rows: Iterable[dict]) -> Iterator[str]:
    """RFC 4180 CSV (``\\r\\n``), a header line first; ``data`` as JSON text, an empty
    value (no run, no attempt) as an empty cell."""
    writer = csv.writer(_Echo())

    def lines():
        yield writer.writerow(HEADER)
        for row in rows:
            row["data"] = orjson.dumps(row["data"]).decode()
            yield writer.writerow(["" if value is None else value for value in row.values()])

    return _batched(lines())


def ndjson_lines(rows: Iterable[dict]) -> Iterator[str]:
    """One JSON object per line (``\\n``), the columns as keys, no header."""
    return _batched(orjson.dumps(row).decode() + "\n" for row in rows)


# format → (encoder, content type)
EXPORT_FORMATS = {
    "csv": (csv_lines, "text/csv; charset=utf-8"),
    "ndjson": (ndjson_lines, "application/x-ndjson"),
}
