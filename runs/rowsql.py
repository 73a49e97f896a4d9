"""Constant SQL for the journal's rows: read one row locked, insert rows, update a row.

Django's ORM compiles every query anew. On the API's write path that compiling
cost more CPU than PostgreSQL spent running the statements (``make bench``: a
record + complete pair was 28 statements, 70% of its CPU Python, most of it the
compiler; docs/performance.md). The statements here are built once per model from
its fields, so they follow the models as they change; a call only prepares its
values the way each field does (``get_db_prep_save``) and converts what it reads
back the way the ORM does (the backend's and the field's converters), so the
instances are the ORM's own, and ``pre_save``/``post_save`` are sent as ``save()``
sends them (every audit event's log line hangs on ``post_save``).

On PostgreSQL, ``write`` sends its inserts and updates as one statement (each a
data-modifying ``WITH`` part): the rows of one change of the journal (an effect,
its audit event, the call, the argument version) cost one round trip, not four.
Foreign keys are checked at commit (Django declares them ``DEFERRABLE INITIALLY
DEFERRED``), so the parts may name each other's rows. Elsewhere (the embedded
SQLite default) each row is its own statement.

Auto-increment primary keys of inserted rows are not read back (nothing reads
them: audit events and argument versions are found by their effect).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from datetime import UTC, datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, models
from django.db.models import Model
from django.db.models.fields import AutoFieldMixin
from django.db.models.signals import post_save, pre_save


def _db():
    """The default database's wrapper, looked up once per call: ``django.db.connection``
    is a proxy that finds it again (in a context-local) on every attribute read."""
    return connections[DEFAULT_DB_ALIAS]


class _Table:
    """One model's table: its columns and the statements over all of them."""

    def __init__(self, model: type[Model], connection) -> None:
        meta = model._meta
        quote = self.quote = connection.ops.quote_name
        self.model = model
        self.name = quote(meta.db_table)
        self.fields = list(meta.concrete_fields)
        self.attnames = [f.attname for f in self.fields]
        self.pk = meta.pk
        self.column_list = ", ".join(f"{self.name}.{c}" for c in self.columns(self.fields))
        self.select = f"SELECT {self.column_list} FROM {self.name}"
        # A serial primary key is the database's to give.
        self.inserted = [
            f for f in self.fields if not (f.primary_key and isinstance(f, AutoFieldMixin))
        ]
        self.insert_into = f"INSERT INTO {self.name} ({', '.join(self.columns(self.inserted))})"
        self.row_placeholders = f"({', '.join(['%s'] * len(self.inserted))})"
        self.updated = [f for f in self.fields if not f.primary_key]
        assignments = ", ".join(f"{quote(f.column)} = %s" for f in self.updated)
        self.update = f"UPDATE {self.name} SET {assignments} WHERE {quote(self.pk.column)} = %s"
        # What the ORM applies to each value it reads (a JSON column is parsed, a
        # UUID or a time made from SQLite's text), in the ORM's order.
        self.converters = []
        for field in self.fields:
            column = field.get_col(meta.db_table)
            found = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
            self.converters.append((column, found))

        self.passes = {f.attname: _passes_unchanged(f, connection) for f in self.fields}

    def columns(self, fields) -> list[str]:
        return [self.quote(f.column) for f in fields]

    def values(self, obj: Model, fields, db) -> list[Any]:
        """Each field's value as ``get_db_prep_save`` sends it; that call is skipped
        for a value it would send unchanged (``_passes_unchanged``), which is most of
        them: it was a tenth of the write path's client CPU (docs/performance.md)."""
        out = []
        passes = self.passes
        for f in fields:
            value = getattr(obj, f.attname)
            kinds = passes[f.attname]
            if kinds and (value is None or type(value) in kinds):
                if type(value) is datetime and value.tzinfo is None:
                    value = f.get_db_prep_save(value, db)  # Django warns, makes it aware
                out.append(value)
            else:
                out.append(f.get_db_prep_save(value, db))
        return out

    def instance(self, row: Sequence[Any], db) -> Model:
        values = list(row[: len(self.fields)])
        for i, (column, converters) in enumerate(self.converters):
            for convert in converters:
                values[i] = convert(values[i], column, db)
        return self.model.from_db(db.alias, self.attnames, values)


