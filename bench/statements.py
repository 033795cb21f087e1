"""Statements per task: what a submit and a worker's share of a lifecycle send the database.

A count, not a timing, so it is the one performance figure the machine's speed does not
move: every statement a SQL transaction runs goes through ``SqlTx.execute`` (the shared
operations) or a dialect's override, so wrapping both dialects' ``execute`` counts them
all (BEGIN/COMMIT and savepoints issued by the backends' own plumbing are not counted);
an ``executemany`` call counts once (its rows go out together).
Submits N tasks one at a time, then a Worker (capacity 10, no-op executor) drains them;
prints statements per task for each phase and the most frequent statements.

    .venv/bin/python bench/statements.py                       # SQLite, a temporary file
    .venv/bin/python bench/statements.py --pg                  # a scratch PostgreSQL database
"""

from __future__ import annotations

import os
import sys

# ruff: noqa: E402  (bench/queue.py would shadow the standard library's queue)
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import collections
import tempfile
from collections.abc import Sequence
from typing import Any

import psycopg

from ledgerq import StateDB
from ledgerq.queue import TaskApplication, Worker, submit_task
from ledgerq.store.postgres.tx import PostgresTx
from ledgerq.store.sqlite.tx import SqliteTx

COUNTS: collections.Counter[str] = collections.Counter()
ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _count(cls: Any) -> None:
    real = cls.execute

    def execute(self: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        COUNTS[" ".join(sql.split())[:70]] += 1
        return real(self, sql, params)

    cls.execute = execute
    many = cls.executemany

    def executemany(self: Any, sql: str, rows: Any) -> None:
        # One call (psycopg sends the rows in one pipeline): counted once, marked.
        COUNTS["(executemany) " + " ".join(sql.split())[:55]] += 1
        many(self, sql, rows)

    cls.executemany = executemany


async def _noop(run: dict[str, Any]) -> tuple[int, str]:
    return 0, ""


async def measure(target: str, n: int) -> tuple[collections.Counter[str], collections.Counter[str]]:
    async with StateDB(target) as db:
        COUNTS.clear()
        for i in range(n):
            await submit_task(db, TaskApplication("command", {"argv": ["true", str(i)]}, "host"))
        submitted = COUNTS.copy()
        COUNTS.clear()
        worker = Worker(db, worker_id="statements", execute=_noop, capacity=10, lock_dir=None,
                        handle_signals=False, scheduler=False)
        serving = asyncio.create_task(worker.run())
        while sum(worker.outcomes.values()) < n:
            await asyncio.sleep(0.01)
        await worker.stop()
        await serving
        return submitted, COUNTS.copy()


def report(name: str, counts: collections.Counter[str], n: int) -> None:
    print(f"{name}: {sum(counts.values()) / n:.2f} statements per task")
    for sql, k in counts.most_common(8):
        print(f"  {k / n:6.2f}  {sql}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--pg", action="store_true", help="a scratch database on --dsn's server")
    ap.add_argument("--dsn", default=ADMIN, help="admin DSN (CREATE/DROP DATABASE only)")
    args = ap.parse_args()
    _count(SqliteTx)
    _count(PostgresTx)
    with tempfile.TemporaryDirectory(prefix="ledgerq-statements-") as tmp:
        if not args.pg:
            submitted, drained = asyncio.run(measure(os.path.join(tmp, "s.db"), args.n))
        else:
            name = f"ledgerq_statements_{os.getpid()}"
            with psycopg.connect(args.dsn, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            try:
                target = f"{args.dsn.rsplit('/', 1)[0]}/{name}"
                submitted, drained = asyncio.run(measure(target, args.n))
            finally:
                with psycopg.connect(args.dsn, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    report("submit", submitted, args.n)
    report("worker", drained, args.n)


if __name__ == "__main__":
    main()
