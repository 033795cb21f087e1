"""ledgerq: declared lifecycles over an append-only log, with a durable task queue on top."""

from ledgerq.store.db import StateDB

__all__ = ["StateDB"]
__version__ = "0.1.0"
