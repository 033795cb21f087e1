"""How long a store operation waits for a lock before giving up, on every dialect.

A writer that waits forever behind another's lock looks like a hung process; one that
gives up at once fails under ordinary contention. Thirty seconds rides out any single
transaction ledgerq makes while still ending a wait that something outside it caused.
"""

from __future__ import annotations

#: How long a writer waits for a lock another holds: SQLite's busy timeout (another's
#: write lock), PostgreSQL's ``lock_timeout`` (a row or a table another holds).
BUSY_TIMEOUT_MS = 30_000

__all__ = ["BUSY_TIMEOUT_MS"]
