"""Procrastinate (psycopg 3 async connector) as a benchmark peer.

  install  app.schema_manager.apply_schema_async(): what ``procrastinate schema --apply``
           runs, into the scratch database
  submit   noop.defer_async() per job (one procrastinate_defer_jobs_v1 call, one commit);
           bulk: noop.batch_defer_async(*N) (one call, one commit)
  worker   app.run_worker_async(concurrency=CONCURRENCY, listen_notify=True) on
           asyncio's own loop (as its CLI runs it), a no-op async task, jobs kept
           (delete_jobs="never", the default); each job is fetched (todo -> doing) by one
           procrastinate_fetch_job_v2 call and finished (doing -> succeeded) by one
           procrastinate_finish_job_v1 call, each its own commit, and its triggers write
           procrastinate_events rows for both moves
  done     procrastinate_jobs rows with status 'succeeded'

CONCURRENCY is the number of jobs in flight per worker process, as for ledgerq's
Worker(capacity=...); the pool holds that many connections plus the listener's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import procrastinate

from pg_peers.harness import Peer

CONCURRENCY = 10
DONE_SQL = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"


def make_app(dsn: str, pool_size: int = 2) -> tuple[procrastinate.App, Any]:
    connector = procrastinate.PsycopgConnector(conninfo=dsn, min_size=pool_size,
                                               max_size=pool_size)
    app = procrastinate.App(connector=connector)

    @app.task(name="noop")
    async def noop() -> None:
        return None

    return app, noop


async def _install(dsn: str) -> None:
    app, _ = make_app(dsn)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def _submit(dsn: str, n: int, bulk: bool) -> float:
    app, noop = make_app(dsn)
    async with app.open_async():
        t0 = time.perf_counter()
        if bulk:
            await noop.batch_defer_async(*({} for _ in range(n)))
        else:
            for _ in range(n):
                await noop.defer_async()
        return time.perf_counter() - t0


async def _serve(dsn: str, idx: int, barrier: Barrier, stop: Event) -> None:
    app, _ = make_app(dsn, pool_size=CONCURRENCY + 1)
    async with app.open_async():
        barrier.wait()
        task = asyncio.create_task(app.run_worker_async(
            name=f"bench-{idx}", concurrency=CONCURRENCY, wait=True, listen_notify=True,
            install_signal_handlers=False))
        while not stop.is_set() and not task.done():
            await asyncio.sleep(0.01)
        task.cancel()  # procrastinate's documented way to stop a worker run as a task
        with contextlib.suppress(asyncio.CancelledError):
            await task


def install(dsn: str) -> None:
    asyncio.run(_install(dsn))


def submit_single(dsn: str, n: int) -> float:
    return asyncio.run(_submit(dsn, n, bulk=False))


def submit_bulk(dsn: str, n: int) -> float:
    return asyncio.run(_submit(dsn, n, bulk=True))


def worker(dsn: str, idx: int, barrier: Barrier, stop: Event) -> None:
    asyncio.run(_serve(dsn, idx, barrier, stop))


def peer() -> Peer:
    return Peer(name="Procrastinate", install=install, submit_single=submit_single,
                submit_bulk=submit_bulk, worker=worker, done_sql=DONE_SQL)