# Field classes (exactly these, not subclasses) whose get_db_prep_save sends a value
# of these types, or None, as it is.
_PLAIN_TYPES: dict[type, tuple[type, ...]] = {
    models.CharField: (str,),
    models.TextField: (str,),
    models.BooleanField: (bool,),
    # Not the integer fields: with server-side binding Django wraps each integer in
    # the column's own type (psycopg's Int2, Int4, Int8).
}


def _passes_unchanged(field, connection) -> tuple[type, ...]:
    """The value types ``field`` sends to this database unchanged; () for none.

    A foreign key sends what its target sends (None stays None). A UUID goes as it
    is where the database has a UUID type; an aware datetime where the backend does
    not adapt it (PostgreSQL). Anything else (JSON, choices enums, other classes)
    takes ``get_db_prep_save``."""
    if isinstance(field, models.ForeignKey):
        field = field.target_field
    kind = type(field)
    if kind is models.UUIDField:
        return (uuid.UUID,) if connection.features.has_native_uuid_field else ()
    if kind is models.DateTimeField:
        return (datetime,) if connection.vendor == "postgresql" else ()
    return _PLAIN_TYPES.get(kind, ())


_tables: dict[tuple[type[Model], str], _Table] = {}


def cursor(db=None):
    """A cursor on the default database for ``with``, reused while the connection is
    the same one: creating Django's cursor wrapper and psycopg's cursor cost about
    as much client CPU as sending a short prepared statement (docs/performance.md),
    and the API's hot writes send five or six a request.

    It is Django's own ``CursorWrapper``: errors are Django's, and a statement after
    a failed one in an atomic block is refused as ever. While queries are being
    logged (``DEBUG``, ``CaptureQueriesContext``) each block gets a new logging one.
    """
    db = db or _db()
    if db.queries_logged:
        return db.cursor()
    raw = db.connection
    kept = db.__dict__.get("_rowsql_cursor")
    if kept is not None and raw is not None and kept[0] is raw and not getattr(raw, "closed", 0):
        return nullcontext(kept[1])  # the cursor outlives the block
    wrapper = db.cursor()  # connects if needed
    if db.vendor == "postgresql" and db.timezone is UTC:
        # Django reads timestamptz with a subclass of psycopg's Python loader, to set
        # its own time zone; in UTC psycopg's C loader gives the same aware datetimes
        # (the session is in UTC: Django sets it) in a tenth of the time.
        from psycopg.types.datetime import TimestamptzLoader

        wrapper.cursor.adapters.register_loader("timestamptz", TimestamptzLoader)
    db._rowsql_cursor = (db.connection, wrapper)
    return nullcontext(wrapper)


def table(model: type[Model], db=None) -> _Table:
    db = db or _db()
    found = _tables.get((model, db.vendor))
    if found is None:
        found = _tables[model, db.vendor] = _Table(model, db)
    return found


def lock_clause(db=None) -> str:
    """``FOR UPDATE`` where the database has row locks (SQLite locks the whole file)."""
    return " FOR UPDATE" if (db or _db()).features.has_select_for_update else ""


def select(model: type[Model], extra: str = "") -> str:
    """``SELECT <every column>[, extra] FROM <table>``; the caller adds its ``WHERE``.

    ``instance`` makes the model instance of such a row; ``extra`` columns follow
    the model's, for the caller to read (``row[len(fields):]``)."""
    t = table(model)
    return f"SELECT {t.column_list}, {extra} FROM {t.name}" if extra else t.select


def instance(model: type[Model], row: Sequence[Any]) -> Model:
    """The model instance of a row ``select(model)`` read (extra columns after it ignored)."""
    db = _db()
    return table(model, db).instance(row, db)


def db_value(model: type[Model], field: str, value: Any) -> Any:
    """``value`` as ``field`` sends it to this database (a UUID is text on SQLite)."""
    return model._meta.get_field(field).get_db_prep_value(value, _db())


