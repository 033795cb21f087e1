"""A task's function run for one claimed row, and what the worker records of its end.

The worker supervises the run as it does any other (lease renewal, deadline, cancel);
this module only turns the row into a call and the call's end into a
:class:`~ledgerq.queue.worker.finished.Finished`: the return value as JSON, or the
exception's type, message and traceback, and whether a retry could help.

Async functions run on the worker's loop. Sync functions run on a thread pool, so a
task that blocks (file I/O, a C library, ``time.sleep``) never holds the loop that
renews every lease; the pool is sized by the worker's capacity.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine, Generator
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from ledgerq.codec import dumps
from ledgerq.errors import InvalidInput
from ledgerq.queue.worker.finished import Finished
from ledgerq.queue.worker.launcher import current_capture, stops_by
from ledgerq.queue.worker.outcomes import DETAIL_LIMIT
from ledgerq.tasks import tracing
from ledgerq.tasks.control import Fail, Retry
from ledgerq.tasks.hooks import Hooks

if TYPE_CHECKING:
    from ledgerq.tasks.task import Task

#: The most a task's result may take as JSON (UTF-8 bytes): it rides on the row and on
#: its terminal fact, read by ``show`` and every fold of the log.
MAX_RESULT_BYTES = 1024 * 1024
#: How much of a failure's traceback is kept (its end: the frame that raised).
TRACEBACK_LIMIT = 16 * 1024
#: An async task's step that holds the loop longer than this is logged (see Watched).
BLOCKING_STEP_SECONDS = 0.25

log = logging.getLogger("ledgerq.worker")

ExecuteFn = Callable[[dict[str, Any]], Awaitable[Finished]]


def error_of(exc: BaseException) -> dict[str, Any]:
    """An exception as the run's ``error`` column stores it, each part bounded."""
    text = "".join(traceback.format_exception(exc))
    return {"type": _type_name(exc), "message": str(exc)[:DETAIL_LIMIT],
            "traceback": text[-TRACEBACK_LIMIT:]}


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" \
        else f"{cls.__module__}.{cls.__qualname__}"


def _failed(exc: BaseException, *, retryable: bool, note: str = "",
            delay: float | None = None) -> Finished:
    detail = f"{type(exc).__name__}: {exc}{note}"
    error = error_of(exc)
    if note:
        error["message"] = f"{error['message']}{note}"
    return Finished(1, detail[:DETAIL_LIMIT], error=error, retryable=retryable,
                    retry_delay=delay, exception=exc)


def executor_for(task: Task[Any], pool: Executor | None = None,
                 hooks: Hooks | None = None) -> ExecuteFn:
    """The worker's executor for ``task``'s runs; sync functions run in ``pool``;
    ``hooks`` are called as each run starts and ends."""

    async def execute(run: dict[str, Any]) -> Finished:
        if not tracing.enabled():
            return await _hooked(task, run, pool, hooks)
        with tracing.running(task.name, run) as span:
            finished = await _hooked(task, run, pool, hooks)
            if finished.exit_code != 0:
                tracing.failed(span, finished.exception, finished.detail)
            return finished

    return execute


async def _hooked(task: Task[Any], run: dict[str, Any], pool: Executor | None,
                  hooks: Hooks | None) -> Finished:
    """The run with the app's hooks around it (when it has any)."""
    if not hooks:
        return await _execute(task, run, pool)
    await hooks.call("started", run)
    try:
        finished = await _execute(task, run, pool)
    except BaseException as exc:  # cancelled (timeout, shutdown, lease lost)
        await hooks.call("failed", run, exc)
        raise
    if finished.exit_code == 0:
        await hooks.call("succeeded", run, task.returns.decode(finished.result))
    else:
        await hooks.call("failed", run, finished.exception or RuntimeError(finished.detail))
    return finished


async def _execute(task: Task[Any], run: dict[str, Any], pool: Executor | None) -> Finished:
    try:
        kwargs = task.arguments.decode(run.get("action_args") or {})
    except InvalidInput as exc:
        # The function changed since the defer: no attempt can decode them.
        return _failed(exc, retryable=False)
    if task.isolation == "process":
        return await in_child(task, kwargs)
    try:
        if task.is_async:
            stops_by("cancelled")
            value = await Watched(task.fn(**kwargs), task.name, run.get("id"))
        else:
            value = await _on_thread(task, kwargs, pool)
    except Exception as exc:
        return raised(task, exc)
    return _succeeded(task, value)


