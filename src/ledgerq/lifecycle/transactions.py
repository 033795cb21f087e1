"""``db.transaction()``: several calls that commit together, or not at all.

Inside ``async with db.transaction() as tx:``, a call given ``tx=tx`` (a defer, a move)
checks its input at once, as it always does (bad input raises there and then), and
queues its write. When the block ends, the queued writes run in order in one write
transaction of the database: all of them commit, or, if one raises, none does and the
exception leaves the block. A block that raises writes nothing.

Why queued and not an open connection held across the block's awaits: every write of
ledgerq is a unit run from BEGIN to COMMIT without waiting on anything but the database
(SQLite's group commit, PostgreSQL's pooled connections rely on it); a transaction held
open while the caller awaits an HTTP call would hold SQLite's only write lock for as
long. The queued writes read what they need inside the transaction (a move reads the
current state there), so what they decide is decided atomically. What a call returns
inside the block is a :class:`Pending` value, set when the block commits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ledgerq.errors import LedgerqError

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database

T = TypeVar("T")

_UNSET: Any = object()


class NotCommitted(LedgerqError, RuntimeError):
    """A value of a transaction's call was read before the transaction committed."""


class Pending(Generic[T]):
    """What a call made inside a transaction returns once the transaction commits."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._value: Any = _UNSET

    @property
    def done(self) -> bool:
        return self._value is not _UNSET

    @property
    def value(self) -> T:
        if self._value is _UNSET:
            raise NotCommitted(f"{self.what} is known once its transaction commits (after "
                               "the `async with db.transaction()` block)")
        value: T = self._value
        return value

    def _set(self, value: T) -> None:
        self._value = value


class Transaction:
    """The writes queued by the calls of one ``async with db.transaction()`` block."""

    def __init__(self, db: Database[Any]) -> None:
        self.db = db
        self._units: list[tuple[Callable[[Any], Any], Pending[Any]]] = []
        self._after: list[Callable[[], None]] = []
        self._state = "open"

    def add(self, unit: Callable[[Any], T], what: str) -> Pending[T]:
        """Queue ``unit`` (run inside the write transaction, in order); its result."""
        if self._state != "open":
            raise RuntimeError(f"this transaction is {self._state}: start another one")
        pending: Pending[T] = Pending(what)
        self._units.append((unit, pending))
        return pending

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the writes are durable (a wake-up of waiting workers)."""
        self._after.append(callback)

    async def commit(self) -> None:
        self._state = "committing"
        units = self._units
        if units:
            try:
                values = await self.db.write(lambda tx: [unit(tx) for unit, _ in units])
            except BaseException:
                self._state = "rolled back"
                raise
            for (_, pending), value in zip(units, values, strict=True):
                pending._set(value)
        self._state = "committed"
        for callback in self._after:
            callback()

    def discard(self) -> None:
        self._state = "rolled back"
        self._units.clear()


__all__ = ["NotCommitted", "Pending", "Transaction"]