def _where(t: _Table, db, equal: dict[str, Any]) -> tuple[str, list[Any]]:
    fields = [(t.model._meta.get_field(name), value) for name, value in equal.items()]
    where = " AND ".join(f"{t.name}.{t.quote(f.column)} = %s" for f, _ in fields)
    return where, [f.get_db_prep_value(value, db) for f, value in fields]


def fetch(model: type[Model], *, lock: bool = False, **equal: Any):
    """The one row whose fields equal ``equal`` (by attname) as an instance, locked
    if asked; None if there is none."""
    db = _db()
    t = table(model, db)
    where, params = _where(t, db, equal)
    with cursor(db) as cur:
        cur.execute(f"{t.select} WHERE {where}{lock_clause(db) if lock else ''}", params)
        row = cur.fetchone()
    return None if row is None else t.instance(row, db)


def exists(model: type[Model], **equal: Any) -> bool:
    """Whether a row's fields equal ``equal`` (by attname): ``QuerySet.exists()``
    without compiling a query."""
    db = _db()
    t = table(model, db)
    where, params = _where(t, db, equal)
    with cursor(db) as cur:
        cur.execute(f"SELECT 1 FROM {t.name} WHERE {where} LIMIT 1", params)
        return cur.fetchone() is not None


def insert_statement(obj: Model) -> tuple[str, list[Any]]:
    """``INSERT INTO <table> (<columns>)`` and the row's values, for a caller's own SQL."""
    db = _db()
    t = table(type(obj), db)
    return t.insert_into, t.values(obj, t.inserted, db)


def write(inserts: Iterable[Model] = (), updates: Iterable[Model] = ()) -> None:
    """Insert ``inserts`` and update every column of ``updates`` (by primary key).

    Rows of one model inserted together share one ``VALUES`` list. On PostgreSQL
    the whole write is one statement; elsewhere one statement per model or row.
    """
    db = _db()
    inserts, updates = list(inserts), list(updates)
    _send_pre_save(db, [*inserts, *updates])
    _write_now(db, inserts, updates)


def _send_pre_save(db, objs: list[Model]) -> None:
    for obj in objs:
        pre_save.send(sender=type(obj), instance=obj, raw=False, using=db.alias)


def _write_now(db, inserts: list[Model], updates: list[Model]) -> None:
    statements = [_update(obj, db) for obj in updates]
    by_model: dict[type[Model], list[Model]] = {}
    for obj in inserts:
        by_model.setdefault(type(obj), []).append(obj)
    for rows in by_model.values():
        # SQLite takes so many values a statement (the sweep writes thousands of events).
        size = db.ops.bulk_batch_size(table(type(rows[0]), db).inserted, rows) or len(rows)
        statements += [_insert(rows[i : i + size], db) for i in range(0, len(rows), size)]
    with cursor(db) as cur:
        if db.vendor == "postgresql" and len(statements) > 1:
            *parts, (last_sql, last_params) = statements
            with_parts = ", ".join(f"w{i} AS ({sql})" for i, (sql, _) in enumerate(parts))
            params = [p for _, part_params in parts for p in part_params]
            cur.execute(f"WITH {with_parts} {last_sql}", [*params, *last_params])
        else:
            for sql, params in statements:
                cur.execute(sql, params)
    for obj in inserts:
        obj._state.adding = False
        obj._state.db = db.alias
    for created, obj in [*((True, o) for o in inserts), *((False, o) for o in updates)]:
        post_save.send(
            sender=type(obj),
            instance=obj,
            created=created,
            update_fields=None,
            raw=False,
            using=db.alias,
        )


def _insert(rows: list[Model], db) -> tuple[str, list[Any]]:
    t = table(type(rows[0]), db)
    params = [value for obj in rows for value in t.values(obj, t.inserted, db)]
    return f"{t.insert_into} VALUES {', '.join([t.row_placeholders] * len(rows))}", params


def _update(obj: Model, db) -> tuple[str, list[Any]]:
    t = table(type(obj), db)
    return t.update, [*t.values(obj, t.updated, db), t.pk.get_db_prep_save(obj.pk, db)]
