"""Facts folded per second by rebuild() and verify(), beside a floor in the same run.

Builds a database of N runs with real lifecycles through the engine (submit, claim under
a lease, complete: three facts per run; not timed), then times, each R rounds:

  rebuild   ledgerq.projections.rebuild(): DELETE every row, fold the log, INSERT rows
  verify    ledgerq.projections.verify(): quick_check, then fold and compare every row
  floor     plain sqlite3 on the same file: read every fact in the log's index order
            and INSERT the already-folded rows (DELETE first), one transaction; no
            JSON decoding, no folding, no asyncio — what any rebuild must at least do

    .venv/bin/python bench/rebuild.py                 # 10k, 50k and 100k runs
    .venv/bin/python bench/rebuild.py --n 20000 --rounds 1
"""

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
from __future__ import annotations

import os
import sys

# Run as a script, this directory is sys.path[0]; bench/queue.py would then shadow the
# standard library's queue, which aiosqlite imports.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.lifecycle import Actor, StateReason
from ledgerq.lifecycle.engine import apply_move
from ledgerq.projections import rebuild, verify
from ledgerq.queue import TaskApplication, submit_many

APP = TaskApplication(action_kind="command", args={"argv": ["true"]}, execution_target="host")
ACTOR = Actor(type="system", id="bench")
BATCH = 5000


async def build(path: Path, n: int) -> None:
    async with StateDB(path) as db:
        policy = db.registry.entity("schedule_run")
        claim = StateReason(code="run.started.ok")
        done = StateReason(code="run.completed.ok")
        for start in range(0, n, BATCH):
            ids = await submit_many(db, [APP] * min(BATCH, n - start))

            def lifecycle(conn: sqlite3.Connection, ids: list[str] = ids) -> None:
                for rid in ids:
                    apply_move(conn, policy, rid, "queued", "running", claim, ACTOR,
                               patch={"leased_by": "bench", "lease_expires_at": 4e9})
                    apply_move(conn, policy, rid, "running", "completed", done, ACTOR,
                               patch={"ended_at": 1.0, "exit_code": 0})

            await db.write(lifecycle)


def floor(path: Path) -> tuple[float, int]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        rows = conn.execute("SELECT * FROM schedule_runs").fetchall()
        cols = [d[0] for d in conn.execute("SELECT * FROM schedule_runs LIMIT 1").description]
        sql = (f"INSERT INTO schedule_runs ({', '.join(cols)}) "
               f"VALUES ({', '.join('?' * len(cols))})")
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("PRAGMA defer_foreign_keys = ON")
        facts = sum(1 for _ in conn.execute(
            "SELECT entity_id, status, entity_version, patch FROM status_transitions "
            "WHERE entity_type = 'schedule_run' ORDER BY entity_id, entity_version"))
        conn.execute("DELETE FROM schedule_runs")
        conn.executemany(sql, rows)
        conn.execute("COMMIT")
        return time.perf_counter() - start, facts
    finally:
        conn.close()


async def timed(path: Path, what: str) -> tuple[float, int]:
    async with StateDB(path) as db:
        start = time.perf_counter()
        report: Any = await (rebuild(db) if what == "rebuild" else verify(db))
        elapsed = time.perf_counter() - start
        if what == "verify":
            assert report.ok, report.drift[:3]
        return elapsed, report.facts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="runs (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = args.n or [10_000, 50_000, 100_000]
    print(f"{'runs':>8} {'facts':>8} {'rebuild f/s':>12} {'verify f/s':>11} "
          f"{'floor f/s':>10} {'rebuild/floor':>14}")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "state.db"
            asyncio.run(build(path, n))
            best: dict[str, float] = {}
            facts = 0
            for _ in range(args.rounds):
                for what in ("rebuild", "verify", "floor"):
                    elapsed, facts = (floor(path) if what == "floor"
                                      else asyncio.run(timed(path, what)))
                    best[what] = min(best.get(what, elapsed), elapsed)
            rates = {k: facts / v for k, v in best.items()}
            print(f"{n:>8} {facts:>8} {rates['rebuild']:>12,.0f} {rates['verify']:>11,.0f} "
                  f"{rates['floor']:>10,.0f} {rates['rebuild'] / rates['floor']:>13.2f}x",
                  flush=True)


if __name__ == "__main__":
    main()
