"""What one PostgreSQL server costs per task, for docs/scaling.md: measured, not guessed.

Three figures, each on a scratch database created and dropped here:

1. **Bytes per lifecycle.** N tasks submitted and drained (claim + complete, 3 facts
   each); then the on-disk size (``pg_total_relation_size``: heap, TOAST and indexes) of
   the log and of the projection, per lifecycle.
2. **Claim pass cost against queue depth.** One claim pass of 10 rows over a queue of
   1k, 10k and 100k queued rows: the partial claim index keeps it flat, or it does not.
   Once with the table's statistics taken after the queue filled, once with them taken
   while it was empty (a burst of submits before autovacuum's next ANALYZE).
3. **Connections per worker.** A ``Worker(capacity=C)`` draining a queue: the most
   client connections it holds at once (``pg_stat_activity``), pool and LISTEN included.

    .venv/bin/python bench/pg_scaling.py            # ~1 minute
    .venv/bin/python bench/pg_scaling.py --depths 1000,10000
"""

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import statistics
import time
import urllib.parse
from typing import Any

import psycopg

from ledgerq import StateDB
from ledgerq.queue import TaskApplication, Worker, submit_many
from ledgerq.queue.worker.claim import claim_runs

ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
APP = TaskApplication("agent", {"prompt": "hello", "n": 1}, "host")


def scratch(admin: str, name: str) -> str:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(admin)._replace(path=f"/{name}"))


def drop(admin: str, name: str) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def ok(_run: dict[str, Any]) -> tuple[int, str]:
    return 0, ""


async def drain(db: StateDB, n: int, capacity: int, url: str) -> int:
    """Run one worker until ``n`` runs completed; the most connections seen meanwhile."""
    w = Worker(db, worker_id="scaling:w1", capacity=capacity, poll_interval=0.05,
               execute=ok, handle_signals=False)
    task = asyncio.create_task(w.run())
    peak = 0
    with psycopg.connect(url, autocommit=True) as watcher:
        while True:
            got = watcher.execute(
                "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = "
                "current_database() AND backend_type = 'client backend' AND pid <> "
                "pg_backend_pid()), (SELECT count(*) FROM schedule_runs WHERE status = "
                "'completed')").fetchone()
            assert got is not None
            peak = max(peak, int(got[0]))
            if got[1] >= n:
                break
            await asyncio.sleep(0.05)
    await w.stop()
    await task
    return peak


async def sizes(url: str, n: int, capacity: int) -> dict[str, float]:
    async with StateDB(url) as db:
        for i in range(0, n, 1000):
            await submit_many(db, [APP] * min(1000, n - i))
        peak = await drain(db, n, capacity, url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
            row = conn.execute(
                "SELECT pg_total_relation_size('status_transitions'), "
                "pg_relation_size('status_transitions'), "
                "pg_total_relation_size('schedule_runs'), "
                "(SELECT count(*) FROM status_transitions)").fetchone()
            assert row is not None
        log_total, log_heap, runs_total, facts = row
    return {"log bytes/lifecycle": log_total / n, "log heap bytes/fact": log_heap / facts,
            "runs bytes/row": runs_total / n, "facts/lifecycle": facts / n,
            "peak connections": float(peak)}


async def claim_cost(url: str, depth: int, rounds: int = 20, analyzed: bool = True) -> float:
    """Median seconds of one 10-row claim pass over ``depth`` queued rows (each pass
    claims the next 10). ``analyzed``: statistics taken after the queue filled (VACUUM
    ANALYZE); else taken while it was empty, as a burst of submits leaves them until
    autovacuum's next ANALYZE (kept off for the measurement)."""
    async with StateDB(url) as db:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ANALYZE")
            conn.execute("ALTER TABLE schedule_runs SET (autovacuum_enabled = false)")
        for i in range(0, depth, 5000):
            await submit_many(db, [APP] * min(5000, depth - i))
        with psycopg.connect(url, autocommit=True) as conn:
            if analyzed:
                conn.execute("VACUUM ANALYZE")
        times = []
        for r in range(rounds):
            t0 = time.perf_counter()
            got = await claim_runs(db, worker_id=f"scaling:c{r}", limit=10,
                                   excluded_kinds=())
            times.append(time.perf_counter() - t0)
            assert len(got.claimed) == 10, got
    return statistics.median(times)


async def main(args: argparse.Namespace) -> None:
    name = f"ledgerq_scaling_{os.getpid()}"
    try:
        url = scratch(args.dsn, name)
        got = await sizes(url, args.n, args.capacity)
        print(f"{args.n} lifecycles, Worker(capacity={args.capacity}):")
        for k, v in got.items():
            print(f"  {k:24} {v:10.1f}")
        print("claim pass of 10 rows, median of 20 (ms), with statistics taken:")
        print(f"  {'':>14} {'after filling':>14} {'while empty':>12}")
        for depth in args.depths:
            costs = []
            for analyzed in (True, False):
                url = scratch(args.dsn, name)
                costs.append(await claim_cost(url, depth, analyzed=analyzed))
            print(f"  {depth:>7} queued {costs[0] * 1000:14.2f} {costs[1] * 1000:12.2f}")
    finally:
        drop(args.dsn, name)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dsn", default=ADMIN, help="admin URL (creates/drops a scratch db)")
    p.add_argument("--n", type=int, default=5000, help="lifecycles for the size figures")
    p.add_argument("--capacity", type=int, default=10)
    p.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1000, 10000, 100000])
    asyncio.run(main(p.parse_args()))
