"""ledgerq's task face as a benchmark peer: a no-op ``async def`` declared with
``@app.task``, deferred with ``defer_async`` and run by ``app.worker()``.

  install  App(dsn) opened: the schema, and the task recorded
  submit   noop.defer_async() per task (arguments checked against the signature, one
           committed run each); bulk: submit_many of the same application in one call
  worker   app.worker(capacity=BATCH, claim_limit=BATCH): each run's arguments decoded
           to the signature, the function awaited, its result and the terminal fact
           committed before the run counts (no buffered completions)
  done     schedule_runs rows in 'completed'
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from multiprocessing.synchronize import Barrier, Event
from typing import Any

from pg_peers.harness import BATCH, Peer

DONE_SQL = "SELECT count(*) FROM schedule_runs WHERE status = 'completed'"


def make_app(dsn: str) -> tuple[Any, Any]:
    from ledgerq import App

    app = App(dsn)

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app, noop


async def _install(dsn: str) -> None:
    app, _ = make_app(dsn)
    async with app:
        pass


async def _submit(dsn: str, n: int, bulk: bool) -> float:
    from ledgerq.queue import TaskApplication, submit_many

    app, noop = make_app(dsn)
    async with app:
        t0 = time.perf_counter()
        if bulk:
            await submit_many(app.db, [TaskApplication("noop", {})] * n,
                              vocabulary=app.vocabulary)
        else:
            for _ in range(n):
                await noop.defer_async()
        return time.perf_counter() - t0


async def _serve(dsn: str, idx: int, barrier: Barrier, stop: Event) -> None:
    app, _ = make_app(dsn)
    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-locks-") as lock_dir:
        async with app:
            worker = app.worker(capacity=BATCH, claim_limit=BATCH, lock_dir=lock_dir,
                                worker_id=f"bench-{idx}-{os.getpid()}", scheduler=False)
            barrier.wait()
            task = asyncio.create_task(worker.run())
            while not stop.is_set() and not task.done():
                await asyncio.sleep(0.01)
            await worker.stop()
            await task


def _worker(dsn: str, idx: int, barrier: Barrier, stop: Event) -> None:
    asyncio.run(_serve(dsn, idx, barrier, stop))


def peer() -> Peer:
    return Peer(name="ledgerq-tasks",
                install=lambda dsn: asyncio.run(_install(dsn)),
                submit_single=lambda dsn, n: asyncio.run(_submit(dsn, n, bulk=False)),
                submit_bulk=lambda dsn, n: asyncio.run(_submit(dsn, n, bulk=True)),
                worker=_worker, done_sql=DONE_SQL)