class Watched:
    """An async task's coroutine, each step timed: a step that holds the event loop longer
    than :data:`BLOCKING_STEP_SECONDS` (a blocking call in async code) is logged by the
    task's name with how long it held it, since every other run of the worker waited
    that long (a ``Worker`` renews its leases from a thread of its own meanwhile)."""

    def __init__(self, coro: Coroutine[Any, Any, Any], name: str, run_id: object) -> None:
        self.coro, self.name, self.run_id = coro, name, run_id

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, value, error = self.coro, None, None
        while True:
            started = time.perf_counter()
            try:
                step = coro.throw(error) if error is not None else coro.send(value)
            except StopIteration as stop:
                self._timed(started)
                return stop.value
            except BaseException:
                self._timed(started)
                raise
            self._timed(started)
            try:
                value, error = (yield step), None
            except BaseException as exc:  # a cancel, thrown into the task where it waits
                value, error = None, exc

    def _timed(self, started: float) -> None:
        held = time.perf_counter() - started
        if held > BLOCKING_STEP_SECONDS:
            log.warning("task %s (run %s) blocked the event loop for %.2fs without "
                        "awaiting: every other run of this worker waited; await "
                        "non-blocking calls, or declare the task sync (it then runs on a "
                        "thread)", self.name, self.run_id, held)


async def _on_thread(task: Task[Any], kwargs: dict[str, Any], pool: Executor | None) -> Any:
    """The sync function on a pool thread. A thread cannot be stopped: a timeout or a
    cancel stops the wait, says so in the run's record, and leaves the thread to its
    supervisor, which holds the worker's capacity slot until it returns."""
    stops_by("the thread could not be stopped; it runs on, holding its capacity slot "
             "until it returns (isolation='process' can be killed)")
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, task.fn, **kwargs)
    future = loop.run_in_executor(pool, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        capture = current_capture()
        if capture is not None and not future.done():
            capture.lingering = future
        raise


def raised(task: Task[Any], exc: Exception) -> Finished:
    """The end of a run whose function raised ``exc``: retried as it and the task say."""
    if isinstance(exc, Retry):
        if task.retry is None:
            return _failed(exc, retryable=False,
                           note=" (the task has no retry policy: give it retry=)")
        return _failed(exc, retryable=True, delay=exc.delay)
    if isinstance(exc, Fail):
        return _failed(exc, retryable=False)
    return _failed(exc, retryable=task.retries(exc))


def run_here(task: Task[Any], kwargs: dict[str, Any]) -> Finished:
    """The function called in this thread, to its end (a child process's whole work)."""
    try:
        value = task.fn(**kwargs)
    except Exception as exc:
        return raised(task, exc)
    return _succeeded(task, value)


async def in_child(task: Task[Any], kwargs: dict[str, Any]) -> Finished:
    """The function run in a child process of its own, which a timeout or a cancel kills
    (SIGKILL): a thread cannot be stopped, a process can.

    The child imports the task by its module and attribute (it is declared at module
    level: checked when it is declared) and sends back the run's end, already a plain
    tuple; a child that dies without one (killed, crashed, out of memory) is a failure
    its retry policy may try again.
    """
    from ledgerq.tasks import isolation

    return await isolation.run_in_child(task, kwargs)


def _succeeded(task: Task[Any], value: Any) -> Finished:
    try:
        encoded = task.returns.encode(value)
    except InvalidInput as exc:
        return _failed(exc, retryable=False)
    if encoded is not None:
        size = len(dumps(encoded).encode())
        if size > task.max_result_bytes:
            big = InvalidInput(f"task {task.name} returned {size:,} bytes as JSON; the "
                               f"limit is {task.max_result_bytes:,} (max_result_bytes=)")
            return _failed(big, retryable=False)
    return Finished(0, result=encoded)


__all__ = ["MAX_RESULT_BYTES", "error_of", "executor_for"]
