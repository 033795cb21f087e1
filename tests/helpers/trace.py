"""Record every statement ledgerq's named operations run, on either backend.

Every operation of a transaction goes through its ``execute``/``executemany``/``stream``
(:class:`~ledgerq.store.sqltx.base.SqlBase`'s, or the dialect's own); these wrap those
methods for as long as a trace is on.
"""

from __future__ import annotations

from typing import Any

from ledgerq.store.postgres.tx import PostgresTx
from ledgerq.store.sqltx.base import SqlBase

_saved: list[tuple[type, str, Any]] = []


def start() -> list[str]:
    statements: list[str] = []
    for cls in (SqlBase, PostgresTx):
        for name in ("execute", "executemany", "stream"):
            if name not in vars(cls):
                continue
            real = vars(cls)[name]

            def wrapped(self: Any, sql: str, *args: Any, _real: Any = real) -> Any:
                statements.append(sql)
                return _real(self, sql, *args)

            _saved.append((cls, name, real))
            setattr(cls, name, wrapped)
    return statements


def stop() -> None:
    while _saved:
        cls, name, real = _saved.pop()
        setattr(cls, name, real)


def count_writes(db: Any) -> list[str]:
    """Record each write unit the handle is given from now on: on either backend a write
    unit is what takes a write lock (SQLite's BEGIN IMMEDIATE), a read never does."""
    seen: list[str] = []
    real = db.write

    async def counting(fn: Any, **options: Any) -> Any:
        seen.append(getattr(fn, "__name__", "unit"))
        return await real(fn, **options)

    db.write = counting
    return seen


#: First words of the statements that take SQLite's write lock in a transaction that
#: began without it (``reads_first``): writes, the CTEs that write included.
_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE")


async def count_write_locks(db: Any, monkeypatch: Any) -> list[str]:
    """Record each statement that takes a write lock from now on: on SQLite a ``BEGIN
    IMMEDIATE``, or a write in a transaction begun without the lock (a unit that
    ``reads_first``); on PostgreSQL, whose BEGIN takes no lock (nor does a write unit
    that only reads), each statement that writes or locks rows or a key. PostgreSQL's
    tracing is undone by ``monkeypatch`` at the test's end."""
    seen: list[str] = []
    if db.dialect != "sqlite":
        for name in ("execute", "executemany"):
            real = getattr(PostgresTx, name)

            def wrapped(self: Any, sql: str, *args: Any, _real: Any = real) -> Any:
                upper = sql.upper()
                if any(w in upper for w in _LOCKS):
                    seen.append(sql)
                return _real(self, sql, *args)

            monkeypatch.setattr(PostgresTx, name, wrapped)
        real_take = PostgresTx.take_alone

        def take_alone(self: Any) -> Any:
            held = real_take(self)  # a statement sent on its own (a write: a submit)
            if held is not None:
                seen.append(held[0])
            return held

        monkeypatch.setattr(PostgresTx, "take_alone", take_alone)
        return seen

    def trace(sql: str) -> None:
        words = sql.split(None, 1)
        first = words[0].upper() if words else ""
        if sql.upper().startswith("BEGIN IMMEDIATE") or first in _WRITES or (
                first == "WITH" and any(w in sql.upper() for w in _WRITES)):
            seen.append(sql)

    await db.run(lambda conn: conn.set_trace_callback(trace))
    return seen


#: What in a PostgreSQL statement writes or takes a lock another writer could wait for.
_LOCKS = ("INSERT ", "UPDATE ", "DELETE ", "FOR UPDATE", "FOR SHARE", "PG_ADVISORY")
