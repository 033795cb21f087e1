"""Record every statement ledgerq's named operations run, on either backend.

Every operation of a Tx goes through its ``execute``/``executemany``/``stream``; these
wrap those methods of both dialects' classes for as long as a trace is on.
"""

from __future__ import annotations

from typing import Any

from ledgerq.store.postgres.tx import PostgresTx
from ledgerq.store.sqltx import SqlTx

_saved: list[tuple[type, str, Any]] = []


def start() -> list[str]:
    statements: list[str] = []
    for cls in (SqlTx, PostgresTx):
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
