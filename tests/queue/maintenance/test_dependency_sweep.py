"""promote_due(): the safety-net sweep settles waiting runs, and skips the write lock
while they merely wait (workers run it every half second)."""

from __future__ import annotations

from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.queue import TaskApplication, promote_due, submit_task
from ledgerq.queue.runs import move


def task(**kw: Any) -> TaskApplication:
    return TaskApplication("command", {"argv": ["true"]}, "host", **kw)


async def status(db: StateDB, rid: str) -> str:
    row = await db.fetch_one("SELECT status FROM schedule_runs WHERE id = ?", (rid,))
    assert row is not None
    return str(row["status"])


async def direct(db: StateDB, rid: str, *path: tuple[str, str, str]) -> None:
    """Move a run behind the queue's back, as an operator's raw transition() would."""
    policy = db.registry.entity("schedule_run")
    for src, dst, code in path:
        lease = {"leased_by": "op", "lease_expires_at": 4e9} if dst == "running" else None
        assert (await db.write(lambda c, s=src, d=dst, k=code, p=lease: move(
            c, policy, rid, s, d, k, patch=p))).applied


async def test_waiting_runs_cost_no_write_until_settled(db: StateDB,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    a = await submit_task(db, task())
    b = await submit_task(db, task())
    waiting = await submit_task(db, task(depends_on=[a, b]))
    writes = 0
    real_write = db.write

    async def counting(fn: Any) -> Any:
        nonlocal writes
        writes += 1
        return await real_write(fn)

    monkeypatch.setattr(db, "write", counting)
    done = [("queued", "running", "run.started.ok"), ("running", "completed", "run.completed.ok")]
    assert await promote_due(db) == {"retried": 0, "released": 0, "cancelled": 0, "started": 0}
    assert writes == 0
    await direct(db, a, *done)
    writes = 0
    assert await promote_due(db) == {"retried": 0, "released": 0, "cancelled": 0, "started": 0}
    assert writes == 0, "one dependency still pending: nothing to settle, no write lock"
    await direct(db, b, *done)
    assert (await promote_due(db))["released"] == 1
    assert await status(db, waiting) == "queued"


async def test_a_dependency_cancelled_directly_cancels_its_dependent(db: StateDB) -> None:
    a = await submit_task(db, task())
    waiting = await submit_task(db, task(depends_on=[a]))
    await direct(db, a, ("queued", "cancelled", "run.cancelled.operator"))
    assert (await promote_due(db))["cancelled"] == 1
    assert await status(db, waiting) == "cancelled"
