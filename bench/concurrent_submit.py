"""Concurrent single submits: joined in one unit per turn of the loop, or each alone.

C coroutines (default 64) each call ``submit_task`` M times, on one StateDB, on a fresh
SQLite file (``--synchronous``, default FULL) and on a scratch PostgreSQL database
(created from ``--dsn`` and dropped after). Two ways, interleaved over ``--rounds``:

  joined  submit_task(db, app): the submits made in one turn share a write unit
          (ledgerq.queue.submission.joined): one transaction and one commit, their rows and facts
          written together
  alone   submit_task(db, app, now=time.time()): a given time never joins, so every
          submit is a unit of its own, as every submit was before joining (on SQLite
          the units of one turn still share a group commit; on PostgreSQL each is its
          own transaction on a pooled connection)

Printed per backend: submits/s and process CPU per submit (all threads) for each, and
joined / alone as the median of the rounds' own ratios [min, max].

    .venv/bin/python bench/concurrent_submit.py [--rounds 5] [--callers 64] [--each 30]
    .venv/bin/python bench/concurrent_submit.py --only sqlite
"""

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
from __future__ import annotations

import os
import sys

# bench/queue.py would shadow the standard library's queue (which aiosqlite imports).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from ledgerq import StateDB
from ledgerq.queue import TaskApplication, submit_task

sys.path.append(_HERE)  # last, so the stdlib's queue still wins
from pg_scaling import ADMIN, drop, scratch

sys.path.append(_HERE)  # (importing pg_scaling dropped it again)
from rounds import Ratio, ratio

APP = TaskApplication("command", {"argv": ["true"]}, "host")
WAYS = ("joined", "alone")


async def submitters(target: str, way: str, callers: int, each: int, sync: str
                     ) -> tuple[float, float]:
    """Submits/s and CPU us per submit of ``callers`` coroutines submitting ``each``."""
    async with StateDB(target, synchronous=sync) as db:  # type: ignore[arg-type]
        async def caller() -> None:
            for _ in range(each):
                if way == "joined":
                    await submit_task(db, APP)
                else:
                    await submit_task(db, APP, now=time.time())

        await asyncio.gather(*(caller() for _ in range(min(callers, 8))))  # warm-up
        c0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(callers)))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        n = callers * each
        return n / seconds, cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--callers", type=int, default=64)
    ap.add_argument("--each", type=int, default=30)
    ap.add_argument("--synchronous", default="FULL", choices=["FULL", "NORMAL"])
    ap.add_argument("--dsn", default=ADMIN, help="admin URL (creates/drops a scratch db)")
    ap.add_argument("--only", choices=["sqlite", "postgresql"])
    args = ap.parse_args()
    backends = [args.only] if args.only else ["sqlite", "postgresql"]
    print(f"{args.callers} concurrent callers x {args.each} submit_task each, "
          f"{args.rounds} interleaved round(s); SQLite at synchronous={args.synchronous}")
    for backend in backends:
        got: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
        with tempfile.TemporaryDirectory(prefix="ledgerq-bench-") as d:
            for r in range(args.rounds):
                for way in WAYS:
                    if backend == "sqlite":
                        target = str(Path(d) / f"{way}-{r}.db")
                    else:
                        name = f"ledgerq_bench_{os.getpid()}_{way}_{r}"
                        target = scratch(args.dsn, name)
                    try:
                        got[way].append(asyncio.run(submitters(
                            target, way, args.callers, args.each, args.synchronous)))
                    finally:
                        if backend != "sqlite":
                            drop(args.dsn, name)
        print(f"\n{backend}:")
        for way in WAYS:
            rate = statistics.median(r for r, _ in got[way])
            cpu = statistics.median(c for _, c in got[way])
            print(f"  {way:<7} {rate:9,.0f} submits/s  {cpu:6.0f} us CPU a submit")
        print(f"  joined / alone: rate {of(got, 0)}, CPU a submit {of(got, 1)}")


def of(got: dict[str, list[tuple[float, float]]], i: int) -> Ratio:
    """joined / alone of figure ``i`` (0: the rate, 1: CPU a submit), round by round."""
    return ratio([g[i] for g in got["joined"]], [g[i] for g in got["alone"]])


if __name__ == "__main__":
    main()
