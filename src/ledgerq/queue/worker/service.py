"""The long-running Worker service: the worker tick, made continuous.

One asyncio loop heartbeats, reaps, promotes due retries, fires due schedule slots (unless
``scheduler=False``) and claims only as many rows as it has free capacity; each claimed
row that does not end in its executor's first step runs on in its own task (lease renewal,
deadline, cancel notice, OS lock per key: see :mod:`ledgerq.queue.worker.supervision`), and the
outcomes of those that do are written together.
A submission in the same process wakes the loop at once; otherwise it polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Coroutine, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledgerq.durations import check_span
from ledgerq.errors import DatabaseDamaged, DatabaseError, DatabaseGone
from ledgerq.lifecycle.models import Actor
from ledgerq.queue import moves
from ledgerq.queue.maintenance.departed import DEPARTED_EVERY, forget_departed_workers
from ledgerq.queue.maintenance.promotion import promote_due
from ledgerq.queue.maintenance.reaper import reap_expired_leases
from ledgerq.queue.maintenance.stuck import STUCK_RETRY_SECONDS, StuckRows
from ledgerq.queue.maintenance.undeclared import UNDECLARED_EVERY, UndeclaredReport
from ledgerq.queue.runs import run_policy
from ledgerq.queue.scheduling.scheduler import fire_due
from ledgerq.queue.worker import orphans, wakeup
from ledgerq.queue.worker.claim import claim_pass
from ledgerq.queue.worker.config import (
    DEFAULT_CLAIM_LIMIT,
    DEFAULT_HEARTBEAT_TTL_SECONDS,
    Authorize,
    RunContext,
    WorkerConfig,
)
from ledgerq.queue.worker.executors import Executors
from ledgerq.queue.worker.heartbeat import beat
from ledgerq.queue.worker.keeper import LeaseKeeper
from ledgerq.queue.worker.launcher import OUTPUT_TAIL_BYTES, ExecuteFn
from ledgerq.queue.worker.recycling import Recycling
from ledgerq.queue.worker.starvation import check_file_limit
from ledgerq.queue.worker.supervision import begin_runs, write_ended

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.worker.store import ServiceTx

log = logging.getLogger("ledgerq.runtime")

#: Defaults of the Worker service (the worker functions keep the ADR-0071 queue's values).
DEFAULT_CAPACITY = 4
DEFAULT_POLL_INTERVAL = 0.2
#: A short lease is safe because a healthy worker renews it every third of its TTL;
#: it bounds how long a killed worker's runs wait for the reaper.
DEFAULT_WORKER_LEASE_TTL = 30.0
DEFAULT_SHUTDOWN_GRACE = 10.0
#: After a claim pass that claimed rows and emptied the queue of what it could serve, the
#: next pass starts no sooner than this after it: a steady trickle of submissions, each
#: waking the worker, is then claimed a few rows per pass instead of one, sharing claim
#: and terminal commits (a sequential submitter with a worker serving: ~1.35x
#: lifecycles/s at FULL). A pass that filled its limit, or found nothing, lets the next
#: start at once, so a backlog drains at full speed and an idle worker's first claim is
#: not delayed.
DEFAULT_CLAIM_COOLDOWN = 0.01
DEFAULT_LOCK_DIR = Path(tempfile.gettempdir()) / "ledgerq-locks"
#: Paths that name no file: SQLite's in-memory and private temporary databases.


def _file_identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at ``path`` now; None when nothing is there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class MetricsUnavailable(OSError):
    """A worker asked to serve ``/metrics`` cannot (its port is taken): it refuses to
    start rather than run unseen by every dashboard that scrapes it."""


async def _serve_metrics(db: Any, port: int) -> asyncio.Task[None]:
    """The exporter of ``db``'s metrics on 127.0.0.1:``port``, once it serves."""
    from ledgerq.web.metrics import exporter

    bound = asyncio.Event()
    task = asyncio.create_task(exporter(db, port, bound=bound))
    serving = asyncio.create_task(bound.wait())
    await asyncio.wait({task, serving}, return_when=asyncio.FIRST_COMPLETED)
    serving.cancel()
    if task.done() and task.exception() is not None:
        raise MetricsUnavailable(f"cannot serve metrics on 127.0.0.1:{port}: "
                                 f"{task.exception()}")
    return task


