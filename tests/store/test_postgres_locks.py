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
from typing import Any

import psycopg
import pytest

from helpers import pgbouncer
from ledgerq import StateDB
from ledgerq.errors import DatabaseUnavailable
from ledgerq.lifecycle import Actor
from ledgerq.queue import TaskApplication
from lifecycle_support import with_dispatch

SHOP = Actor(type="system", id="shop")
T0 = 1_800_000_000.0


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


async def test_the_reaper_leaves_a_row_another_transaction_holds_for_a_later_pass(
        pg_target: str) -> None:
    """An expired lease whose row is locked (its worker cut off in the middle of writing
    it: the server holds its locks until it ends that session) is skipped at once, not
    waited for: the other expired rows are requeued in the same pass, and the held one
    by the first pass after its lock is gone."""
    from ledgerq.queue import reap_expired_leases, submit_many
    from ledgerq.queue.maintenance.stuck import StuckRows
    from ledgerq.queue.worker.claim import claim_runs

    async with StateDB(pg_target, busy_timeout_ms=3000) as db:
        ids = await submit_many(db, [TaskApplication("agent", {"n": i}, "host")
                                     for i in range(3)])
        claimed = await claim_runs(db, worker_id="cut-off", now=T0, lease_ttl=1, limit=3)
        assert len(claimed.claimed) == 3
        with psycopg.connect(pg_target) as holder:
            holder.execute("SELECT id FROM schedule_runs WHERE id = %s FOR UPDATE", (ids[0],))
            started = time.monotonic()
            swept = await reap_expired_leases(db, now=T0 + 5, stuck=StuckRows())
            assert time.monotonic() - started < 2  # (a wait would take the 3 s timeout)
            assert swept == {"requeued": 2, "failed": 0}
            holder.rollback()
        swept = await reap_expired_leases(db, now=T0 + 5, stuck=StuckRows())
        assert swept == {"requeued": 1, "failed": 0}
        statuses = await db.fetch_all("SELECT status FROM schedule_runs")
        assert [r["status"] for r in statuses] == ["queued"] * 3


async def test_a_transaction_left_idle_loses_its_locks_after_the_lock_timeout(
        pg_target: str) -> None:
    """A handle's session that sits idle inside a transaction (its process stopped, its
    network cut) is ended by the server after the handle's lock timeout, so the rows it
    locked are free again for everyone else, however long it stays away."""
    import asyncio

    from ledgerq.errors import DatabaseError

    async with StateDB(pg_target, busy_timeout_ms=800, registry=with_dispatch()) as stalled, \
            StateDB(pg_target, busy_timeout_ms=20_000, registry=with_dispatch()) as other:
        outbox = other.entity("dispatch")
        made = await outbox.create({"channel": "email", "payload": {}}, actor=SHOP,
                                   reason="dispatch.pending.created")
        assert isinstance(made, str)

        def lock_then_stall(tx: Any) -> None:
            tx.execute("SELECT id FROM dispatch_outbox WHERE id = %s FOR UPDATE", (made,))
            time.sleep(3)  # idle in the transaction, its row lock held
            tx.execute("SELECT 1")

        stalling = asyncio.ensure_future(stalled.write(lock_then_stall))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        done = await outbox.move(made, "delivering", actor=SHOP,
                                 reason="dispatch.delivering.attempt")
        assert done.applied and time.monotonic() - started < 2.5
        with pytest.raises(DatabaseError):
            await stalling
