"""Connections to the test database outside Django's, for tests that play another client."""

from __future__ import annotations

import psycopg
from django.conf import settings


def connect_outside_django(dbname: str | None = None) -> psycopg.Connection:
    """A psycopg connection to the test database (or ``dbname``), not Django's, in
    autocommit: to hold locks or watch sessions as another client would."""
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"] or "127.0.0.1",
        port=db["PORT"] or 5432,
        user=db["USER"],
        password=db.get("PASSWORD") or None,
        dbname=dbname or db["NAME"],
        autocommit=True,
    )
