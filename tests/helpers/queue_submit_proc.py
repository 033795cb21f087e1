"""A submitter process for test_queue_processes.py: one idempotent submission.

usage: queue_submit_proc.py DB_PATH IDEMPOTENCY_KEY GO_FILE
Writes GO_FILE.<pid>.ready, waits for GO_FILE, then submits the application every
process submits and prints the run id it got back.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from ledgerq import StateDB
from ledgerq.queue import TaskApplication, submit_task


async def main(path: str, key: str, go_file: str) -> int:
    async with StateDB(path) as db:
        open(f"{go_file}.{os.getpid()}.ready", "w").close()
        deadline = time.monotonic() + 30
        while not os.path.exists(go_file):
            if time.monotonic() > deadline:
                raise SystemExit("go file never appeared")
            await asyncio.sleep(0.002)
        app = TaskApplication("agent", {"prompt": "once"}, "host", idempotency_key=key)
        print(await submit_task(db, app))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3])))
