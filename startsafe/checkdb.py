"""``python -m startsafe.checkdb URL``: tell clearly when the test database is unreachable."""

from __future__ import annotations

import sys

import dj_database_url
import psycopg


def main(url: str) -> int:
    config = dj_database_url.parse(url)
    if config["ENGINE"] != "django.db.backends.postgresql":
        print(f"make test runs on PostgreSQL; DATABASE_URL={url} is not a PostgreSQL URL.")
        return 2
    try:
        with psycopg.connect(
            host=config["HOST"] or "127.0.0.1",
            port=config["PORT"] or 5432,
            user=config["USER"] or "postgres",
            password=config["PASSWORD"] or None,
            dbname="postgres",
            connect_timeout=5,
        ):
            return 0
    except psycopg.OperationalError as exc:
        print(
            f"PostgreSQL is not reachable at {config['HOST']}:{config['PORT']} ({exc}).\n"
            "Start it (on this machine: pg_ctlcluster --skip-systemctl-redirect "
            "$(ls /etc/postgresql) main start), or set DATABASE_URL to one that is."
        )
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
