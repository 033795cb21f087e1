"""``App``: a database, the tasks declared on it, and the ways to run them.

One object a Python team holds: ``@app.task`` declares tasks, ``async with app`` opens
the database (``app.db``, a :class:`~ledgerq.StateDB`), ``app.worker()`` serves the
tasks, ``await app.drain()`` runs everything runnable in-process (tests, scripts), and
the sync calls (``task.defer``, ``run.result``, ``app.drain_sync``) go through one
background loop per app with its own handle, opened on first use.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ledgerq.durations import MAX_EPOCH
from ledgerq.errors import InvalidInput
from ledgerq.queue.moves import DEFAULT_QUEUE
from ledgerq.queue.submission import task_kinds
from ledgerq.queue.submission.application import (
    DEFAULT_TARGET,
    EXECUTION_TARGETS,
    RetryPolicy,
    Vocabulary,
    check_queue,
)
from ledgerq.queue.submission.task_kinds import TaskKind
from ledgerq.queue.worker import wakeup
from ledgerq.tasks.bridge import LoopThread
from ledgerq.tasks.execution import MAX_RESULT_BYTES, executor_for
from ledgerq.tasks.hooks import Hooks
from ledgerq.tasks.task import Isolation, Task

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import Registry
    from ledgerq.lifecycle.transactions import Transaction
    from ledgerq.queue.worker.launcher import ExecuteFn
    from ledgerq.queue.worker.service import Worker
    from ledgerq.store.db import StateDB, Synchronous

F = TypeVar("F", bound=Callable[..., Any])
H = TypeVar("H", bound=Callable[..., Any])

#: Threads for sync tasks when no worker sized the pool (a drain).
DEFAULT_THREADS = 8
#: Runs one drain pass claims at most.
DRAIN_BATCH = 100


class App:
    """A task queue for Python functions, on one database (SQLite file, ``:memory:`` or
    PostgreSQL URL, as :class:`~ledgerq.StateDB` takes; ``pooled`` and ``listen_url`` as
    it takes them behind a pooler)."""

    def __init__(self, target: str | Path, *, registry: Registry | None = None,
                 specs: str | Path | None = None, synchronous: Synchronous = "NORMAL",
                 targets: Iterable[str] | None = None,
                 default_queue: str = DEFAULT_QUEUE, pooled: bool = False,
                 listen_url: str | None = None) -> None:
        if registry is not None and specs is not None:
            raise InvalidInput("App: give registry or specs, not both")
        if specs is not None:
            from ledgerq.lifecycle.registry import load_registry

            registry = load_registry(specs)
        self.target, self.registry, self.synchronous = target, registry, synchronous
        self.pooled, self.listen_url = pooled, listen_url
        self.targets = frozenset(EXECUTION_TARGETS if targets is None else targets)
        if isinstance(targets, str) or not self.targets:
            raise InvalidInput("App: targets must be a non-empty list of target names")
        self.default_target = DEFAULT_TARGET if DEFAULT_TARGET in self.targets \
            else sorted(self.targets)[0]
        self.default_queue = check_queue(default_queue, "App: default_queue")
        self.tasks: dict[str, Task[Any]] = {}
        #: Queues this app's tasks and defers used: what a drain serves.
        self.queues: set[str] = {self.default_queue}
        self.bridge = LoopThread(name="ledgerq-app")
        self._db: StateDB | None = None
        self._sync_db: StateDB | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_size = 0
        #: Functions called as each run of this app's tasks starts and ends.
        self.hooks = Hooks()

    def __repr__(self) -> str:
        return f"<App {self.target!s} tasks={len(self.tasks)}>"

    # -- declaring tasks -------------------------------------------------------------

    @overload
    def task(self, fn: F, /) -> Task[Any]: ...

    @overload
    def task(self, *, name: str | None = None, queue: str | None = None, priority: int = 0,
             retry: RetryPolicy | int | None = None, timeout: float | None = None,
             retry_on: type[BaseException] | Sequence[type[BaseException]] = (Exception,),
             no_retry_on: type[BaseException] | Sequence[type[BaseException]] = (),
             capabilities: Sequence[str] = (), target: str | None = None,
             isolation: Isolation = "thread",
             max_result_bytes: int = MAX_RESULT_BYTES) -> Callable[[F], Task[Any]]: ...

    def task(self, fn: Callable[..., Any] | None = None, /, **options: Any) -> Any:  # type: ignore[misc]
        """Declare a task: ``@app.task`` or ``@app.task(name=..., queue=..., retry=...)``.

        Its name (default ``module.qualname``) is its runs' action kind; declaring two
        tasks under one name is refused.
        """
        def declare(f: Callable[..., Any]) -> Task[Any]:
            task: Task[Any] = Task(self, f, **options)
            if task.name in self.tasks:
                raise InvalidInput(f"task {task.name!r} is declared twice on this app")
            self.tasks[task.name] = task
            self.queues.add(task.queue)
            return task

        return declare if fn is None else declare(fn)

    def on_started(self, hook: H) -> H:
        """Register ``hook(run)``, called in the worker as each run starts."""
        self.hooks.started.append(hook)
        return hook

    def on_succeeded(self, hook: H) -> H:
        """Register ``hook(run, value)``, called with the return value as a run completes."""
        self.hooks.succeeded.append(hook)
        return hook

    def on_failed(self, hook: H) -> H:
        """Register ``hook(run, exception)``, called as a run fails, times out or is
        stopped (before a retry too)."""
        self.hooks.failed.append(hook)
        return hook

    @property
    def vocabulary(self) -> Vocabulary:
        """What this app's defers may name: the ADR-0071 queue's kinds and its tasks."""
        return Vocabulary(task_kinds=frozenset(self.tasks), targets=self.targets)

    def deferred_to(self, queue: str) -> None:
        self.queues.add(queue)

    # -- the database ----------------------------------------------------------------

    def _new_db(self) -> StateDB:
        from ledgerq.store.db import StateDB

        return StateDB(self.target, registry=self.registry, synchronous=self.synchronous,
                       pooled=self.pooled, listen_url=self.listen_url)

    @property
    def db(self) -> StateDB:
        """The app's database handle (opened by ``async with app`` / :meth:`open`)."""
        if self._db is None:
            self._db = self._new_db()
        return self._db

    def retarget(self, target: str | Path) -> None:
        """Point the app at another database (a test's scratch one: the ``ledgerq_app``
        fixture); InvalidInput while a handle of it is open."""
        if (self._db is not None and self._db.is_open) or self._sync_db is not None:
            raise InvalidInput("App.retarget(): close the app first (async with app: ..., "
                               "app.close_sync())")
        self.target, self._db = target, None

    async def open(self) -> App:
        """Open the database, and record this app's tasks in it (their names and their
        parameters' JSON Schema: what the command line and the HTTP API check a
        submission of them against)."""
        if not self.db.is_open:
            await self.db.open()
            await self.record_tasks(self.db)
            await self._hear_ends(self.db)
        return self

    async def _hear_ends(self, db: StateDB) -> None:
        """Wake this process's result waits when another process or host ends a run
        (PostgreSQL's NOTIFY; SQLite has no such channel and they poll)."""
        await db.listen(functools.partial(wakeup.notify, db.path, wakeup.ENDED),
                        channel="ended")

    async def record_tasks(self, db: StateDB) -> None:
        if not db.readonly and self.tasks:
            await task_kinds.record(db, [
                TaskKind(name, task.arguments.json_schema(), task.returns.json_schema(),
                         task.queue, defaults=task.defaults())
                for name, task in self.tasks.items()])

    async def close(self) -> None:
        """Close the async handle; the sync side stays until :meth:`close_sync`."""
        if self._db is not None and self._db.is_open:
            await self._db.unlisten(channel="ended")
            await self._db.close()

    async def __aenter__(self) -> App:
        return await self.open()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def sync_db(self) -> StateDB:
        """The handle sync calls use, opened on the app's background loop on first use."""
        if self._sync_db is None:
            db = self._new_db()
            await db.open()
            await self.record_tasks(db)
            await self._hear_ends(db)
            self._sync_db = db
        return self._sync_db

    def close_sync(self) -> None:
        """Close the sync side's handle and stop its background loop."""
        db, self._sync_db = self._sync_db, None
        if db is not None:
            async def close() -> None:
                await db.unlisten(channel="ended")
                await db.close()

            self.bridge.run(close(), what="App.close_sync()")
        self.bridge.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    # -- running tasks ---------------------------------------------------------------

    def pool(self, threads: int = DEFAULT_THREADS) -> ThreadPoolExecutor:
        """The thread pool sync tasks run in (grown to ``threads`` when asked)."""
        if self._pool is None or self._pool_size < threads:
            if self._pool is not None:
                self._pool.shutdown(wait=False)  # its running tasks finish on their own
            self._pool = ThreadPoolExecutor(max_workers=threads,
                                            thread_name_prefix="ledgerq-task")
            self._pool_size = threads
        return self._pool

    def executors(self, threads: int = DEFAULT_THREADS) -> Mapping[str, ExecuteFn]:
        """Task name -> the worker's executor for it (an adapter of its kind)."""
        pool = self.pool(threads)
        return {name: executor_for(task, pool, self.hooks) for name, task in self.tasks.items()}

    def worker(self, *, capacity: int = 8, queues: Iterable[str] | None = None,
               **options: Any) -> Worker:
        """A :class:`~ledgerq.queue.Worker` serving this app's tasks (and the ADR-0071
        queue's kinds it can run); ``await worker.run()``. ``queues`` default: every queue the
        app's tasks name."""
        from ledgerq.queue.worker.service import Worker

        return Worker(self.db, capacity=capacity, adapters=self.executors(capacity),
                      queues=sorted(self.queues) if queues is None else queues, **options)

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Transaction]:
        """``app.db.transaction()``: defers given ``tx=`` commit together, or none."""
        return self.db.transaction()

    async def drain(self, *, advance_clock: bool = False,
                    queues: Iterable[str] | None = None) -> int:
        """Run every runnable run of this app's tasks in-process, tasks deferred by tasks
        included, until none is left; the number of runs executed.

        ``advance_clock``: runs waiting for a time (a delay, a retry's backoff) are run
        too, the clock moved to each one's time as if it had come. Test mode: usable
        with ``:memory:``; no worker needed.
        """
        return await _drain(self, self.db, advance_clock=advance_clock, queues=queues)

    def drain_sync(self, *, advance_clock: bool = False,
                   queues: Iterable[str] | None = None) -> int:
        """:meth:`drain` from synchronous code, on the sync side's handle."""
        async def go() -> int:
            return await _drain(self, await self.sync_db(), advance_clock=advance_clock,
                                queues=queues)

        return self.bridge.run(go(), what="App.drain_sync()")


async def _drain(app: App, db: StateDB, *, advance_clock: bool,
                 queues: Iterable[str] | None) -> int:
    from ledgerq.queue.runs import run_policy
    from ledgerq.queue.worker.functions import worker_tick

    if not db.is_open:
        await db.open()
    served = sorted(app.queues if queues is None else set(queues))
    adapters = app.executors()
    policy = run_policy(db)
    now: float | None = None
    ran = 0
    stalled = False
    while True:
        got = await worker_tick(db, worker_id="drain", adapters=adapters, now=now,
                                limit=DRAIN_BATCH, queues=served)
        ran += got["claimed"]
        if got["claimed"]:
            continue
        if not advance_clock:
            return ran
        due = await db.read(lambda tx: [
            *(r["retry_due_at"] for r in tx.list_due_retries(policy, MAX_EPOCH)),
            *(r["not_before"] for r in tx.list_due_starts(policy, MAX_EPOCH))])
        clock = time.time() if now is None else now
        later = [t for t in due if t is not None and t > clock]
        if not later:
            if due and not stalled:  # due now: the next tick promotes them
                stalled, now = True, clock
                continue
            return ran
        stalled, now = False, min(later)


__all__ = ["App"]
