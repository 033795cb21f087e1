"""``isolation="process"``: a sync task run in a child process that can be killed.

A thread cannot be stopped from outside; a timeout or a cancel of a thread-run task can
only stop waiting for it. A child process can be killed: its run's timeout record then
says what really happened. The child is a fresh interpreter (``python -m
ledgerq.tasks.isolation``) in a process group of its own, never a ``fork`` of the
worker (which has threads and an event loop a forked child would inherit half-copied)
and never multiprocessing's spawn (which re-runs the parent's ``__main__``). It gets the
task's module and attribute, the arguments and the parent's ``sys.path`` on stdin,
imports the task, calls the function and writes the run's end on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import pickle
import signal
import sys
from typing import TYPE_CHECKING, Any

from ledgerq.queue.worker.finished import Finished
from ledgerq.queue.worker.launcher import stops_by

if TYPE_CHECKING:
    from ledgerq.tasks.task import Task


async def run_in_child(task: Task[Any], kwargs: dict[str, Any]) -> Finished:
    """``task``'s function called in a new child process; killed if this is cancelled."""
    stops_by("process killed")
    module, attribute = task.location
    payload = pickle.dumps((module, attribute, kwargs, list(sys.path)))
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ledgerq.tasks.isolation", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, start_new_session=True)
    try:
        out, _ = await child.communicate(payload)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        await child.wait()
        raise
    try:
        got = pickle.loads(out)
    except Exception:
        return Finished(1, f"the task's child process died (exit code {child.returncode}) "
                        "before it finished", retryable=True)
    return Finished(*got)


def _main() -> None:
    from ledgerq.tasks.execution import run_here
    from ledgerq.tasks.task import Task

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides when it stops
    module, attribute, kwargs, path = pickle.loads(sys.stdin.buffer.read())
    sys.path[:] = path
    found: Any = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    if not isinstance(found, Task):
        raise SystemExit(f"{module}.{attribute} is not a ledgerq task")
    # What the function prints goes to stderr: stdout carries the run's end.
    result, real_stdout = None, sys.stdout
    sys.stdout = sys.stderr
    try:
        result = run_here(found, kwargs)
    finally:
        sys.stdout = real_stdout
    # The exception stays here (it may not pickle): its type, message and traceback go.
    sys.stdout.buffer.write(pickle.dumps(tuple(result._replace(exception=None))))
    sys.stdout.flush()


if __name__ == "__main__":
    _main()


__all__ = ["run_in_child"]
