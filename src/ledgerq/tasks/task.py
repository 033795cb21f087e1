"""A Python function declared as a task: what ``@app.task`` returns.

Calling the task calls the function, here and now. ``defer_async`` / ``defer`` queue a
run of it instead: the arguments are checked against the signature first (nothing is
written when one is wrong), and the run is a ``schedule_runs`` row whose action kind is
the task's name. ``configure`` gives one defer its own delay, priority, queue or
idempotency key.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from ledgerq.durations import check_instant, check_span
from ledgerq.errors import InvalidInput
from ledgerq.queue.submission.application import (
    RetryPolicy,
    TaskApplication,
    check_priority,
    check_queue,
    task_name_problem,
)
from ledgerq.tasks import tracing
from ledgerq.tasks.arguments import TaskArguments, TaskResult
from ledgerq.tasks.execution import MAX_RESULT_BYTES

if TYPE_CHECKING:
    from ledgerq.lifecycle.transactions import Pending, Transaction
    from ledgerq.store.db import StateDB
    from ledgerq.tasks.app import App
    from ledgerq.tasks.runs import AsyncTaskRun, TaskRun

R = TypeVar("R")

#: How a task's sync function runs: on the worker's thread pool, or in a child process
#: that a timeout or a cancel can kill.
Isolation = Literal["thread", "process"]


@dataclass(frozen=True)
class DeferOptions:
    """What one defer may set beyond the arguments (``configure``); None: the task's."""

    delay: float | None = None
    at: float | None = None
    priority: int | None = None
    queue: str | None = None
    idempotency_key: str | None = None
    depends_on: Sequence[str] = ()


def module_name(fn: Callable[..., Any]) -> str:
    """The module ``fn`` is imported from by a worker: for a script run as ``python
    tasks.py`` (``__main__``), the name its file is imported by (``tasks``), so the
    script that defers and the worker that loads ``--app tasks:app`` agree on the names."""
    module = getattr(fn, "__module__", None) or "__main__"
    if module != "__main__":
        return module
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return str(spec.name)
    path = getattr(main, "__file__", None)
    return Path(path).stem if path else module


def _exceptions(value: object, what: str) -> tuple[type[BaseException], ...]:
    items = value if isinstance(value, tuple | list) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidInput(f"{what} must be exception classes, got {item!r}")
    return tuple(items)


class Task(Generic[R]):
    """A function the queue can run: its name, its defaults, its arguments' codec."""

    def __init__(self, app: App, fn: Callable[..., Any], *, name: str | None = None,
                 queue: str | None = None, priority: int = 0,
                 retry: RetryPolicy | int | None = None, timeout: float | None = None,
                 retry_on: type[BaseException] | Sequence[type[BaseException]] = (Exception,),
                 no_retry_on: type[BaseException] | Sequence[type[BaseException]] = (),
                 capabilities: Sequence[str] = (), target: str | None = None,
                 isolation: Isolation = "thread",
                 max_result_bytes: int = MAX_RESULT_BYTES) -> None:
        if not callable(fn):
            raise InvalidInput(f"@app.task decorates a function, got {fn!r}")
        self.app = app
        self.fn = fn
        module = module_name(fn)
        # A function defined inside another (a test, a factory) is named without the
        # "<locals>" its qualname carries.
        self.name = name if name is not None else \
            f"{module}.{fn.__qualname__.replace('<locals>.', '')}"
        problem = task_name_problem(self.name)
        if problem is not None:
            raise InvalidInput(f"task name {problem}")
        self.is_async = inspect.iscoroutinefunction(fn)
        if isolation not in ("thread", "process"):
            raise InvalidInput(f"task {self.name}: isolation must be 'thread' or 'process', "
                               f"got {isolation!r}")
        if isolation == "process" and self.is_async:
            raise InvalidInput(f"task {self.name}: isolation='process' runs a sync function "
                               "in a child process; this one is async")
        self.isolation: Isolation = isolation
        #: (module, attribute) a child process imports it by.
        self.location = (module, fn.__qualname__)
        if isolation == "process" and "<locals>" in fn.__qualname__:
            raise InvalidInput(f"task {self.name}: isolation='process' needs a function "
                               "declared at module level, which a child process can import")
        self.queue = check_queue(queue if queue is not None else app.default_queue,
                                 f"task {self.name}: queue")
        self.priority = check_priority(priority, f"task {self.name}: priority")
        if isinstance(retry, int) and not isinstance(retry, bool):
            retry = RetryPolicy(retry, 1.0)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise InvalidInput(f"task {self.name}: retry must be a RetryPolicy, a number of "
                               f"attempts or None, got {retry!r}")
        self.retry: RetryPolicy | None = retry
        self.timeout = None if timeout is None else check_span(
            timeout, f"task {self.name}: timeout", positive=True)
        self.retry_on = _exceptions(retry_on, f"task {self.name}: retry_on")
        self.no_retry_on = _exceptions(no_retry_on, f"task {self.name}: no_retry_on")
        if isinstance(capabilities, str):
            raise InvalidInput(f"task {self.name}: capabilities must be a list of tokens, "
                               f"not the string {capabilities!r}")
        self.capabilities = list(capabilities)
        self.target = target if target is not None else app.default_target
        if self.target not in app.targets:
            raise InvalidInput(f"task {self.name}: unknown target {self.target!r}; expected "
                               f"one of {', '.join(sorted(app.targets))}")
        if isinstance(max_result_bytes, bool) or not isinstance(max_result_bytes, int) \
                or max_result_bytes < 1:
            raise InvalidInput(f"task {self.name}: max_result_bytes must be an int >= 1")
        self.max_result_bytes = max_result_bytes
        if "tx" in inspect.signature(fn).parameters:
            raise InvalidInput(f"task {self.name}: a parameter may not be named 'tx': "
                               "defer_async(..., tx=) names the transaction to defer in")
        self.arguments = TaskArguments(fn, self.name)
        self.returns = TaskResult(fn, self.name)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<Task {self.name}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The function itself, called here and now (no run is queued)."""
        return self.fn(*args, **kwargs)

    def defaults(self) -> dict[str, Any]:
        """What a run of this task takes when the app does not defer it itself (a state's
        ``on_enter``): recorded in the database with the task's name."""
        return {"priority": self.priority, "retry": self.retry.to_dict() if self.retry else None,
                "timeout": self.timeout, "capabilities": self.capabilities,
                "target": self.target}

    def retries(self, exc: BaseException) -> bool:
        """Whether a run that raised ``exc`` may be tried again under its retry policy."""
        return isinstance(exc, self.retry_on) and not isinstance(exc, self.no_retry_on)

    def configure(self, *, delay: float | None = None, at: float | None = None,
                  priority: int | None = None, queue: str | None = None,
                  idempotency_key: str | None = None,
                  depends_on: Sequence[str] = ()) -> Deferrer[R]:
        """This task with one defer's own options: ``delay`` seconds from now or ``at``
        (epoch seconds), a priority, a queue, an idempotency key, runs it waits for."""
        if delay is not None and at is not None:
            raise InvalidInput("configure: give delay or at, not both")
        if delay is not None:
            check_span(delay, "configure: delay")
        if at is not None:
            check_instant(at, "configure: at")
        if isinstance(depends_on, str):
            raise InvalidInput("configure: depends_on must be a list of run ids")
        return Deferrer(self, DeferOptions(delay, at, priority, queue, idempotency_key,
                                           tuple(depends_on)))

    async def defer_async(self, *args: Any, tx: Transaction | None = None,
                          **kwargs: Any) -> AsyncTaskRun[R]:
        """Queue a run of this task with these arguments; its handle (``.id``,
        ``await .result()``). InvalidInput naming the parameter when they do not fit.
        ``tx``: a ``db.transaction()`` the run is written in, with its other writes."""
        return await Deferrer(self, DeferOptions()).defer_async(*args, tx=tx, **kwargs)

    def defer(self, *args: Any, **kwargs: Any) -> TaskRun[R]:
        """:meth:`defer_async` from synchronous code (a view, a script): through the app's
        background loop; refused inside a running event loop."""
        return Deferrer(self, DeferOptions()).defer(*args, **kwargs)


