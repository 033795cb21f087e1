"""A claimed run while it executes: its lease kept alive, its deadline kept, a cancel noticed.

The executor runs as a task beside a loop that wakes every check interval (unless its
first step, taken at once, already finished it: see :func:`_start`): the lease
is checked (a reap, a cancel or a reclaim stops the child and writes nothing), renewed
once a third of its TTL has passed, and the deadline and a shutdown are honoured.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.config import DEFAULT_LEASE_TTL_SECONDS, LEASE_CHECK_SECONDS
from ledgerq.queue.executors import Executors
from ledgerq.queue.launcher import OUTPUT_TAIL_BYTES, ExecuteFn, OutputCapture, capturing
from ledgerq.queue.leases import LeaseReads, until_next_check
from ledgerq.queue.locks import KeyLock
from ledgerq.queue.outcomes import Outcome, lost_outcome, record_outcome
from ledgerq.queue.runs import (
    MalformedRow,
    decode_run,
    lease_of,
    perform,
    run_policy,
    worker_actor,
)

if TYPE_CHECKING:
    from ledgerq.queue.config import WorkerConfig
    from ledgerq.store.db import StateDB

log = logging.getLogger("ledgerq.worker")

#: A lease is renewed once this fraction of its TTL has passed.
RENEW_FRACTION = 1 / 3
#: exit_code recorded for a run killed at its deadline (the coreutils ``timeout`` convention).
TIMEOUT_EXIT_CODE = 124

Authorize = Callable[[dict[str, Any]], "bool | str | Awaitable[bool | str]"]

#: A run given back to the queue because its worker is stopping (not a failed attempt).
SHUTDOWN = Outcome(moves.SHUTDOWN)


@dataclass
class RunContext:
    """How one claimed run is supervised while it executes."""

    worker_id: str
    lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS
    clock: Callable[[], float] = time.time
    executors: Executors = field(default_factory=Executors)
    authorize: Authorize | None = None
    lock_dir: Path | None = None
    check_interval: float = LEASE_CHECK_SECONDS
    stopping: asyncio.Event | None = None
    #: Shared by the runs of one worker (or one pass): their checks become one read.
    lease_reads: LeaseReads = field(default_factory=LeaseReads)
    #: Bytes of each output stream a run records (see launcher.OutputCapture).
    output_tail: int = OUTPUT_TAIL_BYTES

    @classmethod
    def from_config(cls, config: WorkerConfig, *, clock: Callable[[], float] = time.time,
                    stopping: asyncio.Event | None = None) -> RunContext:
        return cls(worker_id=config.worker_id, lease_ttl=config.lease_ttl, clock=clock,
                   executors=config.executors, authorize=config.authorize,
                   lock_dir=config.lock_dir, check_interval=config.check_interval,
                   stopping=stopping, output_tail=config.output_tail)


class LeaseLost(Exception):
    """The run's lease is no longer ours (reaped, cancelled, reclaimed)."""

    def __init__(self, message: str, outcome: str = "lost") -> None:
        super().__init__(message)
        #: How the run counts: ``cancelled`` or ``lost`` (see outcomes.lost_outcome).
        self.outcome = outcome


async def execute_claimed(db: StateDB, run: dict[str, Any], ctx: RunContext) -> str:
    """Run one claimed row to an end and write its outcome, guarded on our lease.

    Returns the state written (``completed``, ``failed``, ``retry_wait``,
    ``timed_out``, ``queued`` on shutdown), ``cancelled`` when an operator cancelled it
    meanwhile, or ``lost`` when the lease went away otherwise; in those two cases the
    child is stopped and nothing is written.
    """
    policy = run_policy(db)
    # The lease the claim gave this worker: the row's, owned by us whatever it says.
    lease = {**lease_of(policy, run), "leased_by": ctx.worker_id}
    try:
        decoded = decode_run(policy, run)
    except MalformedRow as exc:
        return await record_outcome(db, policy, run, lease, ctx, Outcome(
            moves.RAISED, 1, str(exc)))
    if ctx.authorize is not None:
        try:
            verdict = ctx.authorize(decoded)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception as exc:  # fail closed: a broken hook denies, it does not strand the row
            verdict = f"authorize hook raised {type(exc).__name__}: {exc}"
        if verdict is not True:
            why = verdict if isinstance(verdict, str) and verdict else "denied by authorize hook"
            return await record_outcome(db, policy, run, lease, ctx, Outcome(
                moves.UNAUTHORIZED, None, f"unauthorized: {why}"))
    executor = ctx.executors.for_kind(run["action_kind"])
    if executor is None:
        return await record_outcome(db, policy, run, lease, ctx, Outcome(
            moves.RAISED, 1, f"no executor for action kind {run['action_kind']!r}"))
    key = run.get("concurrency_key")
    lock = KeyLock(ctx.lock_dir, key) if key and ctx.lock_dir is not None else None
    try:
        if lock is not None:
            next_check = 0.0
            while not lock.try_acquire():
                if ctx.stopping is not None and ctx.stopping.is_set():
                    return await record_outcome(db, policy, run, lease, ctx, SHUTDOWN)
                if time.monotonic() >= next_check:
                    await _supervise_once(db, policy, run, lease, ctx)
                    next_check = time.monotonic() + ctx.check_interval
                await asyncio.sleep(0.05)
        return await _run_supervised(db, policy, run, decoded, lease, executor, ctx)
    except LeaseLost as exc:
        log.info("run %s: lease lost (%s); child stopped, nothing written", run["id"], exc)
        return exc.outcome
    finally:
        if lock is not None:
            lock.release()


