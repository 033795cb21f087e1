"""Scratch databases, worker processes and the five scenarios shared by bench/postgres.py.

A system under test is a :class:`Peer`: how to install its schema into an empty database,
how to submit N tasks one transaction at a time and N in one call, a worker process
target, and the SQL that counts its completed tasks. :func:`measure` runs every scenario
of one peer, each on a fresh scratch database that it drops afterwards:

  submit single  N submits, one transaction each, from one sequential caller
  submit bulk    N submits in one call / one transaction
  drain 1        N tasks pre-filled (bulk, untimed), one worker process claims and
                 completes them all; timed from the release of the ready workers to the
                 first poll that counts N completed in the database
  drain W        the same with W worker processes (each its own connection)
  end to end     W idle workers, then one submitter in this process submits N tasks one
                 at a time; timed from the workers' release to N completed

Worker processes are spawned (not forked: no libpq socket is shared), set themselves up,
then wait on a barrier so neither interpreter start-up nor imports nor connecting count.
Completion is what the database says, counted over a separate connection (every POLL
seconds near the end, less often before: :func:`next_poll`), so a system that buffers
completions in memory is timed until they commit.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import psycopg

SCENARIOS = ["submit single", "submit bulk", "drain 1", "drain W", "end to end"]
#: How many tasks every batching system here takes at once, so each runs with the same
#: batch: PgQueuer's batch_size (its performance guide's example for short jobs; its
#: default is 10), ledgerq's Worker capacity (a claim pass's size), the batched floor's B.
BATCH = 25
POLL = 0.005
#: Seconds for the postmaster to reap a backend after its connection closes (see fill).
SETTLE = 0.3
READY_TIMEOUT = 120.0

#: A worker process target: (scratch dsn, worker index, barrier, stop event, *args).
WorkerFn = Callable[..., None]


@dataclass
class Peer:
    name: str
    install: Callable[[str], None]
    submit_single: Callable[[str, int], float]
    submit_bulk: Callable[[str, int], float]
    worker: WorkerFn
    done_sql: str
    worker_args: tuple[Any, ...] = ()
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ scratch databases

def with_dbname(dsn: str, dbname: str) -> str:
    """``dsn`` (a postgresql:// URL) pointing at another database."""
    parts = urllib.parse.urlsplit(dsn)
    return urllib.parse.urlunsplit(parts._replace(path="/" + dbname))


class Scratch:
    """Creates ``ledgerq_bench_<pid>_<k>`` databases and drops every one it made."""

    def __init__(self, base_dsn: str) -> None:
        self.base_dsn = base_dsn
        self.prefix = f"ledgerq_bench_{os.getpid()}_"
        self.count = 0
        self.live: set[str] = set()

    def _admin(self, sql: str) -> None:
        self.wait_for_server()
        with psycopg.connect(self.base_dsn, autocommit=True) as conn:
            conn.execute(sql)

    def server_started(self) -> object:
        """pg_postmaster_start_time(): it changes when the server restarts."""
        with psycopg.connect(self.base_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
            return row[0] if row else None

    def wait_for_server(self, timeout: float = 60.0) -> None:
        """Return once the server accepts connections (a restart takes a moment)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(self.base_dsn, connect_timeout=5).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def create(self) -> tuple[str, str]:
        self.count += 1
        name = f"{self.prefix}{self.count}"
        self._admin(f'CREATE DATABASE "{name}"')
        self.live.add(name)
        return name, with_dbname(self.base_dsn, name)

    def drop(self, name: str) -> None:
        # WITH (FORCE): a worker that failed to exit must not keep the database alive.
        self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.live.discard(name)

    def drop_all(self) -> None:
        for name in sorted(self.live):
            try:
                self.drop(name)
            except psycopg.Error as exc:  # report, and go on dropping the others
                print(f"  could not drop scratch database {name}: {exc}")


# ------------------------------------------------------------------ worker processes

def _child(target: WorkerFn, dsn: str, idx: int, barrier: Barrier, stop: Event,
           args: tuple[Any, ...]) -> None:
    try:
        target(dsn, idx, barrier, stop, *args)
    except BaseException:
        barrier.abort()  # the parent's barrier.wait() raises instead of hanging
        raise


def count(dsn: str, sql: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        return int(row[0]) if row else 0


def process_cpu(pid: int) -> float:
    """Seconds of CPU process ``pid`` has used so far, all its threads (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: The longest wait between two counts of a run's completions.
MAX_POLL = 0.1


def next_poll(poll: float, left: int, since: int, seconds: float) -> float:
    """How long to wait before counting completions again: half the time the latest rate
    (``since`` completions in ``seconds``) says the ``left`` ones take, at least ``poll``
    and at most :data:`MAX_POLL`.

    The count reads the whole table, and on two cores its server time is taken from
    the system under test, more on a wide table than on a narrow one: counted every 5 ms,
    ledgerq's table cost about 15 us of server CPU a lifecycle in a 2,000-task drain,
    PgQueuer's about 3. Waiting half the time left (at that rate) counts a drain a
    handful of times, and every ``poll`` seconds near its end, so the end is still
    found within ``poll`` unless the rate more than doubles in its last moments.
    """
    if since <= 0 or seconds <= 0:
        return poll
    return min(max(poll, left * seconds / since / 2), MAX_POLL)


def fill(peer: Peer, dsn: str, n: int) -> None:
    """N tasks for a drain, then the server left with nothing of the fill's to do.

    A checkpoint first, so the fill, not the drain, writes the full-page images each
    page's first change after a checkpoint costs (a task submitted and drained within
    seconds rarely has one between the two); after it VACUUM ANALYZE, the work
    autovacuum's insert threshold would otherwise send a worker to do, and a moment for
    the postmaster to reap this connection's backend (an exited backend's CPU shows in
    the postmaster's times once reaped; bench/pg_cpu.py reads them). Without these, a
    drain of a second or two caught either at random: ledgerq's server CPU a lifecycle
    moved 220-360 us between rounds, the schema floor's 158-258, PgQueuer's 128-136.
    Every system gets the same; the vacuum the drain's own dead rows call for comes
    after it, for all.
    """
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
    peer.submit_bulk(dsn, n)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
    time.sleep(SETTLE)


def run_workers(peer: Peer, dsn: str, workers: int, n: int,
                during: Callable[[], object] | None = None,
                timeout: float | None = None, cpu: list[float] | None = None,
                poll: float = POLL) -> float:
    """Seconds from releasing ``workers`` ready processes until ``n`` tasks are done,
    counted at most every ``poll`` seconds (:func:`next_poll`). ``cpu``, if given, gets
    the CPU seconds the workers used in that time appended."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(workers + 1)
    stop = ctx.Event()
    procs = [ctx.Process(target=_child, args=(peer.worker, dsn, i, barrier, stop,
                                              peer.worker_args), daemon=True)
             for i in range(workers)]
    for p in procs:
        p.start()
    limit = timeout if timeout is not None else max(60.0, n / 20)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            barrier.wait(timeout=READY_TIMEOUT)
            t0 = time.perf_counter()
            if cpu is not None:
                ready = sum(process_cpu(p.pid) for p in procs if p.pid is not None)
            if during is not None:
                during()
            last = (t0, 0)
            while True:
                row = conn.execute(peer.done_sql).fetchone()
                done = int(row[0]) if row else 0
                now = time.perf_counter()
                if done >= n:
                    seconds = time.perf_counter() - t0
                    if cpu is not None:
                        cpu.append(sum(process_cpu(p.pid) for p in procs
                                       if p.pid is not None) - ready)
                    return seconds
                if time.perf_counter() - t0 > limit:
                    raise TimeoutError(f"{peer.name}: {done}/{n} done after {limit:.0f} s")
                if any(not p.is_alive() for p in procs):
                    raise RuntimeError(f"{peer.name}: a worker exited early ({done}/{n} done)")
                time.sleep(next_poll(poll, n - done, done - last[1], now - last[0]))
                last = (now, done)
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=15)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


# ------------------------------------------------------------------ scenarios

def measure(peer: Peer, scratch: Scratch, n: int, workers: int,
            scenarios: Sequence[str] = SCENARIOS) -> dict[str, float]:
    """Lifecycles (or submits) per second for each of ``scenarios``; NaN where one
    failed."""
    out: dict[str, float] = {}

    def once(fn: Callable[[str], float]) -> float:
        name, dsn = scratch.create()
        try:
            peer.install(dsn)
            return fn(dsn)
        finally:
            scratch.drop(name)

    def scenario(label: str, fn: Callable[[str], float]) -> None:
        for attempt in (1, 2):
            started = scratch.server_started()
            try:
                seconds = once(fn)
            except Exception as exc:
                scratch.wait_for_server()
                if attempt == 1 and scratch.server_started() != started:
                    # Something else (a test that restarts the cluster) restarted the
                    # server mid-measurement: the figure would mean nothing; run it again.
                    print(f"  {peer.name:<14} {label:<14} server restarted; again",
                          flush=True)
                    continue
                out[label] = float("nan")
                print(f"  {peer.name:<14} {label:<14} FAILED: {type(exc).__name__}: {exc}",
                      flush=True)
                return
            out[label] = n / seconds
            print(f"  {peer.name:<14} {label:<14} {n / seconds:9.0f} /s  ({seconds:.2f} s)",
                  flush=True)
            return

    def drain(k: int) -> Callable[[str], float]:
        def fn(dsn: str) -> float:
            fill(peer, dsn, n)  # not timed
            return run_workers(peer, dsn, k, n)
        return fn

    def end_to_end(dsn: str) -> float:
        return run_workers(peer, dsn, workers, n, during=lambda: peer.submit_single(dsn, n))

    runs: dict[str, Callable[[str], float]] = {
        "submit single": lambda dsn: peer.submit_single(dsn, n),
        "submit bulk": lambda dsn: peer.submit_bulk(dsn, n),
        "drain 1": drain(1), "drain W": drain(workers), "end to end": end_to_end}
    for label in scenarios:
        scenario(label, runs[label])
    return out
