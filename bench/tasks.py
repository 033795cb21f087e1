"""The task face's own costs, as ratios to a peer or a floor in the same run.

  sync-defer      PostgreSQL: N sequential ``task.defer()`` calls from a plain thread (a
                  Django view's call), each its own committed run, against Procrastinate's
                  sync ``task.defer()`` (its sync connector) on the same server, and the
                  floor: one plain psycopg INSERT + COMMIT per call on a sync connection.
                  Target: ledgerq <= 1.2x Procrastinate's time per defer.
  result-latency  How long ``await run.result()`` takes to return after the run's end
                  was written (its ``ended_at``): SQLite with the worker in the same
                  process (in-process wake-up), and PostgreSQL with the worker in another
                  process (NOTIFY). p50 and p90 over N runs, one at a time. Targets: p50
                  <= 5 ms (SQLite, one process), <= 20 ms (PostgreSQL, across processes).

  drain-sqlite    SQLite, one process, synchronous=FULL: N no-op tasks deferred, then run
                  to their end in the same process, lifecycles per second from the first
                  defer to the last end committed: ledgerq (an App, a sync task, its
                  worker in the process) against SqliteHuey (fsync=True, its consumer in
                  the process, thread workers). Target: ledgerq >= 0.8x SqliteHuey.

  python bench/tasks.py [--dsn postgresql://postgres@127.0.0.1:5432/postgres] [--n 500]
                        [--only sync-defer|result-latency|drain-sqlite]
"""

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
from __future__ import annotations

import os
import sys

# Run as a script, this directory is sys.path[0]; bench/queue.py would then shadow the
# standard library's queue. Appended last instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
sys.path.append(_HERE)

import argparse
import asyncio
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

from pg_peers.harness import Scratch

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------- sync defer

def ledgerq_sync_defer(dsn: str, n: int) -> float:
    from ledgerq import App

    app = App(dsn)

    @app.task(name="bench.noop")
    def noop(i: int) -> None:
        return None

    noop.defer(i=-1)  # opens the app's sync handle (not timed: a process does it once)
    t0 = time.perf_counter()
    for i in range(n):
        noop.defer(i=i)
    took = time.perf_counter() - t0
    app.close_sync()
    return took / n


def procrastinate_sync_defer(dsn: str, n: int) -> float:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    def noop(i: int) -> None:
        return None

    with app.open():
        app.schema_manager.apply_schema()
        noop.defer(i=-1)
        t0 = time.perf_counter()
        for i in range(n):
            noop.defer(i=i)
        took = time.perf_counter() - t0
    return took / n


def floor_sync_defer(dsn: str, n: int) -> float:
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TABLE jobs (id bigserial PRIMARY KEY, task text NOT NULL, "
                     "args jsonb NOT NULL, status text NOT NULL DEFAULT 'todo')")
        conn.commit()
        t0 = time.perf_counter()
        for i in range(n):
            conn.execute("INSERT INTO jobs (task, args) VALUES (%s, %s)",
                         ("noop", f'{{"i": {i}}}'))
            conn.commit()
        return (time.perf_counter() - t0) / n


def sync_defer(base: str, n: int, rounds: int) -> None:
    scratch = Scratch(base)
    got: dict[str, list[float]] = {"floor": [], "procrastinate": [], "ledgerq": []}
    try:
        for _ in range(rounds):
            for name, fn in (("floor", floor_sync_defer),
                             ("procrastinate", procrastinate_sync_defer),
                             ("ledgerq", ledgerq_sync_defer)):
                db, dsn = scratch.create()
                try:
                    got[name].append(fn(dsn, n))
                finally:
                    scratch.drop(db)
    finally:
        scratch.drop_all()
    best = {k: min(v) for k, v in got.items()}
    print(f"sync defer, PostgreSQL, {n} sequential calls, best of {rounds}:")
    for name, seconds in best.items():
        print(f"  {name:14} {seconds * 1e3:7.3f} ms per defer")
    print(f"  ledgerq / procrastinate: {best['ledgerq'] / best['procrastinate']:.2f}x "
          "(target <= 1.2x)")
    print(f"  ledgerq / floor:         {best['ledgerq'] / best['floor']:.2f}x")


# ----------------------------------------------------------------- result latency

def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p90 = ordered[int(len(ordered) * 0.9) - 1]
    return f"p50 {p50 * 1e3:6.2f} ms, p90 {p90 * 1e3:6.2f} ms"


async def _latencies(app: Any, task: Any, n: int) -> list[float]:
    from ledgerq.queue import get_run

    out: list[float] = []
    for i in range(n):
        run = await task.defer_async(i=i)
        await run.result(timeout=30)
        returned = time.time()
        ended = (await get_run(app.db, run.id))["ended_at"]
        out.append(returned - ended)
    return out


