"""A claimed run while it executes: its lease kept alive, its deadline kept, a cancel noticed.

A run is first taken as far as it goes without waiting (:func:`begin_claimed`): its
executor's first step is taken at once (:func:`_start`). A run that ended there, or was
refused before it ran, is :class:`Ended`, and a pass writes the outcomes of all such
runs together (:func:`begin_runs`, :func:`write_ended`). Any other run's executor goes
on as a task beside a loop that wakes every check interval: the lease is checked (a
reap, a cancel or a reclaim stops the child and writes nothing), renewed once a third
of its TTL has passed, and the deadline and a shutdown are honoured.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import contextvars
import inspect
import logging
import time
from collections.abc import Awaitable, Coroutine, Generator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.values import value_problem
from ledgerq.queue import moves
from ledgerq.queue.runs import (
    MalformedRow,
    decode_run,
    lease_of,
    perform,
    run_policy,
    worker_actor,
)
from ledgerq.queue.worker.config import RunContext
from ledgerq.queue.worker.finished import Finished
from ledgerq.queue.worker.keeper import EXPIRY, RENEW_FRACTION
from ledgerq.queue.worker.launcher import ExecuteFn, OutputCapture, capturing
from ledgerq.queue.worker.leases import until_next_check
from ledgerq.queue.worker.locks import KeyLock
from ledgerq.queue.worker.outcomes import (
    Ended,
    Outcome,
    lost_outcome,
    record_outcome,
    record_outcomes,
)
from ledgerq.queue.worker.starvation import is_starved

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.worker.store import WorkerTx

log = logging.getLogger("ledgerq.worker")

#: exit_code recorded for a run killed at its deadline (the coreutils ``timeout`` convention).
TIMEOUT_EXIT_CODE = 124

#: What an executor's run gives back (see launcher.ExecuteFn).
Got: TypeAlias = tuple[int, str] | Finished

#: A run given back to the queue because its worker is stopping (not a failed attempt).
SHUTDOWN = Outcome(moves.SHUTDOWN)


class LeaseLost(Exception):
    """The run's lease is no longer ours (reaped, cancelled, reclaimed)."""

    def __init__(self, message: str, outcome: str = "lost") -> None:
        super().__init__(message)
        #: How the run counts: ``cancelled`` or ``lost`` (see outcomes.lost_outcome).
        self.outcome = outcome


async def execute_claimed(db: Database[WorkerTx], run: dict[str, Any], ctx: RunContext) -> str:
    """Run one claimed row to an end and write its outcome, guarded on our lease.

    Returns the state written (``completed``, ``failed``, ``retry_wait``,
    ``timed_out``, ``queued`` on shutdown), ``cancelled`` when an operator cancelled it
    meanwhile, or ``lost`` when the lease went away otherwise; in those two cases the
    child is stopped and nothing is written.
    """
    return await _carry_on(db, begin_claimed(db, run, ctx), ctx)


@dataclass
class Begun:
    """A pass's claimed runs, each taken as far as it goes without waiting."""

    #: Runs whose outcome is known: their writes go together (:func:`record_outcomes`).
    ended: list[Ended] = field(default_factory=list)
    #: Runs still going: each coroutine supervises its run to an end and writes its
    #: outcome (run each as a task); it returns what :func:`execute_claimed` returns.
    going: list[tuple[dict[str, Any], Coroutine[Any, Any, str]]] = field(default_factory=list)
    #: Runs whose supervisor failed before they got that far, and why.
    failed: list[tuple[dict[str, Any], Exception]] = field(default_factory=list)

    def settled(self, written: list[str | Exception]
                ) -> list[tuple[dict[str, Any], str | Exception]]:
        """Each run that did not go on, with how it ended: the ended runs with ``written``
        (:func:`write_ended`'s answer), then the failed ones."""
        return [*zip([e.run for e in self.ended], written, strict=True), *self.failed]


def begin_runs(db: Database[WorkerTx], runs: list[dict[str, Any]], ctx: RunContext) -> Begun:
    """:func:`begin_claimed` for each of a pass's runs, in order.

    A pass of in-process handlers that need no wait then costs no task and no write per
    run: their outcomes are written together, each still its own guarded move.
    """
    begun = Begun()
    policy = run_policy(db)
    for run in runs:
        try:
            got = _begin(db, policy, run, ctx)
        except Exception as exc:  # the others still run to their end
            failed = _supervisor_failed(policy, run, ctx, exc)
            if failed is None:
                begun.failed.append((run, exc))
            else:
                begun.ended.append(failed)
            continue
        if isinstance(got, Ended):
            begun.ended.append(got)
        else:
            begun.going.append((run, got))
    return begun


