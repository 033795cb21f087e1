"""Which callable runs a claimed row, chosen by its action kind, and which kinds a worker claims.

A worker claims only the kinds it can execute: a run whose code this worker lacks (a
Python task of another app, ``workflow`` without its adapter, the launcher's kinds where
the launcher's command is not installed) waits for a worker that has it, instead of
being claimed here and failed, burning its retries.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field

from ledgerq.queue.submission.application import ACTION_KINDS
from ledgerq.queue.worker.launcher import DEFAULT_COMMAND_PREFIX, ExecuteFn, default_execute

#: The kind the launcher runs as its own argv, needing no command of its own.
COMMAND_KIND = "command"
#: The kind that runs only through an adapter.
WORKFLOW_KIND = "workflow"


@dataclass(frozen=True)
class Executors:
    """Which callable runs which action kind: adapters first (a Python app's tasks are
    adapters), then ``execute`` for the ADR-0071 queue's kinds, else the launcher.

    ``workflow`` has no default: without an adapter its rows are never claimed. Without
    ``execute``, the launcher's kinds other than ``command`` are served only where its
    command (``li``) resolves on PATH.
    """

    execute: ExecuteFn | None = None
    adapters: Mapping[str, ExecuteFn] = field(default_factory=dict)

    def for_kind(self, kind: str) -> ExecuteFn | None:
        if kind in self.adapters:
            return self.adapters[kind]
        if kind == WORKFLOW_KIND or kind not in ACTION_KINDS:
            return None
        return self.execute or default_execute

    @functools.cached_property
    def served_kinds(self) -> tuple[str, ...]:
        """Every kind this worker claims, sorted: the only ones it has code for."""
        record = [k for k in ACTION_KINDS if k != WORKFLOW_KIND]
        # An executor that wraps the launcher (functools.wraps) can run what it can.
        launches = self.execute is None \
            or getattr(self.execute, "__wrapped__", None) is default_execute
        if launches and shutil.which(DEFAULT_COMMAND_PREFIX) is None:
            record = [COMMAND_KIND]
        return tuple(sorted({*record, *self.adapters}))
