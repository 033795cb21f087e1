"""A process that opens a database with a spec directory, for concurrent-open tests.

usage: open_with_specs.py TARGET SPECS GO_FILE
Writes GO_FILE.<pid>.ready, waits for GO_FILE (so every opener starts at once), opens
the database and prints {"migrated": bool} as JSON: whether this open migrated it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from ledgerq import StateDB
from ledgerq.lifecycle.registry import load_registry


async def main(target: str, specs: str, go_file: str) -> int:
    registry = load_registry(specs)
    open(f"{go_file}.{os.getpid()}.ready", "w").close()
    deadline = time.monotonic() + 30
    while not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise SystemExit("go file never appeared")
        await asyncio.sleep(0.002)
    async with StateDB(target, registry=registry) as db:
        plan = db.migration
        print(json.dumps({"migrated": plan is not None and not plan.empty}))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3])))