def _claimed_lease(policy: EntityPolicy, run: dict[str, Any], ctx: RunContext
                   ) -> dict[str, Any]:
    """The lease the claim gave this worker: the row's, owned by us whatever it says."""
    lease = lease_of(policy, run)
    lease["leased_by"] = ctx.worker_id
    return lease


def _supervisor_failed(policy: EntityPolicy, run: dict[str, Any], ctx: RunContext,
                       exc: Exception) -> Ended | None:
    """A run its supervisor could not begin, failed once with why (never left running
    for the reaper to run again); None when not even its lease can be read."""
    try:
        lease = _claimed_lease(policy, run, ctx)
    except Exception:
        return None
    return Ended(run, lease, Outcome(moves.RAISED, None, f"the worker could not start this "
                                     f"run: {type(exc).__name__}: {exc}"))


async def write_ended(db: Database[WorkerTx], ended: list[Ended], ctx: RunContext
                      ) -> list[str | Exception]:
    """The outcomes of a pass's ended runs, written together (:func:`record_outcomes`);
    per run, what :func:`execute_claimed` would return, or the exception its write raised
    (a failure of the database is every run's)."""
    if not ended:
        return []
    try:
        return await record_outcomes(db, run_policy(db), ended, ctx)
    except Exception as exc:
        return [exc] * len(ended)


def begin_claimed(db: Database[WorkerTx], run: dict[str, Any], ctx: RunContext
                  ) -> Ended | Coroutine[Any, Any, str]:
    """A claimed run taken as far as it goes without waiting: :class:`Ended` when its
    outcome is known (it was refused before it ran, or its executor's first step
    finished it), to be written with others' (:func:`record_outcomes`); else the
    coroutine that supervises it to its end and writes its outcome."""
    return _begin(db, run_policy(db), run, ctx)


def _begin(db: Database[WorkerTx], policy: EntityPolicy, run: dict[str, Any], ctx: RunContext
           ) -> Ended | Coroutine[Any, Any, str]:
    lease = _claimed_lease(policy, run, ctx)
    if ctx.keeper is not None:  # before the executor's first step, which may block
        ctx.keeper.hold(run["id"], lease)
    try:
        decoded = decode_run(policy, run)
    except MalformedRow as exc:
        return Ended(run, lease, Outcome(moves.RAISED, 1, str(exc)))
    if ctx.authorize is None:
        return _begin_authorized(db, policy, run, decoded, lease, ctx)
    try:
        verdict = ctx.authorize(decoded)
    except Exception as exc:  # fail closed: a broken hook denies, it does not strand the row
        verdict = _hook_raised(exc)
    if inspect.isawaitable(verdict):
        return _authorize_then_run(db, policy, run, decoded, lease, verdict, ctx)
    refused = _refusal(verdict)
    if refused is not None:
        return Ended(run, lease, refused)
    return _begin_authorized(db, policy, run, decoded, lease, ctx)


def _hook_raised(exc: Exception) -> str:
    return f"authorize hook raised {type(exc).__name__}: {exc}"


def _refusal(verdict: object) -> Outcome | None:
    """The outcome of an authorize hook's ``verdict``; None when it allows the run."""
    if verdict is True:
        return None
    why = verdict if isinstance(verdict, str) and verdict else "denied by authorize hook"
    return Outcome(moves.UNAUTHORIZED, None, f"unauthorized: {why}")


async def _authorize_then_run(db: Database[WorkerTx], policy: EntityPolicy, run: dict[str, Any],
                              decoded: dict[str, Any], lease: dict[str, Any],
                              verdict: Awaitable[bool | str], ctx: RunContext) -> str:
    try:
        allowed = await verdict
    except Exception as exc:  # fail closed, as in begin_claimed
        allowed = _hook_raised(exc)
    refused = _refusal(allowed)
    if refused is not None:
        return await record_outcome(db, policy, run, lease, ctx, refused)
    return await _carry_on(db, _begin_authorized(db, policy, run, decoded, lease, ctx), ctx)


async def _carry_on(db: Database[WorkerTx], begun: Ended | Coroutine[Any, Any, str],
                    ctx: RunContext) -> str:
    """What :func:`begin_claimed` began, to its end: an ended run's outcome written alone."""
    if isinstance(begun, Ended):
        return await record_outcome(db, run_policy(db), begun.run, begun.lease, ctx,
                                    begun.outcome)
    return await begun