async def _run_supervised(db: StateDB, policy: EntityPolicy, run: dict[str, Any],
                          decoded: dict[str, Any], lease: dict[str, Any], executor: ExecuteFn,
                          ctx: RunContext) -> str:
    started = ctx.clock()
    timeout = run.get("timeout_seconds")
    deadline = started + timeout if timeout else None
    # The executor's context is a copy, capture included: what it launches fills the
    # capture, and what it sets stays its own.
    with capturing(OutputCapture(ctx.output_tail)) as capture:
        task = _start(executor, decoded, contextvars.copy_context())

    def ended(move: moves.Move, exit_code: int | None, detail: str | None = None, *,
              retryable: bool = False) -> Outcome:
        return Outcome(move, exit_code, detail, retryable=retryable, output=capture.columns())

    try:
        while not task.done():
            wait = until_next_check(ctx.check_interval)
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - ctx.clock()))
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                break
            if deadline is not None and ctx.clock() >= deadline:
                await _stop(task)
                return await record_outcome(db, policy, run, lease, ctx, ended(
                    moves.TIMED_OUT, TIMEOUT_EXIT_CODE,
                    f"timed out after {timeout:g}s; process group killed"))
            if ctx.stopping is not None and ctx.stopping.is_set():
                await _stop(task)
                return await record_outcome(db, policy, run, lease, ctx, SHUTDOWN)
            try:
                await _supervise_once(db, policy, run, lease, ctx)
            except LeaseLost:
                raise
            except Exception as exc:  # e.g. a busy database: the lease may still be ours
                log.warning("run %s: lease check failed (%s); retrying at the next check",
                            run["id"], exc)
    except BaseException:
        await _stop(task)
        raise
    try:
        code, detail = task.result()
    except Exception as exc:
        return await record_outcome(db, policy, run, lease, ctx, ended(
            moves.RAISED, 1, f"{type(exc).__name__}: {exc}", retryable=True))
    if code == 0:
        return await record_outcome(db, policy, run, lease, ctx, ended(moves.EXITED_ZERO, 0))
    return await record_outcome(db, policy, run, lease, ctx, ended(
        moves.EXITED_NONZERO, code, detail or f"exit code {code}", retryable=True))


async def _call(executor: ExecuteFn, decoded: dict[str, Any]) -> tuple[int, str]:
    """Call inside the coroutine, so an executor raising before it awaits is a failed run
    too."""
    return await executor(decoded)


def _start(executor: ExecuteFn, decoded: dict[str, Any], context: contextvars.Context
           ) -> asyncio.Future[tuple[int, str]]:
    """The executor's run, its first step taken at once (in ``context``): a done future
    when that step finished it, else a task (in the same context) that goes on from there.

    What asyncio's eager tasks do (3.12's ``eager_task_factory``): an executor that needs
    no wait (an in-process handler) costs no task, no turn of the loop and no timed wait;
    one that waits (a subprocess) is a task, supervised as before.
    """
    loop = asyncio.get_running_loop()
    coro = _call(executor, decoded)
    try:
        pending = context.run(coro.send, None)
    except StopIteration as stop:
        done: asyncio.Future[tuple[int, str]] = loop.create_future()
        done.set_result(stop.value)
        return done
    except Exception as exc:  # raised before its first wait: a failed run, as in a task
        failed: asyncio.Future[tuple[int, str]] = loop.create_future()
        failed.set_exception(exc)
        return failed
    return loop.create_task(_Started(coro, pending), context=context)


class _Started(collections.abc.Coroutine[Any, Any, tuple[int, str]]):
    """An executor's coroutine whose first step ran already (it waits on ``pending``), as
    the coroutine a task runs: the task's first step is handed ``pending`` to wait on, and
    every later value, and every exception thrown (a cancel, even one before the task's
    first step), goes to the executor's coroutine where it waits."""

    def __init__(self, coro: Coroutine[Any, Any, tuple[int, str]], pending: Any) -> None:
        self._coro = coro
        self._pending: Any = pending
        self._handed = False
        # What a task's repr and asyncio's debug messages name.
        self.__name__ = self.__qualname__ = getattr(coro, "__qualname__", "executor")

    def send(self, value: Any) -> Any:
        if not self._handed:
            self._handed = True
            pending, self._pending = self._pending, None
            return pending
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._handed = True
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # the old three-argument form

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, tuple[int, str]]:
        raise TypeError("an executor's run goes on as a task (supervision._start)")


async def _stop(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def _supervise_once(db: StateDB, policy: EntityPolicy, run: dict[str, Any],
                          lease: dict[str, Any], ctx: RunContext) -> None:
    """Raise LeaseLost if the row is no longer ours; renew the lease when it is due."""
    row = await ctx.lease_reads.lease_row(db, run["id"])
    if (row is None or row["status"] != moves.RENEWED.source
            or any(row[c] != held for c, held in lease.items())):
        raise LeaseLost("row changed under us: " + (row["status"] if row else "deleted"),
                        lost_outcome(row, lease))
    now = ctx.clock()
    if now < lease["lease_expires_at"] - ctx.lease_ttl * (1 - RENEW_FRACTION):
        return
    new_expiry = now + ctx.lease_ttl
    applied = await db.write(lambda tx: perform(
        tx, policy, run["id"], moves.RENEWED, actor=worker_actor(ctx.worker_id),
        guard=dict(lease),
        patch={"lease_expires_at": new_expiry}, now=now).applied)
    if not applied:
        raise LeaseLost("renewal conflicted")
    lease["lease_expires_at"] = new_expiry
