"""A writer waiting behind a lock gives up, on PostgreSQL as on SQLite.

SQLite's busy timeout ends a wait for another's write lock; PostgreSQL, left alone,
waits for a row or table lock forever (a submit sat 44 s behind an operator's
``LOCK TABLE``, and would have sat longer). ``StateDB(busy_timeout_ms=)`` is the same
bound on both: past it the write fails as DatabaseUnavailable, having written nothing,
and trying again later succeeds. Behind PgBouncer in transaction mode too, where the
bound is set in each transaction (a session's setting would stay on a server connection
other clients get next, and be missing from the one the next transaction gets).
"""

from __future__ import annotations

import time

import psycopg
import pytest

from helpers import pgbouncer
from ledgerq import StateDB
from ledgerq.errors import DatabaseUnavailable
from ledgerq.lifecycle import Actor
from lifecycle_support import with_dispatch

SHOP = Actor(type="system", id="shop")


@pytest.fixture(params=["direct", "pgbouncer"])
def target(request: pytest.FixtureRequest) -> str:
    """The server, or the server through PgBouncer in transaction mode."""
    name = "pg_target" if request.param == "direct" else "bouncer_target"
    return str(request.getfixturevalue(name))


async def test_a_write_behind_a_table_lock_gives_up(target: str) -> None:
    async with StateDB(target, busy_timeout_ms=400, registry=with_dispatch(),
                       **pgbouncer.options(target)) as db:
        outbox = db.entity("dispatch")
        values = {"channel": "email", "payload": {"to": "a@example.org"}}
        await outbox.create(values, actor=SHOP, reason="dispatch.pending.created")
        with psycopg.connect(pgbouncer.direct_url(target)) as holder:
            holder.execute("LOCK TABLE dispatch_outbox IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="lock timeout"):
                await outbox.create(values, actor=SHOP, reason="dispatch.pending.created")
            assert time.monotonic() - started < 10
            holder.rollback()
        assert len((await outbox.list()).items) == 1  # the refused one wrote nothing
        await outbox.create(values, actor=SHOP, reason="dispatch.pending.created")
        assert len((await outbox.list()).items) == 2


async def test_a_pooled_handle_leaves_no_setting_on_the_servers_connections(
        bouncer_target: str) -> None:
    """Its lock timeout holds in its own transactions only: a client the pooler gives
    the same server connection next sees the server's default."""
    async with StateDB(bouncer_target, busy_timeout_ms=400, registry=with_dispatch(),
                       **pgbouncer.options(bouncer_target)) as db:
        assert db.pooled
        shown = await db.fetch_one("SHOW lock_timeout")
        assert shown is not None and list(shown.values()) == ["400ms"]
        outbox = db.entity("dispatch")
        for _ in range(3):
            await outbox.create({"channel": "email", "payload": {}}, actor=SHOP,
                                reason="dispatch.pending.created")
        with psycopg.connect(bouncer_target, prepare_threshold=None,
                             autocommit=True) as other:
            seen = {other.execute("SHOW lock_timeout").fetchone()[0] for _ in range(5)}
        assert seen == {"0"}


async def test_the_default_is_the_busy_timeout(pg_target: str) -> None:
    async with StateDB(pg_target) as db:
        shown = await db.fetch_one("SHOW lock_timeout")
        assert shown is not None and list(shown.values()) == ["30s"]
