"""SQLite's transaction: the shared operations over ``sqlite3``, with its own text."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from functools import lru_cache
from types import MappingProxyType
from typing import Any, ClassVar

from ledgerq.lifecycle.naming import named_states
from ledgerq.lifecycle.registry import EntityPolicy, IndexPolicy, sql_literal
from ledgerq.store.queries import Queries
from ledgerq.store.sqltx import SqlTx

QUERIES = Queries("ledgerq.store.sqlite")
#: Primary result codes that say the database or connection failed, not one row: BUSY,
#: LOCKED, NOMEM, READONLY, INTERRUPT, IOERR, CORRUPT, FULL, CANTOPEN, NOTADB.
FAILURE_CODES = frozenset({5, 6, 7, 8, 9, 10, 11, 13, 14, 26})
#: CONSTRAINT: a CHECK, a unique key, a foreign key or a trigger's RAISE refused a write.
CONSTRAINT_CODE = 19


class SqliteTx(SqlTx):
    dialect = "sqlite"
    queries = QUERIES
    mark = "?"
    no_limit = -1
    # By type affinity: TEXT keeps a str, INTEGER an int, REAL a float (but -0.0, kept as
    # 0.0), JSON (NUMERIC affinity) text that does not read as a number; a bool is
    # stored as 1 or 0.
    exact_types = MappingProxyType({"text": str, "integer": int, "float": float,
                                    "timestamp": float, "json": str})
    binds_json_numbers = True
    _texts: ClassVar[dict[tuple[Any, ...], str]] = {}

    conn: sqlite3.Connection

    def __init__(self, conn: Any) -> None:
        super().__init__(conn)
        self._hints: dict[tuple[int, str, str], tuple[EntityPolicy, str]] = {}

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.conn.executemany(sql, rows)

    def hint(self, policy: EntityPolicy, state: str, column: str) -> str:
        """SQLite uses a partial index only when each term of the index's WHERE appears in
        the query's own: it does not see that ``status = 'queued'`` implies ``status IN
        ('queued', 'retry_wait')``. This is the status term of the spec's partial index on
        ``column`` covering ``state``: implied by the query's own condition, so it never
        changes a result; ``1`` (merely slower) when the spec declares no such index.

        Remembered per policy object (held, so its id cannot be reused): hashing the
        policy's indexes on every terminal write cost more than the lookup it served."""
        key = (id(policy), state, column)
        hit = self._hints.get(key)
        if hit is None or hit[0] is not policy:
            hit = self._hints[key] = (policy, _hint(
                policy.indexes, named_states(policy.name)[state], column))
        return hit[1]

    def is_database_failure(self, exc: BaseException) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(exc, sqlite3.Error) and code is not None and \
            code & 0xFF in FAILURE_CODES

    def defer_constraints(self) -> None:
        self.conn.execute(self.q("defer_constraints"))


@lru_cache(maxsize=256)
def _hint(indexes: tuple[IndexPolicy, ...], state: str, column: str) -> str:
    for ix in indexes:
        if ix.columns and ix.columns[0] == column and ix.status_in and state in ix.status_in:
            return QUERIES("status_in", states=", ".join(sql_literal(s) for s in ix.status_in))
    return QUERIES("true")
