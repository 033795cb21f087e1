"""PostgreSQL faults under a running worker: connections killed, the server restarted.

A worker's connections die in production (a failover, an idle-session reaper, an
operator's ``pg_terminate_backend``). The promise: the worker keeps going, leases stay
guarded, and no task is lost or runs twice beyond what a lease expiry explains. Each
test here kills for real, against the local server, while tasks run.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, Worker, submit_many, submit_task
from ledgerq.queue.runs import ENTITY

#: The server restart would cut every other test's connections: run alone.
pytestmark = pytest.mark.serial

TERMINAL = ("completed", "failed", "timed_out", "cancelled", "skipped")


class Counting:
    """An executor that records each run it starts; runs take ``sleep`` seconds."""

    def __init__(self, sleep: float = 0.02) -> None:
        self.calls: list[str] = []
        self.sleep = sleep

    async def __call__(self, run: dict[str, Any]) -> tuple[int, str]:
        self.calls.append(run["id"])
        await asyncio.sleep(self.sleep)
        return 0, ""


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[None]:
    task = asyncio.create_task(worker.run())
    try:
        yield
    finally:
        await worker.stop()
        await asyncio.wait_for(task, 60)


async def left(db: StateDB) -> int:
    stats = await db.read(lambda tx: tx.count_statuses(db.registry.entity(ENTITY)))
    return sum(n for s, n in stats.items() if s not in TERMINAL)


def terminate_others(url: str) -> int:
    """pg_terminate_backend every other connection to this database; how many."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND backend_type = 'client backend'").fetchall()
    return len(rows)


async def assert_each_ran_once(db: StateDB, ids: list[str], ex: Counting) -> None:
    twice = {k: n for k, n in Counter(ex.calls).items() if n > 1}
    assert twice == {}, f"ran more than once: {twice}"
    assert sorted(set(ex.calls)) == sorted(ids)
    statuses = await db.read(lambda tx: tx.read_statuses(db.registry.entity(ENTITY), ids))
    assert set(statuses.values()) == {"completed"}
    report = await verify(db)
    assert report.ok, report.drift[:5]


async def test_a_worker_survives_its_connections_being_killed(pg_target: str,
                                                             tmp_path: Path) -> None:
    """Every connection of the worker (pool and LISTEN) is terminated again and again,
    mid-claim, mid-renewal and mid-terminal-write: every task still runs exactly once."""
    n = 120
    ex = Counting(sleep=0.02)
    async with StateDB(pg_target) as db:
        ids = await submit_many(db, [TaskApplication("agent", {"i": i}, "host")
                                     for i in range(n)])
        # A lease long enough that no expiry can explain a second run.
        w = Worker(db, worker_id="host-a:faults", capacity=8, poll_interval=0.05,
                   lease_ttl=60.0, execute=ex, lock_dir=tmp_path / "locks",
                   handle_signals=False)
        kills = 0
        async with running(w):
            deadline = time.monotonic() + 90
            while await left(db) and time.monotonic() < deadline:
                await asyncio.sleep(0.15)
                kills += await asyncio.to_thread(terminate_others, pg_target)
        assert await left(db) == 0, "not every task finished"
        assert kills >= 5, kills
        await assert_each_ran_once(db, ids, ex)


def _cluster() -> tuple[str, str] | None:
    """(version, name) of the local cluster, when this machine manages one."""
    if shutil.which("pg_ctlcluster") is None or shutil.which("pg_lsclusters") is None:
        return None
    out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True,
                         check=False).stdout.split()
    return (out[0], out[1]) if len(out) >= 2 else None


