"""A Worker with its scheduler pass, in its own OS process: one "host" of the scheduler tests.

    python scheduler_proc.py --db TARGET --worker-id ID --markers FILE [--hang-in-fire FILE]

Runs ``Worker.run()`` (scheduler on) with the marker executor of runtime_worker.py: every
execution appends one fsync'ed line ``<run id> <worker id> ...`` to FILE. With
``--hang-in-fire FILE`` the first fire that creates runs stops inside its transaction,
before the commit: it writes FILE and sleeps, so the test can SIGKILL the process
mid-fire (that transaction then never commits).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from runtime_worker import marker_executor

from ledgerq import StateDB
from ledgerq.queue import Worker
from ledgerq.queue.scheduling import scheduler


def hang_in_first_fire(flag: Path) -> None:
    real = scheduler.fire_schedule

    def fire(*args: Any, **kwargs: Any) -> scheduler.FirePass:
        done = real(*args, **kwargs)
        if done.fired and not flag.exists():
            flag.write_text("in fire\n")
            time.sleep(3600)  # inside the write unit: the transaction stays open
        return done

    scheduler.fire_schedule = fire  # type: ignore[assignment]


async def main(args: argparse.Namespace) -> None:
    if args.hang_in_fire:
        hang_in_first_fire(Path(args.hang_in_fire))
    async with StateDB(args.db) as db:
        worker = Worker(db, worker_id=args.worker_id, capacity=4, poll_interval=0.02,
                        lease_ttl=args.lease_ttl, check_interval=0.1, lock_dir=None,
                        execute=marker_executor(args.markers, args.worker_id, 0.0, 0.0),
                        handle_signals=True, shutdown_grace=5.0)
        print(f"ready {worker.worker_id}", flush=True)
        await worker.run()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--markers", required=True)
    p.add_argument("--lease-ttl", type=float, default=2.0)
    p.add_argument("--hang-in-fire")
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
