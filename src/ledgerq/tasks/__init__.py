"""The task face: Python functions as tasks, their typed arguments and results.

Built on the queue (``ledgerq.queue``) and holding no SQL: a task's run is a
``schedule_runs`` row like any other, moved only by guarded transitions.
"""

from ledgerq.errors import TaskFailed
from ledgerq.tasks.app import App
from ledgerq.tasks.arguments import TaskArguments, TaskResult
from ledgerq.tasks.control import Fail, Retry
from ledgerq.tasks.runs import AsyncTaskRun, TaskRun
from ledgerq.tasks.task import Task

__all__ = ["App", "AsyncTaskRun", "Fail", "Retry", "Task", "TaskArguments", "TaskFailed",
           "TaskResult", "TaskRun"]