class Deferrer(Generic[R]):
    """A task with one defer's options (see :meth:`Task.configure`)."""

    def __init__(self, task: Task[R], options: DeferOptions) -> None:
        self.task, self.options = task, options

    @property
    def queue(self) -> str:
        return self.task.queue if self.options.queue is None else self.options.queue

    def configure(self, **changes: Any) -> Deferrer[R]:
        merged = {**vars(self.options), **changes}
        return self.task.configure(**merged)

    def application(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                    now: float, trigger: dict[str, str] | None = None) -> TaskApplication:
        """The run's application for this call (arguments checked and encoded)."""
        task, o = self.task, self.options
        not_before = o.at if o.at is not None else (now + o.delay if o.delay else None)
        return TaskApplication(trigger_context=trigger,
            action_kind=task.name, args=task.arguments.encode(args, kwargs),
            execution_target=task.target, required_capabilities=list(task.capabilities),
            idempotency_key=o.idempotency_key, retry=task.retry,
            timeout_seconds=task.timeout, depends_on=o.depends_on, not_before=not_before,
            priority=task.priority if o.priority is None else o.priority,
            queue=task.queue if o.queue is None else o.queue)

    async def defer_async(self, *args: Any, tx: Transaction | None = None,
                          **kwargs: Any) -> AsyncTaskRun[R]:
        from ledgerq.tasks.runs import AsyncTaskRun

        db = self.task.app.db
        run_id = await self.submit(db, args, kwargs, tx)
        return AsyncTaskRun(self.task, run_id, db)

    def defer(self, *args: Any, **kwargs: Any) -> TaskRun[R]:
        from ledgerq.tasks.runs import TaskRun

        app = self.task.app

        async def go() -> str:
            return await self.submit(await app.sync_db(), args, kwargs)

        return TaskRun(self.task, app.bridge.run(go(), what=f"{self.task.name}.defer()"))

    @overload
    async def submit(self, db: StateDB, args: tuple[Any, ...], kwargs: dict[str, Any],
                     tx: None = None) -> str: ...

    @overload
    async def submit(self, db: StateDB, args: tuple[Any, ...], kwargs: dict[str, Any],
                     tx: Transaction | None) -> str | Pending[str]: ...

    async def submit(self, db: StateDB, args: tuple[Any, ...], kwargs: dict[str, Any],
                     tx: Transaction | None = None) -> str | Pending[str]:
        """The run's application, checked, then written (or queued in ``tx``)."""
        from ledgerq.queue.submission.submit import submit_in, submit_task

        app = self.task.app
        with tracing.deferring(self.task.name, self.queue) as trigger:
            application = self.application(args, kwargs, time.time(), trigger)
            app.deferred_to(application.queue)
            if tx is not None:
                return await submit_in(tx, application, vocabulary=app.vocabulary)
            return await submit_task(db, application, vocabulary=app.vocabulary)


__all__ = ["DeferOptions", "Deferrer", "Isolation", "Task"]
