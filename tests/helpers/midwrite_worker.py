"""A worker cut off in the middle of a write, for the network-partition test.

It claims one run, then writes its completion in a unit that, once the UPDATE has
reached the server, makes a flag file and waits a second before its COMMIT goes out:
the test cuts the host off meanwhile, so the server holds an open transaction with the
run's row lock, as it would for a worker whose network failed at that instant. Prints
how the write ended (refused, or the error the cut gave it) and how long it took.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.queue import moves
from ledgerq.queue.runs import lease_of, perform, run_policy, worker_actor
from ledgerq.queue.worker.claim import claim_runs


async def main(args: argparse.Namespace) -> None:
    async with StateDB(args.db, pool_size=1, busy_timeout_ms=args.busy_timeout_ms) as db:
        (run,) = (await claim_runs(db, worker_id=args.worker_id,
                                   lease_ttl=args.lease_ttl)).claimed
        policy = run_policy(db)

        def complete(tx: Any) -> bool:
            done = perform(tx, policy, run["id"], moves.EXITED_ZERO,
                           actor=worker_actor(args.worker_id), guard=dict(lease_of(policy, run)),
                           patch={"ended_at": time.time(), "exit_code": 0, "run_attempts": 1},
                           now=time.time())
            Path(args.flag).write_text(run["id"])
            time.sleep(1.0)  # the host is cut off meanwhile: the COMMIT goes into it
            return done.applied

        started = time.monotonic()
        try:
            applied = await db.write(complete)
        except Exception as exc:
            print(f"write raised {type(exc).__name__} after "
                  f"{time.monotonic() - started:.1f}s: {exc}", flush=True)
        else:
            print(f"write applied={applied} after {time.monotonic() - started:.1f}s",
                  flush=True)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--flag", required=True)
    p.add_argument("--lease-ttl", type=float, default=2.0)
    p.add_argument("--busy-timeout-ms", type=int, default=3000)
    return p.parse_args()


if __name__ == "__main__":
    asyncio.run(main(parse()))
