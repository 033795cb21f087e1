"""A worker process for test_queue_processes.py: worker_tick until the queue is drained.

usage: queue_worker_proc.py DB_PATH WORKER_ID GO_FILE LIMIT
Writes GO_FILE.<pid>.ready and waits for GO_FILE (so every process starts claiming at
once), then ticks until no row is queued or running; prints
{"worker": ..., "claimed": n} as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from ledgerq import StateDB
from ledgerq.queue import worker_tick


async def main(path: str, worker_id: str, go_file: str, limit: int) -> int:
    open(f"{go_file}.{os.getpid()}.ready", "w").close()
    deadline = time.monotonic() + 30
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit("go file never appeared")
        await asyncio.sleep(0.005)
    claimed = 0
    async with StateDB(path) as db:
        while time.monotonic() < deadline:
            got = await worker_tick(db, worker_id=worker_id, limit=limit)
            claimed += got["claimed"]
            if got["claimed"] == 0:
                left = await db.fetch_one(
                    "SELECT count(*) AS n FROM schedule_runs "
                    "WHERE status IN ('queued', 'running')")
                if left is not None and left["n"] == 0:
                    break
                await asyncio.sleep(0.005)
    print(json.dumps({"worker": worker_id, "claimed": claimed}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))
