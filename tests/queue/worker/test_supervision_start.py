"""The executor's first step, taken at once (supervision._start).

An executor that needs no wait finishes in that step and costs no task; one that waits
goes on in a task from where its first step left off, in the same copied context, and a
cancel of that task reaches it as it would reach any awaited coroutine.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest

from ledgerq.queue.worker import launcher, supervision
from ledgerq.queue.worker.launcher import OutputCapture, capturing

_var: contextvars.ContextVar[str] = contextvars.ContextVar("test_var", default="caller's")


def start(executor: Any, run: dict[str, Any] | None = None) -> asyncio.Future[Any]:
    return supervision._start(executor, run or {}, contextvars.copy_context())


async def test_an_executor_that_needs_no_wait_is_done_without_a_task() -> None:
    async def at_once(run: dict[str, Any]) -> tuple[int, str]:
        return 0, f"ran {run['id']}"

    fut = start(at_once, {"id": "r1"})
    assert fut.done() and not isinstance(fut, asyncio.Task)
    assert fut.result() == (0, "ran r1")


async def test_an_executor_that_raises_before_waiting_is_a_failed_future() -> None:
    async def broken(run: dict[str, Any]) -> tuple[int, str]:
        raise KeyError("no such thing")

    fut = start(broken)
    assert fut.done()
    with pytest.raises(KeyError, match="no such thing"):
        fut.result()


async def test_an_executor_that_waits_goes_on_in_a_task_from_where_it_stopped() -> None:
    steps: list[str] = []
    loop = asyncio.get_running_loop()
    later: asyncio.Future[str] = loop.create_future()

    async def waits(run: dict[str, Any]) -> tuple[int, str]:
        steps.append("first")
        await asyncio.sleep(0)  # a bare yield
        steps.append("second")
        got = await later  # a future, done by someone else
        steps.append(got)
        await asyncio.sleep(0.01)  # a timer
        return 3, "".join(steps)

    fut = start(waits)
    assert isinstance(fut, asyncio.Task) and steps == ["first"]  # its first step only
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert steps == ["first", "second"] and not fut.done()
    later.set_result("third")
    assert await asyncio.wait_for(fut, 5) == (3, "firstsecondthird")


@pytest.mark.parametrize("task_ran_first", [True, False])
async def test_a_cancel_of_the_task_reaches_the_executor(task_ran_first: bool) -> None:
    """Whether the task took its own first step or not (a worker stopping at once), the
    executor already started: a cancel stops it where it waits, not when the garbage
    collector closes it."""
    cleaned: list[str] = []

    async def forever(run: dict[str, Any]) -> tuple[int, str]:
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append("killed its child")
        return 0, ""

    fut = start(forever)
    if task_ran_first:
        await asyncio.sleep(0)
    fut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fut
    assert cleaned == ["killed its child"]


async def test_the_executor_sees_the_capture_and_keeps_what_it_sets() -> None:
    seen: list[Any] = []

    async def sets(run: dict[str, Any]) -> tuple[int, str]:
        seen.append(launcher._capture.get())  # where run_argv leaves the output
        _var.set("executor's")
        await asyncio.sleep(0)
        seen.append(_var.get())
        return 0, ""

    capture = OutputCapture(100)
    fut = supervision._start(sets, {}, capturing(capture))
    assert seen == [capture]  # its first step saw the capture
    assert _var.get() == "caller's"  # what that step set stayed the executor's
    assert await fut == (0, "")
    assert seen[1] == "executor's"  # and its task went on in the same context
