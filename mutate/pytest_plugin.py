"""pytest plugin for make mutate's runs only (``-p mutate.pytest_plugin`` in [tool.mutmut]).

mutmut runs pytest once to learn which tests reach which function, once clean, then
once per mutant, each in a process forked for it. pytest-django's ``--reuse-db`` keeps
the test database between runs but still runs ``migrate`` on it at every start, most
of a one-test mutant's run. The first runs create and migrate it; in a mutant's run
(mutmut names the mutant in ``MUTANT_UNDER_TEST``) ``setup_databases`` only points
Django at a database migrated already.

With ``MUTATE_JOBS`` above 1 (make mutate passes it to ``mutmut run --max-children``),
mutants run side by side, and two runs must never share a database: each takes a
free slot (an flock'ed file under ``mutants/``, released when its process ends) and
uses that slot's copy of the test database, made from it by ``CREATE DATABASE ...
TEMPLATE`` at the slot's first use. The first, migrating runs drop the copies, so no
slot outlives a migration.

A run that was stopped (mutmut's timeout, Ctrl-C) never reached its teardown: rows
its transactional test committed may still be there, and the next run's tests would
fail for them, not for a mutation (a false kill). So at the start of every run, when
a table the tests write to has rows, the database is flushed back to what ``migrate``
leaves (the roles come back through post_migrate, approvals/roles.py), as each
transactional test does at its end.

In a mutant's run, the transactional tests go last: mutmut orders a mutant's tests by
the time their bodies took, but each transactional test also flushes the database at
its end (most of its time, and not counted); a mutant most tests kill dies sooner.

Also off, in every mutmut run: pytest's ``unraisableexception`` plugin, whose
``gc.collect()`` five times over at the end was the other half of a short run.
It only turns errors in ``__del__`` into warnings, which never fail a test here.
And mutmut's fork server logs to the root logger, whose handler got the stderr of
mutmut's warm-up, closed since: ``logging.raiseExceptions`` off keeps the tracebacks
of those lost lines out of the output.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

# What migrate (and its post_migrate handlers) writes: the rows a clean test database has.
MIGRATE_TABLES = {
    "django_content_type",
    "auth_permission",
    "auth_group",
    "auth_group_permissions",
}
_held_slot = None  # the open, locked slot file: the lock lasts as long as the process


def _jobs() -> int:
    return max(1, int(os.environ.get("MUTATE_JOBS", "1")))


def _in_a_mutants_run() -> bool:
    # mutmut's own runs set it to "stats", "fail", "list_all_tests", "" ...
    return "__mutmut_" in os.environ.get("MUTANT_UNDER_TEST", "")


def pytest_configure(config):
    import django.test.utils

    logging.raiseExceptions = False
    # pytest-django imports it from there when its django_db_setup fixture runs.
    migrate = django.test.utils.setup_databases

    def setup_databases(verbosity, interactive, *, aliases=None, **kwargs):
        from django.db import connections

        if _in_a_mutants_run():
            db_cfg = []  # teardown_databases never sees it under --reuse-db
            slot = _take_a_slot(config.rootpath / "mutants-db-slots")
            for alias in aliases or connections:
                _use_the_migrated_database(connections[alias], slot)
        else:
            db_cfg = migrate(verbosity, interactive, aliases=aliases, **kwargs)
            for alias in aliases or connections:
                _drop_the_slots(connections[alias])
        for alias in aliases or connections:
            _flush_leftovers(connections[alias])
        return db_cfg

    django.test.utils.setup_databases = setup_databases
    config.add_cleanup(lambda: setattr(django.test.utils, "setup_databases", migrate))


def pytest_collection_modifyitems(config, items):
    if _in_a_mutants_run():
        items.sort(key=_flushes_at_its_end)  # stable: mutmut's order otherwise


def _flushes_at_its_end(item) -> bool:
    marker = item.get_closest_marker("django_db")
    transaction = marker is not None and marker.kwargs.get("transaction", False)
    return bool(transaction) or "transactional_db" in getattr(item, "fixturenames", ())


def _take_a_slot(folder: Path) -> int:
    """0 when mutants run one at a time, else the first slot no other run holds."""
    global _held_slot
    if _jobs() == 1:
        return 0
    folder.mkdir(exist_ok=True)
    while True:  # as many slots as mutmut's workers: one is free, or about to be
        for slot in range(1, _jobs() + 1):
            file = open(folder / f"{slot}.lock", "w")  # noqa: SIM115 (held until exit)
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.close()
                continue
            _held_slot = file
            return slot
        time.sleep(0.1)


def _slot_name(migrated: str, slot: int) -> str:
    return f"{migrated}_slot{slot}"


def _use_the_migrated_database(connection, slot: int) -> None:
    from django.conf import settings

    name = connection.creation._get_test_db_name()
    connection.close()
    if hasattr(connection, "close_pool"):
        connection.close_pool()
    if slot:
        migrated, name = name, _slot_name(name, slot)
        with connection._nodb_cursor() as cursor:
            cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if cursor.fetchone() is None:
                quote = connection.ops.quote_name
                cursor.execute(f"CREATE DATABASE {quote(name)} TEMPLATE {quote(migrated)}")
    settings.DATABASES[connection.alias]["NAME"] = name
    connection.settings_dict["NAME"] = name


def _drop_the_slots(connection) -> None:
    migrated = connection.settings_dict["NAME"]
    quote = connection.ops.quote_name
    with connection._nodb_cursor() as cursor:
        cursor.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s",
            [migrated.replace("_", r"\_") + r"\_slot%"],
        )
        for (name,) in cursor.fetchall():
            cursor.execute(f"DROP DATABASE {quote(name)} WITH (FORCE)")


def _flush_leftovers(connection) -> None:
    from django.apps import apps
    from django.core.management import call_command

    tables = sorted(
        {
            model._meta.db_table
            for model in apps.get_models(include_auto_created=True)
            if model._meta.managed and not model._meta.proxy
        }
        - MIGRATE_TABLES
    )
    quote = connection.ops.quote_name
    query = " UNION ALL ".join(f"(SELECT 1 FROM {quote(table)} LIMIT 1)" for table in tables)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT EXISTS ({query})")
        dirty = cursor.fetchone()[0]
    if dirty:
        call_command("flush", interactive=False, database=connection.alias, verbosity=0)