def default_worker_id() -> str:
    """``host:<8 hex>``, the ADR-0071 queue's worker id shape."""
    return f"host:{uuid.uuid4().hex[:8]}"


class Worker:
    """Claims and runs queued rows until :meth:`stop` (or SIGINT/SIGTERM, with
    ``handle_signals=True``, which ``ledgerq worker`` sets: a library worker embedded in
    a server leaves the server's signals alone).

    Concurrency: at most ``capacity`` runs execute at once; equal concurrency keys
    never overlap (checked inside each claim's transaction, across workers) and each
    key's OS lock file under ``lock_dir`` is held while its run executes.
    """

    def __init__(self, db: Database[ServiceTx], *, worker_id: str | None = None,
                 capacity: int = DEFAULT_CAPACITY, poll_interval: float = DEFAULT_POLL_INTERVAL,
                 lease_ttl: float = DEFAULT_WORKER_LEASE_TTL,
                 heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
                 advertised_capabilities: list[str] | None = None,
                 execution_targets: list[str] | None = None,
                 execute: ExecuteFn | None = None,
                 adapters: Mapping[str, ExecuteFn] | None = None,
                 authorize: Authorize | None = None,
                 lock_dir: str | Path | None = DEFAULT_LOCK_DIR,
                 shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE,
                 claim_limit: int = DEFAULT_CLAIM_LIMIT,
                 check_interval: float | None = None,
                 handle_signals: bool = False,
                 claim_cooldown: float = DEFAULT_CLAIM_COOLDOWN,
                 stuck_retry: float = STUCK_RETRY_SECONDS,
                 scheduler: bool = True, output_tail: int = OUTPUT_TAIL_BYTES,
                 max_tasks: int | None = None, max_runtime: float | None = None,
                 queues: Iterable[str] | None = None,
                 metrics_port: int | None = None) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, not {capacity!r}")
        check_file_limit(capacity)
        # Every span checked as a number of seconds a clock can add (NaN, infinity and
        # 1e308 were accepted, and a worker given them never claimed).
        check_span(claim_cooldown, "claim_cooldown")
        check_span(poll_interval, "poll_interval", positive=True)
        check_span(shutdown_grace, "shutdown_grace")
        check_span(stuck_retry, "stuck_retry")
        if db.readonly:
            # Every pass writes (heartbeat, claims, outcomes): refused here, not retried
            # and logged every poll for as long as the process lives.
            raise ValueError("a Worker writes heartbeats, claims and outcomes; its StateDB "
                             "is open read-only (readonly=True)")
        # Refused here, naming what is missing, not at the first claim or exit code.
        moves.check(db.registry)
        #: Who this worker is and what it serves, as every pass and run reads it.
        self.config = WorkerConfig.build(
            worker_id=worker_id or default_worker_id(), lease_ttl=lease_ttl,
            heartbeat_ttl=heartbeat_ttl, claim_limit=claim_limit,
            advertised_capabilities=advertised_capabilities,
            # A worker given no targets (or an empty list) serves and advertises host.
            execution_targets=execution_targets or ["host"], execute=execute,
            adapters=adapters, authorize=authorize, lock_dir=lock_dir,
            check_interval=check_interval, output_tail=output_tail, queues=queues)
        self.db = db
        self.capacity = capacity
        self.poll_interval = poll_interval
        self.shutdown_grace = shutdown_grace
        self.claim_cooldown = claim_cooldown
        self.handle_signals = handle_signals
        #: Where this worker serves Prometheus ``/metrics`` (127.0.0.1), if anywhere.
        self.metrics_port = metrics_port
        #: Whether this worker also runs a scheduler pass (fires due slots) every poll:
        #: any number may, anywhere (each slot still yields one run). Specs without the
        #: schedule entity have nothing to fire.
        self.scheduler = scheduler and moves.SCHEDULE_ENTITY in db.registry.entities
        self._scheduler_actor = Actor(type="scheduler", id=self.config.worker_id)
        #: Runs this worker's scheduler passes fired (observability).
        self.fired = 0
        #: When it drains and exits by itself (max_tasks, max_runtime, a stop request).
        self.recycling = Recycling(max_tasks=max_tasks, max_runtime=max_runtime)
        #: Rows the passes could not move (skipped, reported once; see StuckRows).
        self.stuck = StuckRows(stuck_retry)
        self.stuck_schedules = StuckRows(stuck_retry, what="schedule")
        #: Runs in states the loaded specs lack (a newer release's): counted, logged.
        self.undeclared = UndeclaredReport(self.config.worker_id)
        self._stopping_runs = asyncio.Event()
        self.context = RunContext.from_config(self.config, stopping=self._stopping_runs)
        self.active: dict[str, asyncio.Task[str]] = {}
        self.outcomes: Counter[str] = Counter()
        self.max_active = 0
        #: Claim passes run so far (observability; a cooldown keeps it well below the
        #: number of submissions under a steady trickle).
        self.claim_passes = 0
        self._cooldown_until = 0.0
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._running = False
        #: Per pass, the failure last logged with its traceback (repeats are not).
        self._failing: dict[str, str] = {}
        self._db_identity: tuple[int, int] | None = None
        #: Why the worker stopped by itself: its file is gone or damaged.
        self._gone: DatabaseError | None = None

    @property
    def worker_id(self) -> str:
        return self.config.worker_id

    @property
    def check_interval(self) -> float:
        return self.config.check_interval

    @property
    def executors(self) -> Executors:
        return self.config.executors

    # ------------------------------------------------------------ control

    async def stop(self) -> None:
        """Stop claiming; running runs get ``shutdown_grace`` seconds, then are requeued."""
        self.request_stop()

    def request_stop(self) -> None:
        """The synchronous half of :meth:`stop`, for signal handlers."""
        self._stop.set()
        self._wake.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _note_unserved_entries(self) -> None:
        """Say which tasks the specs' states defer (``on_enter``) that this worker, which
        serves an app's tasks, does not: their runs wait for a worker that does."""
        adapters = self.executors.adapters
        if not adapters:
            return  # no app: its tasks are another worker's to serve
        for policy in self.db.registry.policies():
            for state, tasks in policy.on_enter.items():
                for task in tasks:
                    if task not in adapters:
                        log.warning("worker %s: state %s.%s defers task %s, which this "
                                    "worker does not serve; its runs wait for one that "
                                    "does (ledgerq stats: unserved kinds)", self.worker_id,
                                    policy.name, state, task)

    # ------------------------------------------------------------ loop

    async def run(self) -> None:
        """Serve until stopped; DatabaseGone if the database file is deleted or replaced,
        DatabaseDamaged if SQLite reports it damaged.

        A worker left holding an unlinked file would go on claiming from a queue nobody
        can submit to, while the next submit creates a fresh database at the path: it
        stops instead (running runs are stopped at once, not after the grace period).
        """
        if self._running:
            raise RuntimeError(f"worker {self.worker_id} is already running")
        self._running = True
        self._gone = None
        self.recycling.started = time.time()
        loop = asyncio.get_running_loop()
        installed = self._install_signals(loop)
        wakeup.subscribe(self.db.path, self._wake)
        lock_dir = self.context.lock_dir
        if lock_dir is not None and sys.platform.startswith("linux"):
            killed = orphans.use_ledger(lock_dir / "groups")
            if killed:
                log.warning("worker %s: killed %d process group(s) a dead worker left "
                            "running: %s", self.worker_id, len(killed), killed)
        exporter = None
        keeper = self._start_keeper()
        try:
            if self.metrics_port is not None:
                exporter = await _serve_metrics(self.db, self.metrics_port)
            # Submits in other processes and hosts wake this worker too, where the
            # backend can tell it (PostgreSQL's LISTEN); otherwise it polls.
            await self.db.listen(functools.partial(wakeup.notify, self.db.path))
            self._note_unserved_entries()
            if self.db.file is not None:
                self._db_identity = _file_identity(self.db.file)
                self._check_db_file()
            if self._gone is None:
                await self._loop()
        finally:
            wakeup.unsubscribe(self.db.path, self._wake)
            await self.db.unlisten()
            await self._drain()
            if keeper is not None:
                self.context.keeper = None
                await keeper.stop()
            if exporter is not None:
                exporter.cancel()
                await asyncio.gather(exporter, return_exceptions=True)
            for sig in installed:
                loop.remove_signal_handler(sig)
            self._running = False
        if self._gone is not None:
            raise self._gone

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[int]:
        if not self.handle_signals:
            return []
        installed: list[int] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.request_stop)
            except (NotImplementedError, RuntimeError, ValueError):
                continue  # not the main thread: the owner stops us with stop()
            installed.append(sig)
        return installed

    def _check_db_file(self) -> None:
        """Stop with DatabaseGone once the path no longer names the file we have open."""
        if self.db.file is None:
            return
        now = _file_identity(self.db.file)
        if now is not None and now == self._db_identity:
            return
        what = "deleted" if now is None else "replaced by another file"
        self._gone = DatabaseGone(
            f"database file {self.db.path} was {what} while worker {self.worker_id} had it "
            "open; stopping (its writes would reach no one, and a new submit creates a "
            "fresh database at that path)")
        self._stopping_runs.set()  # nothing they write can be seen: stop them now
        self.request_stop()

    async def _loop(self) -> None:
        heartbeat_every = max(0.05, min(self.config.heartbeat_ttl / 3, 5.0))
        maintain_every = max(self.poll_interval, 0.5)
        last_heartbeat = last_maintain = last_undeclared = last_schedule = float("-inf")
        last_departed = float("-inf")
        while not self._stop.is_set():
            now = time.time()
            self._wake.clear()
            # Each pass is isolated: a reaper that cannot run must not keep the claim
            # pass (and so every new submission) from running, nor the other way round.
            if now - last_heartbeat >= heartbeat_every and await self._step(
                    "heartbeat", beat(self.db, self.config, now=now)):
                last_heartbeat = now
            if now - last_maintain >= maintain_every:
                self._check_db_file()
                if self._stop.is_set():
                    break
                await self._step("reaper", reap_expired_leases(self.db, now=now,
                                                               stuck=self.stuck))
                await self._step("promotion", promote_due(self.db, now=now, stuck=self.stuck))
                await self._step("recycling", self.recycling.check(self.db, self.worker_id, now))
                last_maintain = now
            if self.scheduler and now - last_schedule >= self.poll_interval:
                await self._step("scheduler", self._fire(now))
                last_schedule = now
            if now - last_undeclared >= UNDECLARED_EVERY:
                await self._step("undeclared", self.undeclared.look(self.db, now))
                last_undeclared = now
            if now - last_departed >= DEPARTED_EVERY:
                await self._step("departed", forget_departed_workers(self.db, now=now))
                last_departed = now
            if self.capacity > len(self.active):
                await self._cool_down()
            free = self.recycling.allowance(self.capacity - len(self.active))
            if free > 0 and not self._stop.is_set() and not self.context.claim_pause.paused():
                await self._step("claim", self._claim(min(free, self.config.claim_limit)))
            if self._stop.is_set() or (self.recycling.draining and not self.active):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_interval)

    async def _step(self, name: str, pass_: Awaitable[Any]) -> bool:
        """Run one pass; log a failure with its traceback once, not on every tick.

        The same failure repeating (same pass, same error) is logged at DEBUG only; a
        different one, and the pass's recovery, are logged again.
        """
        try:
            await pass_
        except DatabaseDamaged as exc:
            # Retrying cannot help and every write is refused: stop, and say why once.
            self._gone = exc
            self._stopping_runs.set()
            self.request_stop()
            return False
        except Exception as exc:
            key = f"{type(exc).__name__}: {exc}"
            if self._failing.get(name) != key:
                self._failing[name] = key
                log.exception("worker %s: %s pass failed; retrying every %gs (repeats of "
                              "this error are not logged)", self.worker_id, name,
                              self.poll_interval)
            else:
                log.debug("worker %s: %s pass failed again: %s", self.worker_id, name, key)
            return False
        if self._failing.pop(name, None) is not None:
            log.warning("worker %s: %s pass works again", self.worker_id, name)
        return True

    async def _fire(self, now: float) -> None:
        done = await fire_due(self.db, now=now, actor=self._scheduler_actor,
                              stuck=self.stuck_schedules)
        self.fired += len(done.fired) + len(done.skipped)

    async def _cool_down(self) -> None:
        """Wait out the cooldown after a pass that drained the queue (only a stop cuts it)."""
        remaining = self._cooldown_until - time.monotonic()
        if remaining > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), remaining)

    async def _claim(self, limit: int) -> None:
        started = time.monotonic()
        self.claim_passes += 1
        got = await claim_pass(self.db, self.config, limit=limit, stuck=self.stuck)
        self.recycling.note_claimed(len(got.claimed), self.worker_id)
        begun = begin_runs(self.db, got.claimed, self.context)
        for run, coro in begun.going:
            task = asyncio.get_running_loop().create_task(self._execute(run, coro))
            self.active[run["id"]] = task
            self.max_active = max(self.max_active, len(self.active))
        if len(got.claimed) == limit:
            self._wake.set()  # there may be more: claim again without waiting
        # Only a pass that claimed some rows and drained the queue starts a cooldown: the
        # next arrivals are then worth gathering. After an empty pass nothing is pending,
        # so a new submission is claimed at once; after a full one the backlog goes on.
        drained = 0 < len(got.claimed) < limit
        self._cooldown_until = started + self.claim_cooldown if drained else 0.0
        # Runs that ended in their first step (or were refused) write their outcomes
        # together, here; the pass's capacity was never theirs for longer.
        ended = await write_ended(self.db, begun.ended, self.context)
        for run, outcome in begun.settled(ended):
            self._count(run, outcome)

    async def _execute(self, run: dict[str, Any], going: Coroutine[Any, Any, str]) -> str:
        try:
            outcome: str | Exception = await going
        except Exception as exc:
            outcome = exc
        finally:
            self.active.pop(run["id"], None)
            self._wake.set()  # capacity freed
        return self._count(run, outcome)

    def _start_keeper(self) -> LeaseKeeper | None:
        """The thread that renews this worker's leases whatever its loop is doing (see
        keeper.py); None where no second handle reaches the database (``:memory:``),
        whose runs' leases the loop renews."""
        twin = self.db.twin()
        if twin is None:
            return None
        keeper = LeaseKeeper(twin, run_policy(self.db), worker_id=self.worker_id,
                             lease_ttl=self.config.lease_ttl,
                             interval=self.config.check_interval, clock=self.context.clock,
                             owned=twin is not self.db)
        keeper.start()
        self.context.keeper = keeper
        return keeper

    def _count(self, run: dict[str, Any], outcome: str | Exception) -> str:
        """Count a run's outcome; an exception is its supervisor's crash, counted as error."""
        if self.context.keeper is not None:
            self.context.keeper.forget(run["id"])
        if isinstance(outcome, Exception):
            log.error("worker %s: run %s crashed its supervisor", self.worker_id, run["id"],
                      exc_info=outcome)
            outcome = "error"
        self.outcomes[outcome] += 1
        return outcome

    async def _drain(self) -> None:
        """Let running runs finish within the grace period, then stop and requeue the rest."""
        if not self.active:
            return
        tasks = list(self.active.values())
        _, pending = await asyncio.wait(tasks, timeout=self.shutdown_grace)
        if pending:
            log.warning("worker %s: %d run(s) still running after %.1fs; stopping and "
                        "requeueing them", self.worker_id, len(pending), self.shutdown_grace)
            self._stopping_runs.set()
            await asyncio.wait(pending)
