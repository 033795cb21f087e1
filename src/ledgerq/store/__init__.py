"""Storage: the StateDB handle, schema generation and JSON codec."""

from ledgerq.store.db import StateDB

__all__ = ["StateDB"]
