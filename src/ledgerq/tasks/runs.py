"""The handle a defer returns: the run's id, its status, and its result once it ends.

``await run.result()`` waits for the run's terminal fact and gives back the return
value decoded to the task's annotation, or raises :class:`~ledgerq.errors.TaskFailed`.
It wakes the moment a worker in this process writes an end (an in-process wake-up);
a run ended by another process is seen at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ledgerq.errors import TaskFailed
from ledgerq.queue.reads import RUN_ENTITY, get_run
from ledgerq.queue.worker import wakeup

if TYPE_CHECKING:
    from ledgerq.lifecycle.transactions import Pending
    from ledgerq.store.db import StateDB
    from ledgerq.tasks.task import Task

R = TypeVar("R")

#: How often a wait for a run's end reads its status when no wake-up comes (a run
#: ended by another process).
POLL_SECONDS = 0.05
#: The outcome (of the run spec's terminal states) whose result is the return value.
SUCCEEDED = "succeeded"


async def wait_ended(db: StateDB, run_id: str, timeout: float | None) -> dict[str, Any]:
    """The run's row once it is in a terminal state; TimeoutError after ``timeout`` s."""
    policy = db.registry.entity(RUN_ENTITY)
    deadline = None if timeout is None else time.monotonic() + timeout
    woken = asyncio.Event()
    wakeup.subscribe(db.path, woken, wakeup.ENDED)
    try:
        while True:
            woken.clear()
            status = (await db.read(lambda tx: tx.read_statuses(policy, [run_id]))).get(run_id)
            if status is None:
                raise LookupError(f"no run {run_id}")
            if status in policy.terminal:
                return await get_run(db, run_id)
            wait = POLL_SECONDS
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"run {run_id} is still {status} after {timeout:g}s")
                wait = min(wait, left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), wait)
    finally:
        wakeup.unsubscribe(db.path, woken, wakeup.ENDED)


def outcome_of(task: Task[Any], db: StateDB, row: dict[str, Any]) -> Any:
    """The return value of an ended run's row, or TaskFailed."""
    policy = db.registry.entity(RUN_ENTITY)
    status = row["status"]
    if policy.outcome(status) == SUCCEEDED:
        return task.returns.decode(row.get("result"))
    error = row.get("error") or {}
    raise TaskFailed(row["id"], status, error_type=error.get("type"),
                     message=error.get("message") or row.get("error_detail"),
                     traceback=error.get("traceback"))


class AsyncTaskRun(Generic[R]):
    """A deferred run, for async code."""

    def __init__(self, task: Task[R], run_id: str | Pending[str], db: StateDB) -> None:
        self.task, self._id, self._db = task, run_id, db

    @property
    def id(self) -> str:
        """The run's id (a run deferred in a transaction has one once it commits)."""
        return self._id if isinstance(self._id, str) else self._id.value

    def __repr__(self) -> str:
        shown = self._id if isinstance(self._id, str) else (
            self._id.value if self._id.done else "(not committed)")
        return f"<AsyncTaskRun {self.task.name} {shown}>"

    async def status(self) -> str:
        """The run's state now (``queued``, ``running``, ``completed``, ...)."""
        return str((await get_run(self._db, self.id))["status"])

    async def result(self, timeout: float | None = None) -> R:
        """The task's return value once the run completes; TaskFailed if it ended
        otherwise; TimeoutError if it has not ended within ``timeout`` seconds."""
        row = await wait_ended(self._db, self.id, timeout)
        value: R = outcome_of(self.task, self._db, row)
        return value


class TaskRun(Generic[R]):
    """A deferred run, for synchronous code (through the app's background loop)."""

    def __init__(self, task: Task[R], run_id: str) -> None:
        self.task, self.id = task, run_id

    def __repr__(self) -> str:
        return f"<TaskRun {self.task.name} {self.id}>"

    def status(self) -> str:
        app = self.task.app

        async def go() -> str:
            return str((await get_run(await app.sync_db(), self.id))["status"])

        return app.bridge.run(go(), what="TaskRun.status()")

    def result(self, timeout: float | None = None) -> R:
        """:meth:`AsyncTaskRun.result`, blocking this thread; refused inside a running
        event loop (use ``await`` there)."""
        app = self.task.app

        async def go() -> R:
            db = await app.sync_db()
            value: R = outcome_of(self.task, db, await wait_ended(db, self.id, timeout))
            return value

        return app.bridge.run(go(), what="TaskRun.result()")


__all__ = ["AsyncTaskRun", "TaskRun", "wait_ended"]
