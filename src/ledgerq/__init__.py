"""ledgerq: declared lifecycles over an append-only log, with a durable task queue on top."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledgerq.errors import TaskFailed
    from ledgerq.queue.submission.application import RetryPolicy
    from ledgerq.store.db import StateDB
    from ledgerq.tasks.app import App
    from ledgerq.tasks.control import Fail, Retry

__version__ = "0.1.0"

#: Name -> the module that defines it, imported on first use.
_LAZY = {
    "StateDB": "ledgerq.store.db",
    "App": "ledgerq.tasks.app",
    "Retry": "ledgerq.tasks.control",
    "Fail": "ledgerq.tasks.control",
    "TaskFailed": "ledgerq.errors",
    "RetryPolicy": "ledgerq.queue.submission.application",
}


def __getattr__(name: str) -> Any:
    # Lazy, so ``ledgerq --version`` and ``import ledgerq.errors`` do not load the engine.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ledgerq' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["App", "Fail", "Retry", "RetryPolicy", "StateDB", "TaskFailed"]
