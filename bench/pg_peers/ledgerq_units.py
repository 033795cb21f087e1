"""ledgerq's units alone on PostgreSQL: a ceiling for its runtime, not a system.

The same in-transaction units a ledgerq submit and a Worker's pass run (``insert_all``;
``_select``, ``_claim_together``, ``finish_all``: every check, statement and fact the
engine and the store make, the choice read with its spare candidates included), called
in a plain loop on one synchronous psycopg connection per process, each unit its own
transaction as the Worker's is: no event loop, no thread hops, no pool, no supervision
of the run. What ledgerq's runtime adds is the difference between this and ledgerq; a
system of these units could not run faster than this. (bench/units.py is the same for
SQLite.)

  submit single  an application validated, then its row and creation fact, one
                 statement as a transaction of its own (as StateDB sends a plain submit)
  drain          per pass: the choice read and the claims of up to BATCH rows (one READ
                 COMMITTED transaction, as a Worker's pass is), their
                 outcomes after exit 0 (another)
"""

from __future__ import annotations

import asyncio
import os
import time
from multiprocessing.synchronize import Barrier, Event
from typing import TYPE_CHECKING

import psycopg

from pg_peers.harness import BATCH, Peer

if TYPE_CHECKING:
    from ledgerq.queue import TaskApplication

LEASE_TTL = 300.0
HEARTBEAT_TTL = 60.0
IDLE_SLEEP = 0.005
DONE_SQL = "SELECT count(*) FROM schedule_runs WHERE status = 'completed'"
#: What it measures: a submit alone and the drains (a bulk submit is submit_many's).
SCENARIOS = ["submit single", "drain 1", "drain W"]


def _connect(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    """A connection configured as a StateDB's: JSON columns come back as their text."""
    from psycopg.types.string import TextLoader

    conn = psycopg.connect(dsn, autocommit=True)
    conn.adapters.register_loader("jsonb", TextLoader)
    conn.adapters.register_loader("json", TextLoader)
    return conn


def _app() -> TaskApplication:
    from ledgerq.queue import TaskApplication

    return TaskApplication("command", {"argv": ["true"]}, "host")


def install(dsn: str) -> None:
    from ledgerq import StateDB

    async def create() -> None:
        async with StateDB(dsn):  # opening an empty database creates the schema
            pass

    asyncio.run(create())


def submit_bulk(dsn: str, n: int) -> float:
    """The drains' fill (untimed by them): ledgerq's own submit_many."""
    from ledgerq import StateDB
    from ledgerq.queue import submit_many

    async def fill() -> float:
        async with StateDB(dsn) as db:
            t0 = time.perf_counter()
            await submit_many(db, [_app()] * n)
            return time.perf_counter() - t0

    return asyncio.run(fill())


def submit_single(dsn: str, n: int) -> float:
    from ledgerq.lifecycle.registry import default_registry
    from ledgerq.queue.submission.application import validate
    from ledgerq.queue.submission.submit import SUBMITTER, insert_all
    from ledgerq.store.postgres.tx import PostgresTx

    policy = default_registry().entity("schedule_run")
    app = _app()
    with _connect(dsn) as conn:
        t0 = time.perf_counter()
        for _ in range(n):
            tx = PostgresTx(conn, hold_first=True)
            insert_all(tx, policy, [validate(app)], time.time(), "host", SUBMITTER)
            held = tx.take_alone()
            if held is None:
                raise RuntimeError("a plain submit did not hold its one statement back")
            tx.execute(*held)  # autocommit: a transaction of its own
        return time.perf_counter() - t0


def worker(dsn: str, idx: int, barrier: Barrier, stop: Event) -> None:
    from ledgerq.lifecycle.registry import default_registry
    from ledgerq.queue import moves
    from ledgerq.queue.runs import lease_of, terms, worker_actor
    from ledgerq.queue.worker.claim import CLAIM_SPARES, ClaimPass, _claim_together, _select
    from ledgerq.queue.worker.outcomes import finish_all
    from ledgerq.store.postgres.tx import PostgresTx

    policy = default_registry().entity("schedule_run")
    me = f"units-{idx}-{os.getpid()}"
    actor = worker_actor(me)
    with _connect(dsn) as conn:
        barrier.wait()
        while not stop.is_set():
            now = time.time()
            # The choice and its claims in one READ COMMITTED transaction, as a Worker's
            # pass makes them (claim_pass, _choose_and_claim).
            conn.execute("BEGIN READ WRITE")
            tx = PostgresTx(conn)
            chosen = _select(tx, policy, me, now, HEARTBEAT_TTL, [], [], {"host"},
                             ["default"], BATCH * CLAIM_SPARES, ClaimPass())
            got = _claim_together(tx, policy, chosen, BATCH, me, now, LEASE_TTL) \
                if chosen else []
            conn.execute("COMMIT")
            if not chosen:
                time.sleep(IDLE_SLEEP)
                continue
            claimed = [g for g in got if isinstance(g, dict)]
            if not claimed:
                continue
            now = time.time()
            patch = {"ended_at": now, "exit_code": 0, "error_detail": None, "run_attempts": 1,
                     "stdout_tail": None, "stderr_tail": None}
            conn.execute("BEGIN READ WRITE")
            done = finish_all(PostgresTx(conn), policy, [
                terms(r["id"], moves.EXITED_ZERO, actor=actor, summary="",
                      guard=lease_of(policy, r), patch=patch, now=now) for r in claimed], now)
            conn.execute("COMMIT")
            if not all(d is True for d in done):
                raise RuntimeError(f"an outcome did not apply: {done}")


def peer() -> Peer:
    return Peer(name="ledgerq-units", install=install, submit_single=submit_single,
                submit_bulk=submit_bulk, worker=worker, done_sql=DONE_SQL)
