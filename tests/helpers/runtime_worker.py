"""A Worker in its own OS process, for the runtime and chaos tests.

    python runtime_worker.py --db PATH --worker-id ID [--markers FILE] [options]

Runs ``Worker.run()`` with ``handle_signals=True`` until SIGINT/SIGTERM, then exits 0.
Without ``--markers`` runs use the default executor (real child processes). With
``--markers FILE`` every run instead waits a little (``--hold``/``--keyed-hold``), appends
one line to FILE and returns ``(0, "")``::

    <run id> <worker id> <start> <end> <concurrency key or ->

written with O_APPEND in one ``write`` and fsync'ed before the run reports success, so a
line exists for every execution that finished, even if the process is SIGKILLed next.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from typing import Any

from ledgerq import StateDB
from ledgerq.queue import Worker
from ledgerq.queue.worker.launcher import ExecuteFn


def marker_executor(path: str, worker_id: str, hold: float, keyed_hold: float) -> ExecuteFn:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(line: bytes) -> None:
        os.write(fd, line)
        os.fsync(fd)

    async def execute(run: dict[str, Any]) -> tuple[int, str]:
        start = time.time()
        key = run.get("concurrency_key")
        pause = keyed_hold if key else random.uniform(0, hold)
        if pause > 0:
            await asyncio.sleep(pause)  # runs in flight when a worker is killed
        end = time.time()
        line = f"{run['id']} {worker_id} {start:.6f} {end:.6f} {key or '-'}\n"
        await asyncio.to_thread(append, line.encode())
        return 0, ""

    return execute


async def main(args: argparse.Namespace) -> None:
    async with StateDB(args.db, listen_url=args.listen_url) as db:
        execute = (marker_executor(args.markers, args.worker_id, args.hold, args.keyed_hold)
                   if args.markers else None)
        worker = Worker(
            db, worker_id=args.worker_id, capacity=args.capacity,
            poll_interval=args.poll_interval, lease_ttl=args.lease_ttl,
            advertised_capabilities=args.advertise, execute=execute,
            lock_dir=args.lock_dir, shutdown_grace=args.shutdown_grace,
            check_interval=args.check_interval, handle_signals=True,
        )
        print(f"ready {worker.worker_id}", flush=True)
        await worker.run()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--listen-url", help="the server's own URL when --db is a pooler's")
    p.add_argument("--worker-id", required=True)
    p.add_argument("--lock-dir", required=True)
    p.add_argument("--markers")
    p.add_argument("--hold", type=float, default=0.0, help="runs last up to this long")
    p.add_argument("--keyed-hold", type=float, default=0.0, help="keyed runs last this long")
    p.add_argument("--capacity", type=int, default=4)
    p.add_argument("--poll-interval", type=float, default=0.05)
    p.add_argument("--lease-ttl", type=float, default=30.0)
    p.add_argument("--shutdown-grace", type=float, default=10.0)
    p.add_argument("--check-interval", type=float, default=0.1)
    p.add_argument("--advertise", action="append", default=[])
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse(sys.argv[1:])))
