"""A pool whose idle connections all died gives a live one at once (startsafe/postgresql/base.py).

With psycopg's own check, each dead connection met costs a growing back-off (1 s,
2 s, 4 s, ...): ten dead ones outlast a 5 s pool timeout and the request fails
although PostgreSQL is up. With ours the first dead one sweeps the rest.
"""

from __future__ import annotations

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections
from psycopg_pool import ConnectionPool, PoolTimeout

from startsafe.postgresql.base import check_pooled_connection

pytestmark = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the pool is psycopg's, on PostgreSQL"
)

POOL_SIZE = 10


def _conninfo(application_name: str) -> str:
    db = settings.DATABASES["default"]
    return psycopg.conninfo.make_conninfo(
        host=db["HOST"] or "127.0.0.1",
        port=db["PORT"] or 5432,
        user=db["USER"],
        password=db.get("PASSWORD") or None,
        dbname="postgres",
        application_name=application_name,
    )


def _pool_with_dead_idle_connections(check, name: str) -> ConnectionPool:
    pool = ConnectionPool(
        _conninfo(name), min_size=1, max_size=POOL_SIZE, timeout=5, check=check, open=True
    )
    held = [pool.getconn() for _ in range(POOL_SIZE)]
    for conn in held:
        pool.putconn(conn)
    with psycopg.connect(_conninfo("startsafe-test-admin"), autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            [name],
        ).fetchone()[0]
    assert killed == POOL_SIZE
    return pool


def test_a_pool_of_dead_connections_gives_a_live_one_within_its_timeout():
    pool = _pool_with_dead_idle_connections(check_pooled_connection, "startsafe-test-ours")
    try:
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert pool.get_stats()["connections_lost"] == POOL_SIZE
    finally:
        pool.close()


def test_psycopgs_own_check_alone_times_out_on_the_same_pool():
    """The control: the failure our check exists for is real with this psycopg."""
    pool = _pool_with_dead_idle_connections(ConnectionPool.check_connection, "startsafe-test-plain")
    try:
        with pytest.raises(PoolTimeout), pool.connection():
            pass
    finally:
        pool.close()


@pytest.mark.django_db(transaction=True)
def test_djangos_own_pool_uses_the_sweeping_check(agent):
    """The backend of DATABASE_URL's pool: its idle connections all cut, a query works."""
    from runs.models import Agent

    connections.close_all()
    pool = connection.pool
    held = [pool.getconn() for _ in range(pool.max_size)]
    pids = [conn.info.backend_pid for conn in held]
    for conn in held:
        pool.putconn(conn)
    with psycopg.connect(_conninfo("startsafe-test-admin"), autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [pids])
    lost_before = pool.get_stats().get("connections_lost", 0)
    assert Agent.objects.filter(pk=agent.pk).exists()
    assert pool.get_stats()["connections_lost"] - lost_before == pool.max_size