def _begin_authorized(db: Database[WorkerTx], policy: EntityPolicy, run: dict[str, Any],
                      decoded: dict[str, Any], lease: dict[str, Any], ctx: RunContext
                      ) -> Ended | Coroutine[Any, Any, str]:
    executor = ctx.executors.for_kind(run["action_kind"])
    if executor is None:
        return Ended(run, lease, Outcome(
            moves.RAISED, 1, f"no executor for action kind {run['action_kind']!r}"))
    key = run.get("concurrency_key")
    if key and ctx.lock_dir is not None:
        return _run_locked(db, policy, run, decoded, lease, executor,
                           KeyLock(ctx.lock_dir, key), ctx)
    return _begin_executor(db, policy, run, decoded, lease, executor, ctx)


async def _run_locked(db: Database[WorkerTx], policy: EntityPolicy, run: dict[str, Any],
                      decoded: dict[str, Any], lease: dict[str, Any], executor: ExecuteFn,
                      lock: KeyLock, ctx: RunContext) -> str:
    """The run once it holds its concurrency key's lock (its lease kept meanwhile)."""
    try:
        next_check = 0.0
        while not lock.try_acquire():
            if ctx.stopping is not None and ctx.stopping.is_set():
                return await record_outcome(db, policy, run, lease, ctx, SHUTDOWN)
            if time.monotonic() >= next_check:
                await _supervise_once(db, policy, run, lease, ctx)
                next_check = time.monotonic() + ctx.check_interval
            await asyncio.sleep(0.05)
        return await _carry_on(
            db, _begin_executor(db, policy, run, decoded, lease, executor, ctx), ctx)
    except LeaseLost as exc:
        return _lease_lost(run, exc)
    finally:
        lock.release()


def _lease_lost(run: dict[str, Any], exc: LeaseLost) -> str:
    log.info("run %s: lease lost (%s); child stopped, nothing written", run["id"], exc)
    return exc.outcome


def _begin_executor(db: Database[WorkerTx], policy: EntityPolicy, run: dict[str, Any],
                    decoded: dict[str, Any], lease: dict[str, Any], executor: ExecuteFn,
                    ctx: RunContext) -> Ended | Coroutine[Any, Any, str]:
    """The executor's first step, taken at once (see :func:`_start`)."""
    started = ctx.clock()
    if log.isEnabledFor(logging.INFO):
        log.info("run %s start task=%s queue=%s attempt=%d", run["id"], run["action_kind"],
                 run.get("queue", "default"), int(run.get("run_attempts") or 0) + 1)
    # The executor's context is a copy, capture included: what it launches fills the
    # capture, and what it sets stays its own.
    capture = OutputCapture(ctx.output_tail)
    task = _start(executor, decoded, capturing(capture))
    if task.done():
        return Ended(run, lease, _result(task, capture))
    return _supervised(db, policy, run, lease, task, capture, started, ctx)


def _result(task: asyncio.Future[Got], capture: OutputCapture) -> Outcome:
    """The outcome of a run whose executor finished (``task`` is done)."""
    output = capture.columns()
    if task.cancelled():  # by itself: the supervisor's own cancels never get here
        return Outcome(moves.RAISED, 1, "CancelledError: the executor was cancelled",
                       retryable=True, output=output)
    try:
        got = task.result()
    except Exception as exc:
        if is_starved(exc):
            return Outcome(moves.STARVED, None, f"the worker ran out of a resource: "
                           f"{type(exc).__name__}: {exc}", output=output, starved=True)
        return Outcome(moves.RAISED, 1, f"{type(exc).__name__}: {exc}", retryable=True,
                       output=output)
    if isinstance(got, Finished):
        return _finished(got, output)
    if not _storable_result(got):
        # Written as given, it would be refused, and the run left running until its
        # lease expired (and then run again): the executor failed instead.
        return Outcome(moves.RAISED, 1, f"executor returned {got!r:.200}, not (an integer "
                       "exit code, a text detail or None)", retryable=True, output=output)
    code, detail = got
    if code == 0:
        return Outcome(moves.EXITED_ZERO, 0, output=output)
    return Outcome(moves.EXITED_NONZERO, code, detail or f"exit code {code}", retryable=True,
                   output=output)


def _finished(got: Finished, output: Mapping[str, str | None]) -> Outcome:
    """The outcome of an executor that said how its run ended (a Python task)."""
    if not _storable_result((got.exit_code, got.detail)):
        return Outcome(moves.RAISED, 1, f"executor returned {got!r:.200}, whose exit code "
                       "or detail cannot be stored", retryable=True, output=output)
    if got.exit_code == 0:
        return Outcome(moves.EXITED_ZERO, 0, output=output, result=got.result)
    move = moves.RAISED if got.error is not None else moves.EXITED_NONZERO
    return Outcome(move, got.exit_code, got.detail or f"exit code {got.exit_code}",
                   retryable=got.retryable, output=output, error=got.error,
                   retry_delay=got.retry_delay)


