"""A writer waiting behind a lock gives up, on PostgreSQL as on SQLite.

SQLite's busy timeout ends a wait for another's write lock; PostgreSQL, left alone,
waits for a row or table lock forever (a submit sat 44 s behind an operator's
``LOCK TABLE``, and would have sat longer). ``StateDB(busy_timeout_ms=)`` is the same
bound on both: past it the write fails as DatabaseUnavailable, having written nothing,
and trying again later succeeds.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from ledgerq import StateDB
from ledgerq.errors import DatabaseUnavailable
from ledgerq.lifecycle import Actor
from lifecycle_support import with_dispatch

SHOP = Actor(type="system", id="shop")


async def test_a_write_behind_a_table_lock_gives_up(pg_target: str) -> None:
    async with StateDB(pg_target, busy_timeout_ms=400, registry=with_dispatch()) as db:
        outbox = db.entity("dispatch")
        values = {"channel": "email", "payload": {"to": "a@example.org"}}
        await outbox.create(values, actor=SHOP, reason="dispatch.pending.created")
        with psycopg.connect(pg_target) as holder:
            holder.execute("LOCK TABLE dispatch_outbox IN ACCESS EXCLUSIVE MODE")
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable, match="lock timeout"):
                await outbox.create(values, actor=SHOP, reason="dispatch.pending.created")
            assert time.monotonic() - started < 10
            holder.rollback()
        assert len((await outbox.list()).items) == 1  # the refused one wrote nothing
        await outbox.create(values, actor=SHOP, reason="dispatch.pending.created")
        assert len((await outbox.list()).items) == 2


async def test_the_default_is_the_busy_timeout(pg_target: str) -> None:
    async with StateDB(pg_target) as db:
        shown = await db.fetch_one("SHOW lock_timeout")
        assert shown is not None and list(shown.values()) == ["30s"]
