"""Cancelling the head of a dependency chain: runs cancelled per second, at several
lengths, beside a floor in the same run, and how long a concurrent submit waits.

For each length N, a fresh SQLite database holds a chain of N runs (each waiting on the
one before; not timed). Then, each on a fresh copy of the file:

  cascade   ledgerq.queue.cancel_task(head): every run down the chain cancelled, each
            with its own fact, in transactions of CASCADE_CHUNK waiting runs; a submit
            issued meanwhile (from the same event loop) is timed too
  floor     plain sqlite3 on the same file: one UPDATE per run of the chain (status,
            ended_at, version) and one INSERT of a fact-sized row into a side table,
            found by walking the chain in memory, all in one transaction

Linear means the per-run time stays flat as N grows (a lookup per cancelled run made it
grow with N).

    .venv/bin/python bench/cascade.py --n 1250 --n 5000 --n 10000
"""

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from ledgerq import StateDB
from ledgerq.lifecycle import Actor
from ledgerq.queue import TaskApplication, cancel_task, submit_task

APP = TaskApplication("command", {"argv": ["true"]}, "host")
OPERATOR = Actor(type="operator", id="bench")


async def fill(path: str, n: int) -> str:
    async with StateDB(path) as db:
        head = prev = await submit_task(db, APP)
        for _ in range(n - 1):
            prev = await submit_task(db, TaskApplication(
                "command", {"argv": ["true"]}, "host", depends_on=[prev]))
    return head


async def cascade(path: str, head: str) -> tuple[float, float]:
    async with StateDB(path) as db:
        waited = 0.0

        async def submit() -> None:
            nonlocal waited
            await asyncio.sleep(0.001)
            t = time.perf_counter()
            await submit_task(db, APP)
            waited = time.perf_counter() - t

        t0 = time.perf_counter()
        await asyncio.gather(cancel_task(db, head, actor=OPERATOR), submit())
        took = time.perf_counter() - t0
        row = await db.fetch_one("SELECT COUNT(*) AS n FROM schedule_runs "
                                 "WHERE status = 'waiting_dependency'", ())
        assert row is not None and row["n"] == 0, "the cascade left runs waiting"
    return took, waited


def floor(path: str, head: str) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    rows = conn.execute("SELECT id, depends_on FROM schedule_runs "
                        "WHERE status = 'waiting_dependency'").fetchall()
    below: dict[str, list[str]] = {}
    for rid, deps in rows:
        for d in json.loads(deps):
            below.setdefault(d, []).append(rid)
    t0 = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TEMP TABLE side (id TEXT, entity_id TEXT, reason TEXT, at REAL)")
    todo, now = list(below.get(head, [])), time.time()
    while todo:
        rid = todo.pop()
        conn.execute("UPDATE schedule_runs SET status = 'cancelled', ended_at = ?, "
                     "version = version + 1 WHERE id = ? AND status = 'waiting_dependency'",
                     (now, rid))
        conn.execute("INSERT INTO side VALUES (?, ?, ?, ?)",
                     (rid + "-f", rid, '{"code": "run.cancelled.dependency_failed"}', now))
        todo += below.get(rid, [])
    conn.execute("COMMIT")
    took = time.perf_counter() - t0
    conn.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, action="append", help="chain length (repeatable)")
    args = ap.parse_args()
    lengths = args.n or [1250, 5000, 10000]
    print(f"{'N':>7} {'cascade s':>10} {'runs/s':>9} {'floor s':>8} {'x floor':>8} "
          f"{'us/run':>7} {'submit waited s':>16}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in lengths:
            base = str(Path(tmp) / f"chain-{n}.db")
            head = asyncio.run(fill(base, n))
            mine, theirs = str(Path(tmp) / "a.db"), str(Path(tmp) / "f.db")
            for copy in (mine, theirs):
                shutil.copy(base, copy)
            took, waited = asyncio.run(cascade(mine, head))
            plain = floor(theirs, head)
            print(f"{n:>7,} {took:>10.3f} {n / took:>9,.0f} {plain:>8.3f} "
                  f"{plain / took:>7.2f}x {took / n * 1e6:>7.0f} {waited:>16.3f}")
            for f in Path(tmp).glob("[af].db*"):
                f.unlink()


if __name__ == "__main__":
    main()
