"""Trigram indexes for the console's run search (``run_key`` or ``title`` contains).

Django's ``icontains`` on PostgreSQL is ``UPPER(col::text) LIKE UPPER(%s)``: a
B-tree cannot serve a pattern with a leading wildcard, so every search read all
runs, twice (the page and its count). GIN trigram indexes on the same expressions
serve both (docs/performance.md). PostgreSQL only: SQLite (the embedded default)
keeps scanning, which is fine at its size. ``pg_trgm`` is a trusted extension
(PostgreSQL 13+), so the database's owner may create it; where it cannot be
created, the search keeps working without the indexes.
"""

from django.db import migrations, transaction

INDEXES = {
    "run_key_trgm_idx": "UPPER(run_key::text)",
    "run_title_trgm_idx": "UPPER(title::text)",
}


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    try:
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    except Exception:  # no privilege: the search works, only slower
        return
    for name, expression in INDEXES.items():
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON runs_run USING gin (({expression}) gin_trgm_ops)"
        )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("runs", "0004_performance_indexes")]

    operations = [migrations.RunPython(create, drop)]
