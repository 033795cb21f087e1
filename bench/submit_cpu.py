"""Where a sequential submit's time goes: user CPU, system CPU and wall per submit, for
the schema floor, ledgerq's units alone and ledgerq, at ``synchronous`` OFF and FULL.

The lifecycle target (ledgerq >= 0.8x the schema floor, bench/queue.py) is a FULL-mode
ratio. This splits it: a commit's fsync is the same wait for all three, but each one's
user CPU roughly doubles at FULL (the process sleeps in fsync between submits and comes
back to cold caches), so the more Python a submit runs, the more FULL adds to it. The
FULL ratio is thus set by the user CPU each runs per submit, and this shows how much of
it ledgerq may run for the target to hold.

Run: .venv/bin/python bench/submit_cpu.py [--n 2000] [--rounds 5]
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
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from ledgerq import StateDB
from ledgerq.lifecycle import default_registry
from ledgerq.queue import submit_task
from ledgerq.store.sqlite.schema import schema_ddl

sys.path.append(_HERE)  # last, so the stdlib's queue still wins
from floor import APP, _submit_all, connect
from units import Units

Split = tuple[float, float, float]


def _clock() -> Split:
    t = os.times()
    return t.user, t.system, time.perf_counter()


def _per(n: int, start: Split, end: Split) -> Split:
    u, s, w = ((b - a) / n * 1e6 for a, b in zip(start, end, strict=True))
    return u, s, w


def floor_submits(path: str, sync: str, n: int) -> Split:
    conn = connect(path, sync)
    conn.executescript(schema_ddl(default_registry()))
    start = _clock()
    _submit_all(conn, n, 1)
    end = _clock()
    conn.close()
    return _per(n, start, end)


def units_submits(path: str, sync: str, n: int) -> Split:
    units = Units(path, default_registry(), sync)
    start = _clock()
    for _ in range(n):
        units.group([units.submit])
    end = _clock()
    units.close()
    return _per(n, start, end)


def ledgerq_submits(path: str, sync: str, n: int) -> Split:
    async def run() -> Split:
        async with StateDB(path, synchronous=sync) as db:  # type: ignore[arg-type]
            start = _clock()
            for _ in range(n):
                await submit_task(db, APP)
            return _per(n, start, _clock())

    return asyncio.run(run())


SYSTEMS: dict[str, Callable[[str, str, int], Split]] = {
    "schema floor": floor_submits, "units alone": units_submits, "ledgerq": ledgerq_submits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=2000, help="submits per system and round")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    args = ap.parse_args()
    print(f"one sequential submitter, {args.n} submits per round, median of {args.rounds} "
          f"interleaved rounds; load average {os.getloadavg()[0]:.2f}")
    print(f"{'sync':5} {'system':13} {'user us':>8} {'sys us':>7} {'wall us':>8} "
          f"{'floor/this':>11}")
    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-") as tmp:
        for sync in ("OFF", "FULL"):
            got: dict[str, list[Split]] = {name: [] for name in SYSTEMS}
            for r in range(args.rounds):
                for name, fn in SYSTEMS.items():
                    got[name].append(fn(os.path.join(tmp, f"{sync}-{r}-{name}.db"), sync,
                                        args.n))
            medians = {name: tuple(statistics.median(s[i] for s in splits)
                                   for i in range(3)) for name, splits in got.items()}
            floor_wall = medians["schema floor"][2]
            for name, (u, s, w) in medians.items():
                print(f"{sync:5} {name:13} {u:8.0f} {s:7.0f} {w:8.0f} "
                      f"{floor_wall / w:10.2f}x")


if __name__ == "__main__":
    main()
