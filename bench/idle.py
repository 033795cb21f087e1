"""An idle worker's CPU: flat in the number of schedules and in the size of rows it
cannot serve. Beside the floor of an idle worker on an empty database, in the same run.

Each case fills a fresh SQLite database (not timed), starts a ``Worker`` (its scheduler
on), lets it settle for 2 s, then measures the process's CPU time over ``--seconds``:

  floor      an empty database
  schedules  N daily cron schedules (none due while measured)
  caps       60 queued runs the worker cannot serve, each requiring 64 capabilities
             (the most SubmitLimits allows)

    .venv/bin/python bench/idle.py --schedules 3000 --seconds 10
"""

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import resource
import tempfile
import time
from pathlib import Path

from ledgerq import StateDB
from ledgerq.queue import TaskApplication, Worker, add_schedule, submit_many
from ledgerq.queue.submission.application import MAX_CAPABILITIES

APP = TaskApplication("command", {"argv": ["true"]}, "host")


async def idle_cpu(path: str, *, schedules: int, caps: int, seconds: float) -> float:
    """Percent of one core the idle worker used."""
    async with StateDB(path) as db:
        for i in range(schedules):
            await add_schedule(db, f"s{i}", cron=f"{i % 60} {i % 24} * * *", application=APP)
        if caps:
            await submit_many(db, [TaskApplication(
                "command", {"argv": ["true"]}, "host",
                required_capabilities=[f"c{j}" for j in range(caps)]) for _ in range(60)])
        worker = Worker(db, lock_dir=None, handle_signals=False)
        serving = asyncio.create_task(worker.run())
        await asyncio.sleep(2)
        r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        await asyncio.sleep(seconds)
        r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        await worker.stop()
        await serving
    used = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return 100 * used / (t1 - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=3000)
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("floor", 0, 0), (f"{args.schedules:,} schedules", args.schedules, 0),
                 (f"60 runs x {MAX_CAPABILITIES} caps", 0, MAX_CAPABILITIES)]
        for i, (name, schedules, caps) in enumerate(cases):
            pct = asyncio.run(idle_cpu(str(Path(tmp) / f"{i}.db"), schedules=schedules,
                                       caps=caps, seconds=args.seconds))
            print(f"{name:>22}: {pct:5.1f}% of a core", flush=True)


if __name__ == "__main__":
    main()