@pytest.mark.slow
async def test_a_worker_survives_a_server_restart(pg_target: str, tmp_path: Path) -> None:
    """The server restarts (fast shutdown: every session is cut) while the worker drains
    the queue; it reconnects, and every task ends exactly once."""
    cluster = _cluster()
    if cluster is None:
        pytest.skip("no local PostgreSQL cluster to restart (pg_ctlcluster)")
    n = 200
    ex = Counting(sleep=0.1)
    async with StateDB(pg_target) as db:
        ids = await submit_many(db, [TaskApplication("agent", {"i": i}, "host")
                                     for i in range(n)])
        w = Worker(db, worker_id="host-b:restart", capacity=4, poll_interval=0.05,
                   lease_ttl=60.0, execute=ex, lock_dir=tmp_path / "locks",
                   handle_signals=False)
        async with running(w):
            while len(ex.calls) < 10:
                await asyncio.sleep(0.02)
            restart = await asyncio.to_thread(
                subprocess.run, ["pg_ctlcluster", "--skip-systemctl-redirect", cluster[0],
                                 cluster[1], "restart", "-m", "fast"],
                capture_output=True, text=True, check=False)
            assert restart.returncode == 0, restart.stderr
            assert len(ex.calls) < n, "the queue drained before the restart: make it longer"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                with contextlib.suppress(Exception):
                    if await left(db) == 0:
                        break
                await asyncio.sleep(0.2)
        assert await left(db) == 0, "not every task finished after the restart"
        await assert_each_ran_once(db, ids, ex)


async def test_a_submit_on_connections_the_server_closed_is_written_once(pg_target: str) -> None:
    """A plain submit is one statement, sent as a transaction of its own (no BEGIN, no
    COMMIT): on a pooled connection the server had closed, its outcome could not be told
    and it could not be retried. The connection is looked at first; a closed one sends
    the statement the way a lost connection fails before COMMIT, so it runs again."""
    async with StateDB(pg_target) as db:
        ids = [await submit_task(db, TaskApplication("agent", {"warm": i}, "host"))
               for i in range(3)]
        for i in range(3):
            assert terminate_others(pg_target) >= 1
            await asyncio.sleep(0.3)  # the server's goodbye reaches the pooled sockets
            ids.append(await submit_task(db, TaskApplication("agent", {"after": i}, "host")))
        policy = db.registry.entity(ENTITY)
        statuses = await db.read(lambda tx: tx.read_statuses(policy, ids))
        assert statuses == dict.fromkeys(ids, "queued")
        facts = [await db.read(lambda tx, r=r: tx.read_facts(ENTITY, r)) for r in ids]
        assert [len(f) for f in facts] == [1] * len(ids)
        report = await verify(db)
        assert report.ok, report.drift[:5]


async def test_a_unit_the_server_rolls_back_to_break_a_deadlock_runs_again(
        pg_target: str) -> None:
    """Two transactions taking locks in opposite orders (a migration's DDL beside a
    submit, say): PostgreSQL rolls one back whole to break the cycle (40P01). When that
    one is a unit of ours, nothing of it committed, so it runs again and commits once."""
    with psycopg.connect(pg_target, autocommit=True) as setup:
        setup.execute("CREATE TABLE lq_a (n bigint); CREATE TABLE lq_b (n bigint)")
    tries: list[int] = []

    def unit(tx: Any) -> int:
        tries.append(1)
        tx.execute("LOCK TABLE lq_a IN ACCESS EXCLUSIVE MODE")
        tx.execute("INSERT INTO lq_b VALUES (1)")
        return len(tries)

    async with StateDB(pg_target) as db:
        with psycopg.connect(pg_target, autocommit=True) as watch, \
                psycopg.connect(pg_target) as other:
            other.execute("SET deadlock_timeout = '60s'")  # the unit's check finds the cycle
            other.execute("LOCK TABLE lq_b IN ACCESS EXCLUSIVE MODE")
            write = asyncio.create_task(db.write(unit))
            for _ in range(500):  # until the unit waits for lq_b
                row = watch.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND "
                                    "relation = 'lq_b'::regclass").fetchone()
                if row and row[0]:
                    break
                await asyncio.sleep(0.02)
            await asyncio.to_thread(other.execute, "LOCK TABLE lq_a IN ACCESS EXCLUSIVE MODE")
            other.commit()
            assert await asyncio.wait_for(write, 30) == 2
            assert watch.execute("SELECT count(*) FROM lq_b").fetchone() == (1,)
