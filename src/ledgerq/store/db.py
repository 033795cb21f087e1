"""StateDB: the database handle every ledgerq function takes, on either backend.

``StateDB("state.db")`` is a SQLite file (``":memory:"`` too); ``StateDB("postgresql://…")``
(or ``postgres://``) is a PostgreSQL database. The handle chooses the dialect once and
hands every unit of work a :class:`~ledgerq.operations.Tx` of that dialect; nothing
above it knows which one it is talking to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar

from ledgerq.lifecycle.registry import Registry, default_registry
from ledgerq.operations import Tx

T = TypeVar("T")
Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]
#: How long a SQLite writer waits for the write lock (ms).
BUSY_TIMEOUT_MS = 30_000
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(target: str | Path) -> bool:
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


class Backend(Protocol):
    """What each dialect's connection manager provides to StateDB."""

    dialect: str
    damaged: str | None

    @property
    def is_open(self) -> bool: ...
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def write(self, fn: Callable[[Tx], T]) -> T: ...
    async def read(self, fn: Callable[[Tx], T]) -> T: ...
    async def fetch_one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> dict[str, Any] | None: ...
    async def fetch_all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> list[dict[str, Any]]: ...
    async def check_integrity(self) -> list[str]: ...
    async def durability(self) -> str: ...
    async def listen(self, key: str, on_wake: Callable[[], None]) -> None: ...
    async def unlisten(self) -> None: ...


class StateDB:
    """The database handle every ledgerq function takes (SQLite or PostgreSQL)."""

    def __init__(self, path: str | Path, *, registry: Registry | None = None,
                 synchronous: Synchronous = "NORMAL", readonly: bool = False,
                 busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        if str(synchronous).upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            # Checked for either backend: a typo must not pass because the target is a URL.
            raise ValueError(f"synchronous must be NORMAL, FULL, EXTRA or OFF, not "
                             f"{synchronous!r}")
        #: The target as given: a SQLite path, or a PostgreSQL URL.
        self.path = str(path)
        self.registry = registry if registry is not None else default_registry()
        self.readonly = bool(readonly)
        self.busy_timeout_ms = busy_timeout_ms
        self._backend: Backend
        if is_postgres(path):
            from ledgerq.store.postgres.backend import PostgresBackend

            self._backend = PostgresBackend(self.path, registry=self.registry,
                                            readonly=self.readonly)
            self.synchronous = "FULL"
        else:
            from ledgerq.store.sqlite.backend import SqliteBackend

            backend = SqliteBackend(self.path, registry=self.registry,
                                    synchronous=synchronous, readonly=self.readonly,
                                    busy_timeout_ms=busy_timeout_ms)
            self.synchronous = backend.synchronous
            self._backend = backend

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._backend.dialect

    @property
    def many_writers(self) -> bool:
        """Whether writers run at once (PostgreSQL), so that a claim pass must lock the
        rows it scans, or one at a time (SQLite), so that it need not."""
        return self.dialect != "sqlite"

    @property
    def file(self) -> str | None:
        """The SQLite file this handle opened (None for ``:memory:`` and PostgreSQL)."""
        if self.dialect != "sqlite" or self.path in (":memory:", ""):
            return None
        return self.path

    @property
    def damaged(self) -> str | None:
        """Why this handle refuses writes, once the database reported itself damaged."""
        return self._backend.damaged

    @property
    def is_open(self) -> bool:
        return self._backend.is_open

    async def open(self) -> StateDB:
        await self._backend.open()
        return self

    async def close(self) -> None:
        """Close after every write already accepted has committed (or failed) for real."""
        await self._backend.close()

    async def __aenter__(self) -> StateDB:
        return await self.open()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def write(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` in a write transaction; if it raises, nothing it wrote survives.

        The call returns once the transaction is durable (committed) or has failed.
        """
        return await self._backend.write(fn)

    async def read(self, fn: Callable[[Tx], T]) -> T:
        """Run ``fn`` inside one read-only snapshot (it never waits for a commit)."""
        return await self._backend.read(fn)

    async def fetch_one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> dict[str, Any] | None:
        """The first row of a query in the backend's own dialect, as a dict (read-only).

        Portable reads go through :mod:`ledgerq.projections`; this runs what it is given.
        On PostgreSQL ``?`` placeholders are accepted as well as ``%s``.
        """
        return await self._backend.fetch_one(sql, params)

    async def fetch_all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> list[dict[str, Any]]:
        """Every row of a query in the backend's own dialect, as dicts (read-only)."""
        return await self._backend.fetch_all(sql, params)

    async def check_integrity(self) -> list[str]:
        """The database's own consistency check: [] when sound, else its findings."""
        return await self._backend.check_integrity()

    async def durability(self) -> str:
        """What a commit waits for, as the backend reports it (for operators' logs)."""
        return await self._backend.durability()

    async def listen(self, on_wake: Callable[[], None]) -> None:
        """Call ``on_wake`` (from any thread) whenever another process or host may have
        made a row claimable, until :meth:`unlisten`; a no-op where the backend has no
        channel for it (SQLite: other processes' workers poll)."""
        await self._backend.listen(self.path, on_wake)

    async def unlisten(self) -> None:
        await self._backend.unlisten()

    async def run(self, fn: Callable[[Any], T]) -> T:
        """SQLite only: run ``fn`` with the raw write connection, outside any transaction.

        For what must happen on the connection writes use (a trace callback, a pragma).
        """
        from ledgerq.store.sqlite.backend import SqliteBackend

        if not isinstance(self._backend, SqliteBackend):
            raise TypeError("StateDB.run() gives a raw SQLite connection; this handle is "
                            f"{self.dialect}")
        return await self._backend.run(fn)
