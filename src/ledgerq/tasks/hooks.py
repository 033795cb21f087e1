"""Hooks: an app's own code called as each of its task runs starts and ends.

``@app.on_started``, ``@app.on_succeeded`` and ``@app.on_failed`` register a function
(sync or async) that gets the run's row (``id``, ``action_kind``, ``queue``,
``run_attempts`` ...) and, at the end, the return value or the exception. They run in
the worker, around the task, in the run's context (a span or a log context a hook sets
at the start is current in the task). A hook that raises is logged and ignored: it
never changes how the run ends.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger("ledgerq.worker")

H = TypeVar("H", bound=Callable[..., Any])


@dataclass
class Hooks:
    """The functions each moment of a run calls, in the order they were registered."""

    started: list[Callable[..., Any]] = field(default_factory=list)
    succeeded: list[Callable[..., Any]] = field(default_factory=list)
    failed: list[Callable[..., Any]] = field(default_factory=list)

    async def call(self, moment: str, *args: Any) -> None:
        for hook in getattr(self, moment):
            try:
                got = hook(*args)
                if inspect.isawaitable(got):
                    await got
            except Exception:
                log.exception("%s hook %s raised; the run goes on as it would have",
                              moment, getattr(hook, "__qualname__", hook))

    def __bool__(self) -> bool:
        return bool(self.started or self.succeeded or self.failed)


__all__ = ["Hooks"]
