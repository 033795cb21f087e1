"""PgQueuer (asyncpg driver) as a benchmark peer.

  install  Queries.install(): what ``pgq install`` runs, into the scratch database
  submit   Queries.enqueue("noop", None) per job (one statement, one commit each);
           bulk: one enqueue() call with lists (one INSERT ... SELECT unnest, one commit)
  worker   QueueManager over one asyncpg connection (its docs: a direct connection, not
           a pool, for the manager, which also LISTENs on it), a no-op async entrypoint,
           run(batch_size=BATCH_SIZE) on uvloop, as ``pgq run`` runs it
  done     rows in pgqueuer_log with status 'successful'

Tuning, as PgQueuer's performance guide documents it: a larger batch_size for short jobs
(its example uses 25; the default is 10). Durability is left at the default "durable"
(logged tables), as for every other system here; "balanced"/"volatile" (unlogged tables)
would lose jobs on a PostgreSQL crash.

Durability of completions: PgQueuer does not commit a job's completion when the handler
returns. The worker appends (job, 'successful') to an in-memory JobStatusLogBuffer and
flushes it in one statement (DELETE the jobs from pgqueuer + INSERT their log rows) when
it holds batch_size entries or every ~0.1 s. A worker killed before the flush loses those
completions: the jobs stay 'picked' in the queue table and are re-picked after the
heartbeat timeout (at-least-once; the no-op runs again). Dequeue (queued -> picked) is
committed before a handler starts. The harness counts a job done only once its log row
is committed, so the flush delay is inside the measured time.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from multiprocessing.synchronize import Barrier, Event

import asyncpg
import uvloop
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager

from pg_peers.harness import BATCH, Peer

BATCH_SIZE = BATCH
ENTRYPOINT = "noop"
DONE_SQL = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"


async def _install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(conn)).install()
    finally:
        await conn.close()


async def _submit(dsn: str, n: int, bulk: bool) -> float:
    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        t0 = time.perf_counter()
        if bulk:
            await queries.enqueue([ENTRYPOINT] * n, [None] * n, [0] * n)
        else:
            for _ in range(n):
                await queries.enqueue(ENTRYPOINT, None)
        return time.perf_counter() - t0
    finally:
        await conn.close()


async def _serve(dsn: str, barrier: Barrier, stop: Event) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        return None

    barrier.wait()
    task = asyncio.create_task(qm.run(batch_size=BATCH_SIZE,
                                      dequeue_timeout=timedelta(seconds=5)))
    while not stop.is_set() and not task.done():
        await asyncio.sleep(0.01)
    qm.shutdown.set()
    await task  # its exit flushes the completion buffer
    await conn.close()


def install(dsn: str) -> None:
    uvloop.run(_install(dsn))


def submit_single(dsn: str, n: int) -> float:
    return uvloop.run(_submit(dsn, n, bulk=False))


def submit_bulk(dsn: str, n: int) -> float:
    return uvloop.run(_submit(dsn, n, bulk=True))


def worker(dsn: str, idx: int, barrier: Barrier, stop: Event) -> None:
    uvloop.run(_serve(dsn, barrier, stop))


def peer() -> Peer:
    return Peer(name="PgQueuer", install=install, submit_single=submit_single,
                submit_bulk=submit_bulk, worker=worker, done_sql=DONE_SQL)
