"""Runs and facts archived per second by ``archive_runs``, beside a floor in the same run.

Fills a SQLite database with N ended runs (submit, claim under a lease, complete: three
facts each; half ended 30 days ago, half today), not timed: two runs go through the engine
as templates, and the rest are their clones (new ids, same values) inserted with plain
``executemany``, so a million runs fill in about a minute instead of an hour. ``verify``
checks the fill. Then, each on a fresh copy of the filled file, it times:

  archive   ledgerq.queue.maintenance.archive.archive_runs(before=15 days ago): the old half and all
            their facts into a new SQLite archive file, in one transaction
  floor     plain sqlite3 on the same file: one transaction that lists the same runs in
            ledgerq_archive_batch (the log's DELETE guard admits nothing else), copies
            their rows and facts into a new SQLite file (fsynced), deletes facts and rows,
            commits: no reference checks, no counts checked, no asyncio

With ``--kept-chain N`` it times instead an archive that keeps everything: N old
ended runs, each run again (``retry_run``) by the next, the last run again still queued,
so a staying row refers to the whole chain; beside a floor of one plain recursive query
that finds the same chain. Linear means the time per kept run stays flat as N grows.

    .venv/bin/python bench/archive.py --n 1000000
    .venv/bin/python bench/archive.py --n 100000 --rounds 2
    .venv/bin/python bench/archive.py --kept-chain 1500 --kept-chain 6000
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
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, default_registry, transition
from ledgerq.lifecycle.engine import new_id
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, cancel_task, retry_run, submit_task
from ledgerq.queue.maintenance.archive import archive_runs

APP = TaskApplication(action_kind="command", args={"argv": ["true"]}, execution_target="host")
ACTOR = Actor(type="system", id="bench")
DAY = 86400.0
BATCH = 20_000


async def _template(db: StateDB, ended: float) -> str:
    rid = await submit_task(db, APP, now=ended - 10)
    for to, code, patch in (
            ("running", "run.started.ok", {"leased_by": "bench", "lease_expires_at": ended + 60}),
            ("completed", "run.completed.ok", {"ended_at": ended, "exit_code": 0})):
        done = await transition(db, TransitionRequest(
            entity_type="schedule_run", entity_id=rid, from_state=None, to_state=to,
            reason=StateReason(code=code), actor=ACTOR, idempotency_key=new_id()), patch=patch,
            now=ended - 5 if to == "running" else ended)
        assert done.applied
    return rid


def fill(path: Path, n: int, now: float) -> None:
    async def templates() -> list[str]:
        async with StateDB(path) as db:
            return [await _template(db, now - 30 * DAY), await _template(db, now)]

    old, new = asyncio.run(templates())
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        cur = conn.execute("SELECT * FROM schedule_runs WHERE id IN (?, ?)", (old, new))
        cols = [d[0] for d in cur.description]
        rows = {r[0]: list(r) for r in cur.fetchall()}
        fcur = conn.execute("SELECT * FROM status_transitions WHERE entity_id IN (?, ?) "
                            "ORDER BY entity_version", (old, new))
        fcols = [d[0] for d in fcur.description]
        facts: dict[str, list[list[Any]]] = {old: [], new: []}
        for f in fcur.fetchall():
            facts[f[fcols.index("entity_id")]].append(list(f))
        run_sql = (f"INSERT INTO schedule_runs ({', '.join(cols)}) "
                   f"VALUES ({', '.join('?' * len(cols))})")
        fact_sql = (f"INSERT INTO status_transitions ({', '.join(fcols)}) "
                    f"VALUES ({', '.join('?' * len(fcols))})")
        fid, feid, fpatch = fcols.index("id"), fcols.index("entity_id"), fcols.index("patch")
        conn.execute("BEGIN IMMEDIATE")
        for start in range(2, n, BATCH):
            run_rows, fact_rows = [], []
            for i in range(start, min(n, start + BATCH)):
                tmpl = old if i % 2 == 0 else new
                rid = new_id()
                row = list(rows[tmpl])
                row[0] = rid
                run_rows.append(row)
                for f in facts[tmpl]:
                    g = list(f)
                    g[fid], g[feid], g[fpatch] = new_id(), rid, f[fpatch].replace(tmpl, rid)
                    fact_rows.append(g)
            conn.executemany(run_sql, run_rows)
            conn.executemany(fact_sql, fact_rows)
        conn.execute("COMMIT")
    finally:
        conn.close()


def floor(path: Path, out: Path, before: float) -> tuple[float, int, int]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        cols = [d[0] for d in conn.execute("SELECT * FROM schedule_runs LIMIT 0").description]
        fcols = [d[0] for d in conn.execute(
            "SELECT * FROM status_transitions LIMIT 0").description]
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        ended = sorted(default_registry().entity("schedule_run").terminal)
        conn.execute("INSERT INTO ledgerq_archive_batch SELECT 'schedule_run', id "
                     f"FROM schedule_runs WHERE status IN ({', '.join('?' * len(ended))}) "
                     "AND COALESCE(updated_at, created_at) < ?", (*ended, before))
        dest = sqlite3.connect(out, isolation_level=None)
        dest.execute("PRAGMA journal_mode = OFF")
        dest.execute("BEGIN")
        dest.execute(f"CREATE TABLE schedule_runs ({', '.join(cols)})")
        dest.execute(f"CREATE TABLE status_transitions ({', '.join(fcols)}, "
                     "PRIMARY KEY (entity_id, entity_version))")
        dest.executemany(f"INSERT INTO schedule_runs VALUES ({', '.join('?' * len(cols))})",
                         conn.execute("SELECT r.* FROM ledgerq_archive_batch b JOIN "
                                      "schedule_runs r ON r.id = b.entity_id ORDER BY b.entity_id"))
        dest.executemany(
            f"INSERT INTO status_transitions VALUES ({', '.join('?' * len(fcols))})",
            conn.execute("SELECT f.* FROM ledgerq_archive_batch b JOIN status_transitions f "
                         "ON f.entity_type = b.entity_type AND f.entity_id = b.entity_id "
                         "ORDER BY f.entity_id, f.entity_version"))
        dest.execute("COMMIT")
        dest.close()
        fd = os.open(out, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        facts = conn.execute("DELETE FROM status_transitions WHERE entity_type = 'schedule_run' "
                             "AND entity_id IN (SELECT entity_id FROM ledgerq_archive_batch)"
                             ).rowcount
        runs = conn.execute("DELETE FROM schedule_runs WHERE id IN "
                            "(SELECT entity_id FROM ledgerq_archive_batch)").rowcount
        conn.execute("DELETE FROM ledgerq_archive_batch")
        conn.execute("COMMIT")
        return time.perf_counter() - start, runs, facts
    finally:
        conn.close()


def timed(path: Path, out: Path, before: float) -> tuple[float, int, int]:
    async def go() -> tuple[float, int, int]:
        async with StateDB(path) as db:
            start = time.perf_counter()
            summary = await archive_runs(db, before=before, to=out)
            elapsed = time.perf_counter() - start
            report = await verify(db)
            assert report.ok, report.drift[:3]
            return elapsed, summary.runs, summary.facts

    return asyncio.run(go())


async def check(path: Path) -> None:
    async with StateDB(path) as db:
        report = await verify(db)
        assert report.ok, report.drift[:3]


def kept_chain(tmp: Path, n: int) -> tuple[float, float]:
    """(archive s, floor s) for a chain of n old ended runs a live run continues."""
    path = Path(tmp) / f"chain-{n}.db"
    old = time.time() - 30 * DAY

    async def go() -> float:
        async with StateDB(path) as db:
            rid = await submit_task(db, APP, now=old)
            for _ in range(n):
                await cancel_task(db, rid, actor=ACTOR, now=old)
                rid = await retry_run(db, rid, now=old)
            start = time.perf_counter()
            summary = await archive_runs(db, before=old + DAY, to=Path(tmp) / f"k-{n}.sqlite")
            took = time.perf_counter() - start
            assert (summary.runs, summary.skipped) == (0, n), summary
            return took

    took = asyncio.run(go())
    conn = sqlite3.connect(path, isolation_level=None)
    start = time.perf_counter()
    (found,) = conn.execute(
        "WITH RECURSIVE kept(id) AS (SELECT chain_parent_id FROM schedule_runs "
        "WHERE status = 'queued' AND chain_parent_id IS NOT NULL UNION "
        "SELECT r.chain_parent_id FROM schedule_runs AS r JOIN kept ON r.id = kept.id "
        "WHERE r.chain_parent_id IS NOT NULL) SELECT COUNT(*) FROM kept").fetchone()
    plain = time.perf_counter() - start
    conn.close()
    assert found == n, found
    return took, plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, action="append", help="runs (repeatable)")
    parser.add_argument("--kept-chain", type=int, action="append",
                        help="time an archive keeping a chain of this many runs (repeatable)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=None,
                        help="where the scratch files go (default: a temporary directory)")
    args = parser.parse_args()
    if args.kept_chain:
        print(f"{'kept':>8} {'archive s':>10} {'us/run':>7} {'floor s':>8} {'vs floor':>9}")
        for n in args.kept_chain:
            with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
                took, plain = kept_chain(Path(tmp), n)
            print(f"{n:>8,} {took:>10.3f} {took / n * 1e6:>7.0f} {plain:>8.3f} "
                  f"{plain / took:>8.2f}x", flush=True)
        return
    sizes = args.n or [10_000, 100_000]
    print(f"{'runs':>8} {'archived':>9} {'facts':>8} {'fill s':>7} {'archive s':>10} "
          f"{'runs/s':>9} {'facts/s':>10} {'floor s':>8} {'floor f/s':>10} {'vs floor':>9}",
          flush=True)
    for n in sizes:
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            base = Path(tmp) / "filled.db"
            now = time.time()
            t0 = time.perf_counter()
            fill(base, n, now)
            filled = time.perf_counter() - t0

            asyncio.run(check(base))
            best: dict[str, tuple[float, int, int]] = {}
            for r in range(args.rounds):
                for what in ("archive", "floor"):
                    work = Path(tmp) / f"{what}.db"
                    shutil.copy(base, work)
                    out = Path(tmp) / f"{what}-{r}.sqlite"
                    got = (timed if what == "archive" else floor)(work, out, now - 15 * DAY)
                    if what not in best or got[0] < best[what][0]:
                        best[what] = got
                    work.unlink()
                    out.unlink()
            (a, runs, facts), (f, fruns, ffacts) = best["archive"], best["floor"]
            assert (runs, facts) == (fruns, ffacts), (best)
            print(f"{n:>8} {runs:>9} {facts:>8} {filled:>7.1f} {a:>10.2f} {runs / a:>9,.0f} "
                  f"{facts / a:>10,.0f} {f:>8.2f} {facts / f:>10,.0f} {f / a:>8.2f}x",
                  flush=True)


if __name__ == "__main__":
    main()