def _storable_result(got: object) -> bool:
    """Whether an executor's result is the ``(exit_code, detail)`` pair with an exit
    code a run's integer column stores on every backend (the engine's own check) and a
    detail that is text (made storable where it is written) or None."""
    if not isinstance(got, _PAIR) or len(got) != 2:
        return False
    code, detail = got
    return type(code) is int and (code == 0 or value_problem(code, json=False) is None) \
        and (detail is None or isinstance(detail, str))


#: What an executor's result may be (a tuple: ``tuple | list`` is rebuilt per call).
_PAIR = (tuple, list)


async def _supervised(db: Database[WorkerTx], policy: EntityPolicy, run: dict[str, Any],
                      lease: dict[str, Any], task: asyncio.Future[Got],
                      capture: OutputCapture, started: float, ctx: RunContext) -> str:
    """A run whose executor goes on as ``task``, to its end: its lease checked and renewed,
    its deadline and a shutdown honoured, then its outcome written."""
    timeout = run.get("timeout_seconds")
    deadline = started + timeout if timeout else None
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
                written = await record_outcome(db, policy, run, lease, ctx, Outcome(
                    moves.TIMED_OUT, TIMEOUT_EXIT_CODE,
                    f"timed out after {timeout:g}s; {capture.stopping}",
                    output=capture.columns()))
                if capture.lingering is not None:
                    # Recorded as it is; the slot stays taken until the work returns.
                    with contextlib.suppress(BaseException):
                        await capture.lingering
                return written
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
    except LeaseLost as exc:
        await _stop(task)
        return _lease_lost(run, exc)
    except BaseException:
        await _stop(task)
        raise
    return await record_outcome(db, policy, run, lease, ctx, _result(task, capture))


async def _call(executor: ExecuteFn, decoded: dict[str, Any]) -> Got:
    """Call inside the coroutine, so an executor raising before it awaits is a failed run
    too."""
    return await executor(decoded)


def _start(executor: ExecuteFn, decoded: dict[str, Any], context: contextvars.Context
           ) -> asyncio.Future[Got]:
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
        done: asyncio.Future[Got] = loop.create_future()
        done.set_result(stop.value)
        return done
    except Exception as exc:  # raised before its first wait: a failed run, as in a task
        failed: asyncio.Future[Got] = loop.create_future()
        failed.set_exception(exc)
        return failed
    except asyncio.CancelledError:  # it cancelled itself: a cancelled run, as in a task
        cancelled: asyncio.Future[Got] = loop.create_future()
        cancelled.cancel()
        return cancelled
    return loop.create_task(_Started(coro, pending), context=context)


class _Started(collections.abc.Coroutine[Any, Any, Got]):
    """An executor's coroutine whose first step ran already (it waits on ``pending``), as
    the coroutine a task runs: the task's first step is handed ``pending`` to wait on, and
    every later value, and every exception thrown (a cancel, even one before the task's
    first step), goes to the executor's coroutine where it waits."""

    def __init__(self, coro: Coroutine[Any, Any, Got], pending: Any) -> None:
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

    def __await__(self) -> Generator[Any, Any, Got]:
        raise TypeError("an executor's run goes on as a task (supervision._start)")


async def _stop(task: asyncio.Future[Any]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def _supervise_once(db: Database[WorkerTx], policy: EntityPolicy, run: dict[str, Any],
                          lease: dict[str, Any], ctx: RunContext) -> None:
    """Raise LeaseLost if the row is no longer ours; renew the lease when it is due (here,
    unless the worker's lease keeper renews it, from its own thread)."""
    row = await ctx.lease_reads.lease_row(db, run["id"])
    keeper = ctx.keeper
    # The expiry the keeper moves may be ahead of this read, or this read of it.
    ours = lease.items() if keeper is None else \
        [(c, v) for c, v in lease.items() if c != EXPIRY]
    if (row is None or row["status"] != moves.RENEWED.source
            or any(row[c] != held for c, held in ours)):
        raise LeaseLost("row changed under us: " + (row["status"] if row else "deleted"),
                        lost_outcome(row, lease))
    if keeper is not None:
        lost = keeper.lost(run["id"])
        if lost is not None:
            raise LeaseLost(lost)
        return
    now = ctx.clock()
    if now < lease[EXPIRY] - ctx.lease_ttl * (1 - RENEW_FRACTION):
        return
    new_expiry = now + ctx.lease_ttl
    applied = await db.write(lambda tx: perform(
        tx, policy, run["id"], moves.RENEWED, actor=worker_actor(ctx.worker_id),
        guard=dict(lease), patch={EXPIRY: new_expiry}, now=now).applied)
    if not applied:
        raise LeaseLost("renewal conflicted")
    lease[EXPIRY] = new_expiry
