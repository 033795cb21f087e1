"""close() lets every write it already accepted commit, and refuses new ones meanwhile."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from ledgerq import StateDB


async def test_close_waits_for_accepted_writes(tmp_path: Path) -> None:
    db = await StateDB(tmp_path / "c.db").open()

    def insert(i: int) -> Callable[[sqlite3.Connection], None]:
        def unit(conn: sqlite3.Connection) -> None:
            conn.execute("INSERT INTO invocations (id, created_at) VALUES (?, 0)", (str(i),))
        return unit

    writes = [asyncio.ensure_future(db.write(insert(i))) for i in range(600)]
    await asyncio.sleep(0)  # every write is queued before close() starts
    await db.close()
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []
    async with StateDB(tmp_path / "c.db") as again:
        row = await again.fetch_one("SELECT count(*) AS n FROM invocations")
    assert row == {"n": 600}


async def test_no_new_writes_while_closing(tmp_path: Path) -> None:
    db = await StateDB(tmp_path / "c.db").open()
    first = asyncio.ensure_future(db.write(lambda conn: None))
    await asyncio.sleep(0)
    closing = asyncio.ensure_future(db.close())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="clos"):
        await asyncio.wait_for(db.write(lambda conn: None), 10)
    await asyncio.wait_for(closing, 10)
    await first
