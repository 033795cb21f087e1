"""ledgerq: declared lifecycles over an append-only log, with a durable task queue on top."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledgerq.store.db import StateDB

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Lazy, so ``ledgerq --version`` and ``import ledgerq.errors`` do not load the engine.
    if name == "StateDB":
        from ledgerq.store.db import StateDB

        return StateDB
    raise AttributeError(f"module 'ledgerq' has no attribute {name!r}")


__all__ = ["StateDB"]
