"""The plain-psycopg floor: the fewest statements and commits a PostgreSQL task queue runs.

Synchronous psycopg 3, one connection per process and one task in flight per process.
Sync rather than async because every step waits on the previous one's answer (claim,
then update, then commit): an event loop would only add its own overhead per round
trip, and parallelism comes from worker processes, each with its own connection.

  submit   INSERT the row (+ its log row) in one transaction; bulk: COPY N rows (+ N log
           rows) in one transaction
  claim    one transaction: SELECT id ... WHERE status = 'queued' ORDER BY queued_at
           LIMIT 1 FOR UPDATE SKIP LOCKED, then UPDATE it to running with a lease
           (+ its log row)
  complete a second transaction: guarded UPDATE running -> completed (+ its log row)

``log=True`` appends one job_log row per state change in the same transaction as the
change (ledgerq writes a fact per move); the log has a unique (job_id, version) index,
like ledgerq's facts. An idle worker polls every IDLE_SLEEP seconds (no LISTEN/NOTIFY).

``batch=B`` (> 1) is the batched floor, for a fair ratio wherever the engine
batches (ledgerq's PostgreSQL claim pass is one statement for all its rows): a worker
claims up to B jobs as one guarded ``UPDATE ... RETURNING`` with one multi-row log
INSERT in one transaction, then completes all of them as one guarded ``UPDATE`` (each row
still checked for ``running`` and its own lease) with one multi-row log INSERT in a
second. Every state change is still durable before the next one starts; nothing is
buffered in memory.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from multiprocessing.synchronize import Barrier, Event

import psycopg
from psycopg.types.json import Jsonb

from pg_peers.harness import Peer

PAYLOAD = {"argv": ["true"]}
LEASE_SECONDS = 300.0
IDLE_SLEEP = 0.005

DDL = """
CREATE TABLE jobs (
  id               text PRIMARY KEY,
  status           text NOT NULL,
  payload          jsonb NOT NULL,
  queued_at        double precision NOT NULL,
  leased_by        text,
  lease_expires_at double precision,
  version          integer NOT NULL DEFAULT 1,
  updated_at       double precision NOT NULL
);
CREATE INDEX jobs_queued ON jobs (queued_at) WHERE status = 'queued';
CREATE TABLE job_log (
  seq         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id      text NOT NULL,
  version     integer NOT NULL,
  from_status text,
  to_status   text NOT NULL,
  actor       text NOT NULL,
  at          double precision NOT NULL
);
CREATE UNIQUE INDEX job_log_version ON job_log (job_id, version);
"""

INSERT_JOB = ("INSERT INTO jobs (id, status, payload, queued_at, updated_at) "
              "VALUES (%s, 'queued', %s, %s, %s)")
INSERT_LOG = ("INSERT INTO job_log (job_id, version, from_status, to_status, actor, at) "
              "VALUES (%s, %s, %s, %s, %s, %s)")
CLAIM = ("SELECT id, version FROM jobs WHERE status = 'queued' ORDER BY queued_at "
         "LIMIT 1 FOR UPDATE SKIP LOCKED")
TO_RUNNING = ("UPDATE jobs SET status = 'running', leased_by = %s, lease_expires_at = %s, "
              "version = version + 1, updated_at = %s WHERE id = %s")
TO_COMPLETED = ("UPDATE jobs SET status = 'completed', leased_by = NULL, "
                "lease_expires_at = NULL, version = version + 1, updated_at = %s "
                "WHERE id = %s AND status = 'running' AND leased_by = %s")
DONE_SQL = "SELECT count(*) FROM jobs WHERE status = 'completed'"
CLAIM_MANY = ("UPDATE jobs SET status = 'running', leased_by = %s, lease_expires_at = %s, "
              "version = version + 1, updated_at = %s WHERE id IN (SELECT id FROM jobs "
              "WHERE status = 'queued' ORDER BY queued_at LIMIT %s FOR UPDATE SKIP LOCKED) "
              "AND status = 'queued' RETURNING id, version")
COMPLETE_MANY = ("UPDATE jobs SET status = 'completed', leased_by = NULL, "
                 "lease_expires_at = NULL, version = version + 1, updated_at = %s "
                 "WHERE id = ANY(%s) AND status = 'running' AND leased_by = %s "
                 "RETURNING id, version")
LOG_MANY = ("INSERT INTO job_log (job_id, version, from_status, to_status, actor, at) "
            "SELECT job_id, version, %s, %s, %s, %s "
            "FROM unnest(%s::text[], %s::integer[]) AS t (job_id, version)")


def install(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)


def submit_single(dsn: str, n: int, log: bool) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        payload = Jsonb(PAYLOAD)
        t0 = time.perf_counter()
        for _ in range(n):
            job_id, now = uuid.uuid4().hex, time.time()
            with conn.transaction():
                conn.execute(INSERT_JOB, (job_id, payload, now, now))
                if log:
                    conn.execute(INSERT_LOG, (job_id, 1, None, "queued", "submitter", now))
        return time.perf_counter() - t0


def submit_bulk(dsn: str, n: int, log: bool) -> float:
    with psycopg.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        payload = json.dumps(PAYLOAD)
        now = time.time()
        ids = [uuid.uuid4().hex for _ in range(n)]
        with conn.transaction(), conn.cursor() as cur:
            with cur.copy("COPY jobs (id, status, payload, queued_at, updated_at) "
                          "FROM STDIN") as copy:
                for i, job_id in enumerate(ids):
                    copy.write_row((job_id, "queued", payload, now + i * 1e-6, now))
            if log:
                with cur.copy("COPY job_log (job_id, version, from_status, to_status, "
                              "actor, at) FROM STDIN") as copy:
                    for job_id in ids:
                        copy.write_row((job_id, 1, None, "queued", "submitter", now))
        return time.perf_counter() - t0


def run_one(conn: psycopg.Connection[tuple[object, ...]], me: str, log: bool) -> bool:
    """Claim one queued job and complete it (two transactions); False if none was queued."""
    now = time.time()
    with conn.transaction():
        row = conn.execute(CLAIM).fetchone()
        if row is None:
            return False
        job_id, version = row
        conn.execute(TO_RUNNING, (me, now + LEASE_SECONDS, now, job_id))
        if log:
            conn.execute(INSERT_LOG, (job_id, version + 1, "queued", "running", me, now))
    # The task itself is a no-op.
    now = time.time()
    with conn.transaction():
        cur = conn.execute(TO_COMPLETED, (now, job_id, me))
        if cur.rowcount != 1:
            raise RuntimeError(f"lost the lease on {job_id}")
        if log:
            conn.execute(INSERT_LOG, (job_id, version + 2, "running", "completed", me, now))
    return True


def run_many(conn: psycopg.Connection[tuple[object, ...]], me: str, batch: int) -> bool:
    """Claim up to ``batch`` queued jobs and complete them, each step one guarded statement
    and one log INSERT for all its rows (two transactions); False if none was queued."""
    now = time.time()
    with conn.transaction():
        claimed = conn.execute(CLAIM_MANY, (me, now + LEASE_SECONDS, now, batch)).fetchall()
        if not claimed:
            return False
        ids = [row[0] for row in claimed]
        conn.execute(LOG_MANY, ("queued", "running", me, now, ids, [row[1] for row in claimed]))
    # The tasks themselves are no-ops.
    now = time.time()
    with conn.transaction():
        done = conn.execute(COMPLETE_MANY, (now, ids, me)).fetchall()
        if len(done) != len(ids):
            raise RuntimeError(f"lost the lease on {len(ids) - len(done)} job(s)")
        conn.execute(LOG_MANY, ("running", "completed", me, now, [row[0] for row in done],
                                [row[1] for row in done]))
    return True


def worker(dsn: str, idx: int, barrier: Barrier, stop: Event, log: bool,
           batch: int = 1) -> None:
    me = f"floor-{idx}-{os.getpid()}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        while not stop.is_set():
            if not (run_many(conn, me, batch) if batch > 1 else run_one(conn, me, log)):
                time.sleep(IDLE_SLEEP)


def peer(log: bool, batch: int = 1) -> Peer:
    """The floor; with ``batch`` > 1 (always with its log) the batched floor."""
    return Peer(
        name=f"floor+log/{batch}" if batch > 1 else "floor+log" if log else "floor",
        install=install,
        submit_single=lambda dsn, n: submit_single(dsn, n, log),
        submit_bulk=lambda dsn, n: submit_bulk(dsn, n, log),
        worker=worker,
        worker_args=(log, batch),
        done_sql=DONE_SQL,
    )
