"""Instructions per lifecycle under valgrind: CPU ratios a noisy machine cannot move.

On a shared VM the rates and even the CPU times of bench/queue.py wander by 20-30% from
one minute to the next, more than most single changes to the hot path are worth. The
number of instructions a scenario executes does not: valgrind's callgrind counts them
(every thread's, user space only, so no fsync or kernel time) within a fraction of a
percent, run after run. This counts them for target 1's scenario, at ``synchronous=OFF``:

  schema floor  ledgerq's own statements in plain sqlite3 (bench/floor.py)
  units alone   ledgerq's in-transaction units on a plain connection (bench/units.py)
  ledgerq       submit_task() N times, one commit each, then claim_and_execute passes
                of L with a no-op executor (bench/queue.py's ledgerq row)

Each system runs three times in a child process under callgrind: setup only (imports,
schema, one warm-up lifecycle), then N submits, then N submits and the passes. The
differences are the submits' and the passes' instructions; divided by N, per lifecycle.
Ratios to the floor are what target 3 (CPU per lifecycle <= 1.5x the floor's) asks,
counted instead of timed. Needs valgrind (apt-get install valgrind); takes ~4 minutes.

``--submitters`` counts target 2's scenario instead (bench/runtime.py's 64 concurrent
submitters and one Worker with passes of 64, at ``synchronous=OFF``) against its floors:

  schema floor   the floor's statements, 64 submits per commit, passes of 64
  asyncio floor  the same statements under 64 submitter coroutines and a worker that
                 runs each task as a task (bench/asyncio_floor.py)
  checked floor  the asyncio floor with the checks ledgerq's contract makes on every
                 lifecycle (bench/asyncio_floor.py's Checks)
  units alone    ledgerq's units in the database thread, grouped as the scenario's commits
                 are (bench/runtime.py's database_thread_ceiling): the runtime's ceiling
  ledgerq        bench/runtime.py's concurrent_submitters

The units alone plus the asyncio shape's own cost (asyncio floor - schema floor) bound
ledgerq with its units as they are: no runtime of this API costs less than that shape.

Each runs with 64 x 2 and 64 x (2 + n/64) lifecycles; the difference, per lifecycle, is
what a lifecycle costs once the scenario runs (start-up, schema and warm-up cancel out).
Target 2 is timed at FULL, where the rate follows the CPU (the commits are the floor's:
one per group of 64), so the counted ratio is its deterministic twin. ~6 minutes.

    .venv/bin/python bench/instructions.py [--n 500] [--limit 20]
    .venv/bin/python bench/instructions.py --submitters [--n 512]
"""

from __future__ import annotations

import os.path
import sys

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
# bench/queue.py would shadow the standard library's queue (which aiosqlite imports).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import asyncio
import re
import shutil
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.lifecycle import default_registry
from ledgerq.queue import claim_and_execute, submit_task

sys.path.append(_HERE)  # last, so the stdlib's queue still wins
import floor
from asyncio_floor import asyncio_floor
from runtime import concurrent_submitters, database_thread_ceiling, shaped_ceiling
from units import Units

SYSTEMS = ("schema floor", "units alone", "ledgerq")
#: Target 2's systems (``--submitters``).
SUBMITTER_SYSTEMS = ("schema floor", "asyncio floor", "checked floor", "units alone", "ledgerq")
#: Lifecycles a submitter makes in the smaller of the two runs that are subtracted.
BASE_PER = 2


async def _noop(run: dict[str, Any]) -> tuple[int, str]:
    return 0, ""


def child(system: str, n: int, limit: int, passes: bool, path: str) -> None:
    """One scenario: a warm-up lifecycle, then ``n`` submits, then (``passes``) the passes."""
    registry = default_registry()
    if system == "schema floor":
        conn = floor.connect(path, "OFF")
        conn.executescript(floor.schema_ddl(registry))
        page = floor.claim_page(registry)
        floor._submit_all(conn, 1, 1)
        floor._passes(conn, page, limit)
        if n:
            floor._submit_all(conn, n, 1)
        if passes:
            floor._passes(conn, page, limit)
        conn.close()
    elif system == "units alone":
        units = Units(path, registry, "OFF")

        def lifecycles(count: int, submit: bool, work: bool) -> None:
            ids = [units.group([units.submit])[0] for _ in range(count)] if submit else \
                [r[0] for r in units.conn.execute(
                    "SELECT id FROM schedule_runs WHERE status = 'queued' ORDER BY id")]
            for first in range(0, len(ids) if work else 0, limit):
                now = time.time()
                (claimed,) = units.group([partial(units.claim_pass,
                                                  rids=ids[first:first + limit], now=now)])
                units.group([partial(units.finish, runs=claimed, now=time.time())])

        lifecycles(1, True, True)
        lifecycles(n, True, False)
        if passes:
            lifecycles(0, False, True)
        units.close()
    else:
        async def scenario() -> None:
            async with StateDB(path, registry=registry, synchronous="OFF") as db:
                for count, work in ((1, True), (n, passes)):
                    for _ in range(count):
                        await submit_task(db, floor.APP)
                    while work and await claim_and_execute(
                            db, worker_id=floor.WORKER, execute=_noop, limit=limit):
                        pass

        asyncio.run(scenario())


