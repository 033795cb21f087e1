"""The task face: Python functions as tasks, their typed arguments and results.

Built on the queue (``ledgerq.queue``) and holding no SQL: a task's run is a
``schedule_runs`` row like any other, moved only by guarded transitions.
"""

from ledgerq.tasks.arguments import TaskArguments, TaskResult

__all__ = ["TaskArguments", "TaskResult"]
