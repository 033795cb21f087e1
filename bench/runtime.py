"""Worker runtime benchmark: wake-up latency, throughput by capacity, group commit under
64 concurrent submitters at synchronous=FULL beside the schema floor for that case, and
the memory of a worker process after many tasks.

Targets: 64 submitters >= 0.8x the floor (bench/floor.py, 64 submits per
commit, passes of 64; the batched floor, the asyncio floor and the asyncio floor with
the contract's checks printed beside); a worker's RSS grows by less than 10 MB from 1k
to 1M tasks (``--memory-tasks 1000000``:
1k, 100k, 1M).

Run: .venv/bin/python bench/runtime.py [--quick] [--only submitters --rounds 7]
     [--only memory --memory-tasks 1000000]
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
import multiprocessing
import os
import resource
import signal
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.lifecycle import default_registry
from ledgerq.queue import TaskApplication, Worker, submit_many, submit_task

sys.path.append(_HERE)  # last, so the stdlib's queue still wins; for floor.py
from asyncio_floor import asyncio_floor  # sibling scripts, importable only after the line above
from floor import schema_floor
from rounds import Ratio
from rounds import ratio as rounds_ratio
from units import Units

APP = TaskApplication("command", {"argv": ["true"]}, "host")


def fsync_rate(directory: Path, seconds: float = 1.0) -> float:
    path = directory / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    n, start = 0, time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            os.pwrite(fd, b"x" * 512, 0)
            os.fsync(fd)
            n += 1
    finally:
        os.close(fd)
    return n / (time.perf_counter() - start)


async def _wait_done(db: StateDB, total: int, timeout: float = 600.0,
                     interval: float = 0.02) -> None:
    """Until ``total`` runs have ended (their terminal writes committed), counted every
    ``interval`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = await db.fetch_one(
            "SELECT count(*) AS n FROM schedule_runs WHERE status IN "
            "('completed', 'failed', 'timed_out', 'cancelled', 'skipped')")
        if row and row["n"] >= total:
            return
        await asyncio.sleep(interval)
    raise TimeoutError(f"not all {total} tasks finished")


async def latency(path: Path, n: int) -> tuple[float, float]:
    started: dict[str, float] = {}

    async def record(run: dict[str, Any]) -> tuple[int, str]:
        started[run["id"]] = time.perf_counter()
        return 0, ""

    samples = []
    async with StateDB(path) as db:
        worker = Worker(db, capacity=4, execute=record, handle_signals=False, poll_interval=0.2)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.3)
        for _ in range(n):
            t0 = time.perf_counter()
            rid = await submit_task(db, APP)
            while rid not in started:
                await asyncio.sleep(0.0002)
            samples.append(started[rid] - t0)
            await asyncio.sleep(0.01)  # let the worker go idle again
        await worker.stop()
        await task
    samples.sort()
    return statistics.median(samples) * 1000, samples[int(len(samples) * 0.99) - 1] * 1000


async def throughput(path: Path, n: int, capacity: int, task_seconds: float,
                     synchronous: str = "NORMAL") -> float:
    async def work(run: dict[str, Any]) -> tuple[int, str]:
        if task_seconds:
            await asyncio.sleep(task_seconds)
        return 0, ""

    async with StateDB(path, synchronous=synchronous) as db:  # type: ignore[arg-type]
        await submit_many(db, [APP] * n)
        worker = Worker(db, capacity=capacity, execute=work, handle_signals=False,
                        claim_limit=max(20, capacity), poll_interval=0.05)
        t0 = time.perf_counter()
        task = asyncio.create_task(worker.run())
        await _wait_done(db, n)
        elapsed = time.perf_counter() - t0
        await worker.stop()
        await task
    return n / elapsed


async def concurrent_submitters(path: Path, per: int, submitters: int = 64,
                                synchronous: str = "FULL") -> float:
    """Lifecycles/s from the first submit to the last terminal write's commit.

    The end is found as the floors find theirs, to within a millisecond: the executor
    counts its runs, and only once every run has been executed (its terminal write then
    follows in the same pass) is the table counted, every 1 ms. Counting every 20 ms from
    the submitters' end added up to 20 ms to a ~0.5 s measurement.
    """
    total = per * submitters
    executed = 0
    all_executed = asyncio.Event()

    async def noop(run: dict[str, Any]) -> tuple[int, str]:
        nonlocal executed
        executed += 1
        if executed >= total:
            all_executed.set()
        return 0, ""

    async with StateDB(path, synchronous=synchronous) as db:  # type: ignore[arg-type]
        worker = Worker(db, capacity=64, execute=noop, handle_signals=False,
                        claim_limit=64, poll_interval=0.05)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.2)

        async def submitter() -> None:
            for _ in range(per):
                await submit_task(db, APP)

        t0 = time.perf_counter()
        await asyncio.gather(*(submitter() for _ in range(submitters)))
        await all_executed.wait()
        await _wait_done(db, total, interval=0.001)
        elapsed = time.perf_counter() - t0
        await worker.stop()
        await task
    return total / elapsed


def database_thread_ceiling(path: Path, n: int, group_size: int = 64,
                            synchronous: str = "FULL") -> float:
    """Lifecycles/s of the database thread's own work alone: a ceiling for the 64-submitter case.

    ledgerq's units alone (bench/units.py) committed in groups of ``group_size`` (one fsync
    per group), as the 64 submitters' writes and the worker's are grouped (the submits
    of a group joined in one unit, as ledgerq.queue.submission.joined joins them): what the
    64-submitter case's writes cost without anything around them.
    """
    units = Units(str(path), default_registry(), synchronous)
    start = time.perf_counter()
    for first in range(0, n, group_size):
        now = time.time()
        size = min(group_size, n - first)
        (ids,) = units.group([partial(units.submit_joined, count=size, now=now)])
        (claimed,) = units.group([partial(units.claim_pass, rids=ids, now=now)])
        (done,) = units.group([partial(units.finish, runs=claimed, now=now)])
        assert all(done), done[:1]
    elapsed = time.perf_counter() - start
    units.close()
    return n / elapsed


def shaped_ceiling(ceiling: float, asyncio_floor: float, floor: float) -> float:
    """Lifecycles/s of ledgerq's units alone (``ceiling``) once they also pay what the
    asyncio shape costs the floor's statements (a lifecycle's time under the asyncio floor
    less its time under the schema floor): a bound on ledgerq with its units as they are.

    The scenario's time is the CPU's (one group commit per 64 lifecycles in all three), so
    the shape's cost adds to the units' time as it adds to the floor's. Any runtime of
    this API pays at least that shape (bench/asyncio_floor.py), so no runtime lifts
    ledgerq past this without cheaper units. A round whose noise made the asyncio floor
    the faster of the two adds no cost (never a negative one).
    """
    return 1 / (1 / ceiling + max(0.0, 1 / asyncio_floor - 1 / floor))


def rss_mb(pid: int | None = None) -> float:
    with open(f"/proc/{pid or 'self'}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _memory_worker(path: str) -> None:
    """The measured worker: its own process, so its RSS is the worker's alone (SIGTERM stops it)."""

    async def noop(run: dict[str, Any]) -> tuple[int, str]:
        return 0, ""

    async def serve() -> None:
        async with StateDB(path) as db:
            await Worker(db, capacity=32, execute=noop, claim_limit=64, poll_interval=0.05).run()

    asyncio.run(serve())


async def memory(path: Path, checkpoints: list[int], batch: int = 1000) -> list[float]:
    """The worker process's RSS once each checkpoint's tasks have all completed.

    The submitter (this process) always submits ``batch`` at a time, so what the worker
    sees between checkpoints is the same traffic, only more of it.
    """
    async with StateDB(path) as db:  # create the schema before the worker opens the file
        pass
    proc = multiprocessing.get_context("spawn").Process(target=_memory_worker, args=(str(path),))
    proc.start()
    readings: list[float] = []
    try:
        async with StateDB(path) as db:
            done = 0
            for target in checkpoints:
                while done < target:
                    k = min(batch, target - done)
                    await submit_many(db, [APP] * k)
                    done += k
                    await _wait_done(db, done)  # keep the queue short, like a steady stream
                readings.append(rss_mb(proc.pid))
    finally:
        if proc.pid is not None:
            os.kill(proc.pid, signal.SIGTERM)
        proc.join(30)
    return readings


SECTIONS = ("latency", "capacity", "submitters", "memory")


async def submitters(d: Path, fs: float, per: int, rounds: int) -> None:
    """Target 2: 64 submitters and one Worker against the floors for that case, in
    ``rounds`` interleaved rounds (each system once a round, in turn, on fresh files);
    every ratio is the median of the rounds' own ratios, [min, max] beside it."""
    n = per * 64
    names = ("ledgerq", "ceiling", "floor", "batched", "asyncio", "checked")
    got: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        got["ledgerq"].append(await concurrent_submitters(d / f"c64-{r}.db", per))
        got["ceiling"].append(database_thread_ceiling(d / f"ceiling-{r}.db", n))
        got["floor"].append(schema_floor(str(d / f"floor-{r}.db"), default_registry(), "FULL",
                                         n, limit=64, submit_group=64)["lifecycle"])
        got["batched"].append(schema_floor(str(d / f"batched-{r}.db"), default_registry(),
                                           "FULL", n, limit=64, submit_group=64,
                                           batched=True)["lifecycle"])
        got["asyncio"].append((await asyncio_floor(
            str(d / f"asyncio-{r}.db"), default_registry(), "FULL", 64, per))["lifecycle"])
        got["checked"].append((await asyncio_floor(
            str(d / f"checked-{r}.db"), default_registry(), "FULL", 64, per,
            checked=True))["lifecycle"])

    def rate(name: str) -> str:
        return f"{statistics.median(got[name]):,.0f} lifecycles/s"

    def ratio(a: str, b: str) -> Ratio:
        return rounds_ratio(got[a], got[b])

    print(f"64 concurrent submitters -> 1 worker, FULL, {n:,} lifecycles, median of {rounds} "
          f"interleaved round(s) [min, max]:")
    print(f"  ledgerq: {rate('ledgerq')} = {statistics.median(got['ledgerq']) / fs:.2f}x "
          "fsync rate")
    print(f"  ceiling: the database thread's units alone, groups of 64: {rate('ceiling')}")
    print(f"  floor: the raw statements alone (bench/floor.py), 64 submits per commit, "
          f"passes of 64: {rate('floor')}")
    print(f"  batched floor (each pass's claims and terminal writes one statement each): "
          f"{rate('batched')}")
    print(f"  asyncio floor (bench/asyncio_floor.py: the floor's statements under 64 submitter "
          f"coroutines and a worker running each task as a task): {rate('asyncio')} = "
          f"{ratio('asyncio', 'floor')} the floor")
    print(f"  checked floor (the asyncio floor with the checks ledgerq's contract makes on "
          f"every lifecycle: validate_encoded, digest, check_values): {rate('checked')} = "
          f"{ratio('checked', 'floor')} the floor")
    print(f"  ceiling / floor = {ratio('ceiling', 'floor')} (the units alone: what the "
          "runtime around them could reach at most)")
    got["shaped"] = [shaped_ceiling(*rates) for rates in
                     zip(got["ceiling"], got["asyncio"], got["floor"], strict=True)]
    print(f"  bound: the units alone plus the asyncio shape's own cost (asyncio floor - floor, "
          f"per lifecycle) = {ratio('shaped', 'floor')} the floor: ledgerq with its engine's "
          "units as they are, under the cheapest asyncio runtime of this API")
    judged = ratio("ledgerq", "floor")
    print(f"  ledgerq / floor = {judged} (target >= 0.8x: "
          f"{'met' if judged.median >= 0.8 else 'NOT met'}), "
          f"ledgerq / batched floor = {ratio('ledgerq', 'batched')}, "
          f"ledgerq / asyncio floor = {ratio('ledgerq', 'asyncio')}, "
          f"ledgerq / checked floor = {ratio('ledgerq', 'checked')}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=SECTIONS, action="append",
                        help="run only this section (repeatable)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="submitters: interleaved rounds of every system (default 5); "
                             "each figure is the median of the rounds' own ratios")
    parser.add_argument("--memory-tasks", type=int, default=None,
                        help="memory section: read the RSS at 1k, a tenth of this and this "
                             "many tasks (default: 1k, 10k, 50k, 100k)")
    opts = parser.parse_args()
    q = opts.quick
    only = set(opts.only or SECTIONS)
    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-") as tmp:
        d = Path(tmp)
        fs = fsync_rate(d)
        print(f"disk fsync rate: {fs:,.0f}/s")
        if "latency" in only:
            p50, p99 = await latency(d / "lat.db", 50 if q else 300)
            print(f"submit->start latency, idle in-process worker: p50 {p50:.2f} ms, "
                  f"p99 {p99:.2f} ms")
        if "capacity" in only:
            print("lifecycles/s by capacity (NORMAL):")
            for cap in (1, 8, 32):
                noop = await throughput(d / f"n{cap}.db", 500 if q else 3000, cap, 0.0)
                n_slow = min(3000, (60 if q else 200) * cap)
                slow = await throughput(d / f"s{cap}.db", n_slow, cap, 0.010)
                print(f"  capacity {cap:>2}: no-op {noop:8,.0f}/s   10 ms tasks {slow:8,.0f}/s")
        if "submitters" in only:
            await submitters(d, fs, per=8 if q else 40, rounds=1 if q else opts.rounds)
        if "memory" in only:
            points = [1000, 5000, 20_000] if q else [1000, 10_000, 50_000, 100_000]
            if opts.memory_tasks:
                points = sorted({1000, opts.memory_tasks // 10, opts.memory_tasks})
            rss = await memory(d / "mem.db", points)
            print("worker process RSS after " + ", ".join(
                f"{n:,} tasks {mb:.1f} MB" for n, mb in zip(points, rss, strict=True)))
            grown = rss[-1] - rss[0]
            print(f"  growth from {points[0]:,} to {points[-1]:,} tasks: {grown:+.1f} MB "
                  f"(target < 10 MB: {'met' if grown < 10 else 'NOT met'})")
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