def submitters_child(system: str, per: int, path: str) -> None:
    """Target 2's scenario, 64 submitters making ``per`` lifecycles each, at OFF."""
    registry = default_registry()
    if system == "schema floor":
        floor.schema_floor(path, registry, "OFF", 64 * per, limit=64, submit_group=64)
    elif system == "units alone":
        database_thread_ceiling(Path(path), 64 * per, synchronous="OFF")
    elif system in ("asyncio floor", "checked floor"):
        asyncio.run(asyncio_floor(path, registry, "OFF", 64, per,
                                  checked=system == "checked floor"))
    else:
        asyncio.run(concurrent_submitters(Path(path), per, synchronous="OFF"))


def instructions(system: str, n: int, limit: int, passes: bool,
                 submitters: bool = False) -> int:
    """Instructions (every thread's) of one child scenario under callgrind."""
    with tempfile.TemporaryDirectory(prefix="ledgerq-ir-") as work:
        out = os.path.join(work, "callgrind.out")
        subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
             sys.executable, os.path.abspath(__file__), "--child", system, "--n", str(n),
             "--limit", str(limit), *(["--passes"] if passes else []),
             *(["--submitters"] if submitters else []),
             "--path", os.path.join(work, "state.db")],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(out) as fh:
            found = re.search(r"^(?:summary|totals): (\d+)", fh.read(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"no instruction count in callgrind's output for {system}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=500, help="lifecycles per scenario")
    ap.add_argument("--limit", type=int, default=20, help="claims per pass")
    ap.add_argument("--submitters", action="store_true",
                    help="count target 2's scenario (64 submitters, one Worker) instead")
    ap.add_argument("--child", choices=(*SYSTEMS, *SUBMITTER_SYSTEMS), help=argparse.SUPPRESS)
    ap.add_argument("--passes", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child and args.submitters:
        submitters_child(args.child, args.n, args.path)
        return
    if args.child:
        child(args.child, args.n, args.limit, args.passes, args.path)
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    if args.submitters:
        count_submitters(max(1, args.n // 64))
        return
    print(f"instructions per lifecycle under callgrind (thousands), n={args.n}, "
          f"limit={args.limit}, synchronous=OFF")
    print(f"{'system':<14}{'submit':>10}{'passes':>10}{'total':>10}{'x floor':>10}")
    totals: dict[str, float] = {}
    for system in SYSTEMS:
        setup = instructions(system, 0, args.limit, False)
        submitted = instructions(system, args.n, args.limit, False)
        done = instructions(system, args.n, args.limit, True)
        submit, passes = (submitted - setup) / args.n, (done - submitted) / args.n
        totals[system] = submit + passes
        ratio = totals[system] / totals[SYSTEMS[0]]
        print(f"{system:<14}{submit / 1e3:>10.0f}{passes / 1e3:>10.0f}"
              f"{totals[system] / 1e3:>10.0f}{ratio:>9.2f}x", flush=True)
    print(f"target 3 (counted, not timed): ledgerq / schema floor = "
          f"{totals['ledgerq'] / totals['schema floor']:.2f}x (target <= 1.5x); "
          f"units alone / schema floor = "
          f"{totals['units alone'] / totals['schema floor']:.2f}x")


def count_submitters(more: int) -> None:
    """Target 2's scenario counted: each system at 64 x BASE_PER and 64 x (BASE_PER +
    ``more``) lifecycles; the difference per lifecycle."""
    n = 64 * more
    print(f"target 2's scenario under callgrind: instructions per lifecycle (thousands), "
          f"the difference of 64 x {BASE_PER + more} and 64 x {BASE_PER} lifecycles, "
          "synchronous=OFF")
    totals: dict[str, float] = {}
    for system in SUBMITTER_SYSTEMS:
        small = instructions(system, BASE_PER, 64, True, submitters=True)
        large = instructions(system, BASE_PER + more, 64, True, submitters=True)
        totals[system] = (large - small) / n
        print(f"{system:<14}{totals[system] / 1e3:>10.0f}"
              f"{totals[system] / totals[SUBMITTER_SYSTEMS[0]]:>9.2f}x", flush=True)
    floor_, asyncio_, checked, units, ledgerq = (totals[s] for s in SUBMITTER_SYSTEMS)
    print(f"target 2, counted: schema floor / ledgerq = {floor_ / ledgerq:.2f}x (timed "
          f"target >= 0.8x); asyncio floor / ledgerq = {asyncio_ / ledgerq:.2f}x; "
          f"checked floor / ledgerq = {checked / ledgerq:.2f}x; bound, the units alone "
          f"plus the asyncio shape's cost: schema floor / (units alone + asyncio floor - "
          f"schema floor) = {floor_ * shaped_ceiling(1 / units, 1 / asyncio_, 1 / floor_):.2f}x")


if __name__ == "__main__":
    main()
