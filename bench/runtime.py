"""Worker runtime benchmark (issue 4): wake-up latency, throughput by capacity, group commit
under 64 concurrent submitters at synchronous=FULL against the disk's fsync rate, and
worker memory after many tasks.

Run: .venv/bin/python bench/runtime.py [--quick]
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
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.queue import TaskApplication, Worker, submit_many, submit_task

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


async def _wait_done(db: StateDB, total: int, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = await db.fetch_one(
            "SELECT count(*) AS n FROM schedule_runs WHERE status IN "
            "('completed', 'failed', 'timed_out', 'cancelled', 'skipped')")
        if row and row["n"] >= total:
            return
        await asyncio.sleep(0.02)
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


async def concurrent_submitters(path: Path, per: int, submitters: int = 64) -> float:
    async def noop(run: dict[str, Any]) -> tuple[int, str]:
        return 0, ""

    async with StateDB(path, synchronous="FULL") as db:
        worker = Worker(db, capacity=64, execute=noop, handle_signals=False,
                        claim_limit=64, poll_interval=0.05)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(0.2)

        async def submitter() -> None:
            for _ in range(per):
                await submit_task(db, APP)

        t0 = time.perf_counter()
        await asyncio.gather(*(submitter() for _ in range(submitters)))
        await _wait_done(db, per * submitters)
        elapsed = time.perf_counter() - t0
        await worker.stop()
        await task
    return per * submitters / elapsed


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def memory(path: Path, small: int, large: int) -> tuple[float, float]:
    async def noop(run: dict[str, Any]) -> tuple[int, str]:
        return 0, ""

    async with StateDB(path) as db:
        worker = Worker(db, capacity=32, execute=noop, handle_signals=False,
                        claim_limit=64, poll_interval=0.05)
        task = asyncio.create_task(worker.run())
        done = 0
        readings = []
        for target in (small, large):
            batch = target - done
            for i in range(0, batch, 5000):
                await submit_many(db, [APP] * min(5000, batch - i))
            await _wait_done(db, target)
            done = target
            readings.append(rss_mb())
        await worker.stop()
        await task
    return readings[0], readings[1]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    q = opts.quick
    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-") as tmp:
        d = Path(tmp)
        fs = fsync_rate(d)
        print(f"disk fsync rate: {fs:,.0f}/s")
        p50, p99 = await latency(d / "lat.db", 50 if q else 300)
        print(f"submit->start latency, idle in-process worker: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
        print("lifecycles/s by capacity (NORMAL):")
        for cap in (1, 8, 32):
            noop = await throughput(d / f"n{cap}.db", 500 if q else 3000, cap, 0.0)
            n_slow = min(3000, (60 if q else 200) * cap)
            slow = await throughput(d / f"s{cap}.db", n_slow, cap, 0.010)
            print(f"  capacity {cap:>2}: no-op {noop:8,.0f}/s   10 ms tasks {slow:8,.0f}/s")
        per = 8 if q else 40
        rate = await concurrent_submitters(d / "c64.db", per)
        print(f"64 concurrent submitters -> 1 worker, FULL: {rate:,.0f} lifecycles/s "
              f"= {rate / fs:.2f}x fsync rate (target >= 1.0x)")
        small, large = (1000, 20_000) if q else (1000, 100_000)
        m1, m2 = await memory(d / "mem.db", small, large)
        print(f"worker RSS after {small:,} tasks: {m1:.1f} MB; after {large:,}: {m2:.1f} MB "
              f"(growth {m2 - m1:+.1f} MB)")
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