async def sqlite_latency(n: int) -> list[float]:
    from ledgerq import App

    with tempfile.TemporaryDirectory() as tmp:
        app = App(str(Path(tmp) / "latency.db"))

        @app.task(name="bench.noop")
        async def noop(i: int) -> None:
            await asyncio.sleep(0.001)  # the end is written after the defer returned

        async with app:
            worker = app.worker(capacity=4, poll_interval=0.05, lock_dir=None)
            serving = asyncio.create_task(worker.run())
            try:
                return await _latencies(app, noop, n)
            finally:
                await worker.stop()
                await serving


TASKS_MODULE = '''
import asyncio, os
from ledgerq import App
app = App(os.environ["BENCH_TARGET"])

@app.task(name="bench.noop")
async def noop(i: int) -> None:
    await asyncio.sleep(0.001)
'''


async def postgres_latency(dsn: str, n: int) -> list[float]:
    from ledgerq import App

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bench_tasks.py").write_text(TASKS_MODULE)
        env = {**os.environ, "BENCH_TARGET": dsn,
               "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), tmp])}
        app = App(dsn)

        @app.task(name="bench.noop")
        async def noop(i: int) -> None:
            return None

        async with app:
            worker = subprocess.Popen(
                [sys.executable, "-m", "ledgerq", "worker", "--app", "bench_tasks:app",
                 "--poll-interval", "0.05", "--no-scheduler", "--quiet"], env=env, cwd=tmp)
            try:
                await (await noop.defer_async(i=-1)).result(timeout=60)  # worker is up
                return await _latencies(app, noop, n)
            finally:
                worker.terminate()
                worker.wait(timeout=30)


def result_latency(base: str, n: int) -> None:
    print(f"result latency after the end is written, {n} runs one at a time:")
    print(f"  SQLite, worker in this process:       "
          f"{_percentiles(asyncio.run(sqlite_latency(n)))}  (target p50 <= 5 ms)")
    scratch = Scratch(base)
    try:
        _, dsn = scratch.create()
        samples = asyncio.run(postgres_latency(dsn, n))
        print(f"  PostgreSQL, worker in another process: {_percentiles(samples)}  "
              "(target p50 <= 20 ms)")
    finally:
        scratch.drop_all()


# ----------------------------------------------------------------- SQLite drain

WORKERS = 4


async def ledgerq_drain_sqlite(path: str, n: int) -> float:
    from ledgerq import App
    from ledgerq.queue import list_runs

    app = App(path, synchronous="FULL")

    @app.task(name="bench.noop")
    def noop(i: int) -> int:
        return i

    async with app:
        worker = app.worker(capacity=WORKERS * 8, poll_interval=0.01, lock_dir=None,
                            scheduler=False)
        serving = asyncio.create_task(worker.run())
        await (await noop.defer_async(i=-1)).result(timeout=30)  # the worker is up
        t0 = time.perf_counter()
        runs = [await noop.defer_async(i=i) for i in range(n)]
        for run in runs:
            await run.result(timeout=120)
        took = time.perf_counter() - t0
        await worker.stop()
        await serving
        assert (await list_runs(app.db, statuses=["completed"])).total == n + 1
    return n / took


def huey_drain_sqlite(path: str, n: int) -> float:
    from huey import SqliteHuey

    huey = SqliteHuey(filename=path, fsync=True)

    @huey.task()
    def noop(i: int) -> int:
        return i

    consumer = huey.create_consumer(workers=WORKERS, worker_type="thread",
                                    periodic=False, initial_delay=0.001, backoff=1.0,
                                    max_delay=0.01)
    consumer.start()  # its worker and scheduler threads (run() would also take signals)
    noop(-1).get(blocking=True, timeout=30)
    t0 = time.perf_counter()
    results = [noop(i) for i in range(n)]
    for result in results:
        result.get(blocking=True, timeout=120, backoff=1.0, max_delay=0.005)
    took = time.perf_counter() - t0
    consumer.stop(graceful=True)
    return n / took


def drain_sqlite(n: int, rounds: int) -> None:
    got: dict[str, list[float]] = {"SqliteHuey": [], "ledgerq": []}
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            got["SqliteHuey"].append(huey_drain_sqlite(str(Path(tmp) / "huey.db"), n))
        with tempfile.TemporaryDirectory() as tmp:
            got["ledgerq"].append(asyncio.run(
                ledgerq_drain_sqlite(str(Path(tmp) / "lq.db"), n)))
    best = {k: statistics.median(v) for k, v in got.items()}
    print(f"SQLite, one process, FULL: {n} tasks deferred then run, median of {rounds}:")
    for name, rate in best.items():
        print(f"  {name:12} {rate:8,.0f} lifecycles/s")
    print(f"  ledgerq / SqliteHuey: {best['ledgerq'] / best['SqliteHuey']:.2f}x "
          "(target >= 0.8x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["sync-defer", "result-latency", "drain-sqlite"])
    args = parser.parse_args()
    if args.only in (None, "sync-defer"):
        sync_defer(args.dsn, args.n, args.rounds)
    if args.only in (None, "result-latency"):
        result_latency(args.dsn, min(args.n, 200))
    if args.only in (None, "drain-sqlite"):
        drain_sqlite(args.n, args.rounds)


if __name__ == "__main__":
    main()
