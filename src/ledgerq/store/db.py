"""StateDB: the database handle every ledgerq function takes, on either backend.

``StateDB("state.db")`` is a SQLite file (``":memory:"`` too); ``StateDB("postgresql://…")``
(or ``postgres://``) is a PostgreSQL database. The handle chooses the dialect once and
hands every unit of work a transaction of that dialect (a subclass of
:class:`~ledgerq.store.sqltx.SqlTx`, which implements the engine's
:class:`~ledgerq.lifecycle.store.EventStore` and every protocol of the queue's wings); nothing
above it knows which one it is talking to.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar, cast, get_args

from ledgerq.errors import InvalidInput
from ledgerq.extras import require
from ledgerq.lifecycle import evolution
from ledgerq.lifecycle.entities import Entity
from ledgerq.lifecycle.evolution import Normal, Plan, StateMapping
from ledgerq.lifecycle.registry import EntityPolicy, Registry, default_registry
from ledgerq.lifecycle.transactions import Transaction
from ledgerq.store.sqltx import SqlTx
from ledgerq.store.timeouts import BUSY_TIMEOUT_MS

T = TypeVar("T")
Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]
#: The levels, once: what StateDB and the command accept (any case).
SYNCHRONOUS_LEVELS: tuple[str, ...] = get_args(Synchronous)
POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres(target: str | Path) -> bool:
    return isinstance(target, str) and target.startswith(POSTGRES_SCHEMES)


#: libpq's keyword/value connection string (``host=... dbname=...``): not a URL, so it
#: would otherwise be taken for a SQLite file name and silently create one.
_CONNINFO = re.compile(r"^\s*(host|hostaddr|port|dbname|user|password|service)\s*=",
                       re.IGNORECASE)


def conninfo_problem(target: str | Path) -> str | None:
    """Why ``target`` would be a mistaken SQLite path (a libpq keyword string, or a
    ``file:`` URI), or None."""
    if isinstance(target, str) and target.startswith("file:"):
        # SQLite would open it as a URI while the handle's lock file and every message
        # use the text as given: "file:c.db" and "c.db" would be one database under two
        # locks. One spelling: the path.
        return (f"{target!r} is a SQLite URI; give the database file's path instead "
                f"(e.g. {target.removeprefix('file:').split('?')[0] or 'state.db'!r})")
    if isinstance(target, str) and _CONNINFO.match(target):
        return (f"{target!r} looks like a PostgreSQL keyword/value connection string; "
                "give a URL instead (postgresql://user@host:port/dbname): any other "
                "text is a SQLite file path")
    return None


class Backend(Protocol):
    """What each dialect's connection manager provides to StateDB."""

    dialect: str
    damaged: str | None

    @property
    def is_open(self) -> bool: ...
    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def write(self, fn: Callable[[SqlTx], T], *, bulk: bool = False,
                    reads_first: bool = False, alone: bool = False) -> T: ...
    async def write_together(self, fn: Callable[[SqlTx], T]) -> T: ...
    async def read(self, fn: Callable[[SqlTx], T]) -> T: ...
    async def fetch_one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> dict[str, Any] | None: ...
    async def fetch_all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> list[dict[str, Any]]: ...
    async def check_integrity(self) -> list[str]: ...
    async def durability(self) -> str: ...
    async def replica_as_of(self) -> float | None: ...
    async def listen(self, key: str, on_wake: Callable[[], None],
                     channel: str = "claimable") -> None: ...
    async def unlisten(self, on_wake: Callable[[], None] | None = None,
                       channel: str = "claimable") -> None: ...
    async def migrate(self, mappings: Sequence[StateMapping], *, dry_run: bool) -> Plan: ...
    @property
    def migration(self) -> Plan | None: ...
    @property
    def recorded(self) -> dict[str, Normal]: ...


class StateDB:
    """The database handle every ledgerq function takes (SQLite or PostgreSQL).

    Opening creates the schema of a new database, and migrates an existing one to what
    its specs add (see docs/specs.md, "Changing a spec on a live database"); with
    ``migrate_on_open=False`` it changes no schema (``ledgerq migrate`` plans first) and
    requires the schema to exist.

    Behind a pooler in transaction mode (PgBouncer), ``pooled=True`` keeps nothing on a
    server connection between transactions, and ``listen_url`` (the server's own URL,
    which implies ``pooled``) is where the one ``LISTEN`` connection goes; pooled without
    it, waits poll.
    """

    def __init__(self, path: str | Path, *, registry: Registry | None = None,
                 synchronous: Synchronous = "NORMAL", readonly: bool = False,
                 busy_timeout_ms: int = BUSY_TIMEOUT_MS, migrate_on_open: bool = True,
                 pool_size: int | None = None, pooled: bool = False,
                 listen_url: str | None = None) -> None:
        if str(synchronous).upper() not in SYNCHRONOUS_LEVELS:
            # Checked for either backend: a typo must not pass because the target is a URL.
            raise ValueError(f"synchronous must be NORMAL, FULL, EXTRA or OFF, not "
                             f"{synchronous!r}")
        problem = conninfo_problem(path)
        if problem is not None:
            raise InvalidInput(problem)
        if pool_size is not None and (isinstance(pool_size, bool) or
                                      not isinstance(pool_size, int) or pool_size < 1):
            raise InvalidInput(f"pool_size must be an int >= 1, got {pool_size!r}")
        #: The target as given: a SQLite path, or a PostgreSQL URL.
        self.path = str(path)
        self.registry = registry if registry is not None else default_registry()
        self.readonly = bool(readonly)
        self.busy_timeout_ms = busy_timeout_ms
        if (pooled or listen_url is not None) and not is_postgres(path):
            raise InvalidInput("pooled and listen_url are PostgreSQL's (a pooler in front "
                               f"of the server); {self.path!r} is a SQLite database")
        if listen_url is not None and not is_postgres(listen_url):
            raise InvalidInput(f"listen_url must be a postgresql:// URL, not {listen_url!r}")
        #: Whether ``path`` goes through a pooler in transaction mode, and where LISTEN
        #: connects instead (the server itself): see docs/scaling.md, "Behind a pooler".
        self.pooled = bool(pooled) or listen_url is not None
        self.listen_url = listen_url
        self._log_policies: tuple[tuple[str, ...], list[EntityPolicy]] | None = None
        self._backend: Backend
        if is_postgres(path):
            require("postgres")
            from ledgerq.store.postgres.backend import POOL_SIZE, PostgresBackend

            self._backend = PostgresBackend(self.path, registry=self.registry,
                                            readonly=self.readonly,
                                            migrate_on_open=migrate_on_open,
                                            lock_timeout_ms=busy_timeout_ms,
                                            pool_size=pool_size or POOL_SIZE,
                                            pooled=self.pooled, listen_url=listen_url)
            self.synchronous = "FULL"
        else:
            from ledgerq.store.sqlite.backend import SqliteBackend

            backend = SqliteBackend(self.path, registry=self.registry,
                                    synchronous=synchronous, readonly=self.readonly,
                                    busy_timeout_ms=busy_timeout_ms,
                                    migrate_on_open=migrate_on_open)
            self.synchronous = backend.synchronous
            self._backend = backend

    def twin(self) -> StateDB | None:
        """A handle a thread with an event loop of its own can use (a worker's lease
        keeper). On PostgreSQL, this one: its units run on its pool's threads whatever
        loop awaits them, so the thread costs no connection more. On SQLite, whose
        handle serves one loop, another on the same file, not yet open, with this one's
        specs and settings, that never migrates. None for ``:memory:``, which a second
        handle cannot reach."""
        if self.dialect == "postgresql":
            return self
        if self.path == ":memory:":
            return None
        return StateDB(self.path, registry=self.registry,
                       synchronous=cast("Synchronous", self.synchronous),
                       readonly=self.readonly, busy_timeout_ms=self.busy_timeout_ms,
                       migrate_on_open=False)

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

    async def write(self, fn: Callable[[SqlTx], T], *, bulk: bool = False,
                    reads_first: bool = False, alone: bool = False) -> T:
        """Run ``fn`` in a write transaction; if it raises, nothing it wrote survives.

        The call returns once the transaction is durable (committed) or has failed.
        ``bulk``: ``fn`` may take long (a rebuild, an archive, thousands of rows); on
        SQLite it then never runs in the event loop's thread, so the loop (a worker's
        lease renewals, a server's requests) keeps running meanwhile.
        ``reads_first``: ``fn`` reads before it writes, and often writes nothing (a
        worker's claim pass on an idle queue): on SQLite, where it can, it then takes the
        write lock at its first write instead of at BEGIN, so a unit that only read held
        no other process's writer up.
        ``alone``: ``fn`` is usually one statement whose result it does not read (a plain
        submit): on PostgreSQL it is then built in the caller's thread and that statement
        sent on an asyncio connection, without a hop to a pool thread; a unit that needs
        more runs in a pool thread as any other, so the hint never changes what a unit
        sees or keeps.
        """
        return await self._backend.write(fn, bulk=bulk, reads_first=reads_first, alone=alone)

    def entity(self, name: str) -> Entity:
        """A handle on one entity type's rows: ``create``, ``get``, ``list``, ``move``,
        ``send``, ``history`` (:mod:`ledgerq.lifecycle.entities`). An entity the loaded
        specs lack but the database recorded (an app's own) is judged by its recorded
        spec; ValueError names the entities there are otherwise."""
        if name not in self.registry.entities and self.is_open and name in self.recorded:
            return Entity(self, name, policy=evolution.to_policy(
                self.recorded[name], "the database's recorded spec"))
        return Entity(self, name)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """Calls given ``tx=`` inside the block commit together when it ends, or none of
        them (see :mod:`ledgerq.lifecycle.transactions`); a block that raises writes
        nothing."""
        tx = Transaction(self)
        try:
            yield tx
        except BaseException:
            tx.discard()
            raise
        await tx.commit()

    async def write_together(self, fn: Callable[[SqlTx], T]) -> T:
        """:meth:`write`, allowed to share its transaction with concurrent ones (group
        commit): the terminal writes of a worker's runs.

        Same contract as :meth:`write`: the call returns once the transaction is durable,
        and a ``fn`` that raises leaves nothing behind (a group it was in runs again
        without it). SQLite groups every write already; PostgreSQL groups these.
        """
        return await self._backend.write_together(fn)

    async def read(self, fn: Callable[[SqlTx], T]) -> T:
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

    @property
    def migration(self) -> Plan | None:
        """What opening this handle migrated: None when the database already recorded
        these specs; else the plan carried out (new states, columns, indexes, entities)."""
        return self._backend.migration

    @property
    def recorded(self) -> dict[str, Normal]:
        """The normalized spec the database records per entity (as of opening, or the
        last :meth:`migrate`): ``ledgerq specs diff`` compares it with a directory."""
        return self._backend.recorded

    def log_policies(self) -> list[EntityPolicy]:
        """The entities as the database records them: what ``verify`` and ``rebuild``
        fold the log into. During a rolling upgrade the database may know more states,
        columns or entities than this process's specs; folding with the process's own
        would call a newer column drift, and a rebuild would drop its values."""
        key = tuple(sorted(evolution.spec_hash(n) for n in self._backend.recorded.values()))
        if self._log_policies is None or self._log_policies[0] != key:
            mine = {p.name: p for p in self.registry.policies()}
            policies = []
            for entity, normal in self._backend.recorded.items():
                own = mine.pop(entity, None)
                if own is not None and evolution.policy_normal(own) == normal:
                    policies.append(own)
                else:
                    policies.append(evolution.to_policy(normal, f"<{entity} as recorded>"))
            self._log_policies = (key, [*policies, *mine.values()])
        return list(self._log_policies[1])

    def adopt_recorded(self) -> None:
        """Judge by the specs the database records from now on (an operator's command, or
        ``ledgerq serve``, given no specs of its own): states, terminal sets and
        vocabularies as the releases and apps that opened the database declared them, so
        ``ls --status paused`` filters and ``cancel`` of a paused run cancels it. Opening
        with this handle's specs migrated what they add, so the database records them
        too."""
        self.registry = Registry(self.log_policies())

    async def migrate(self, mappings: Sequence[StateMapping] = (), *,
                      dry_run: bool = False) -> Plan:
        """Make the database's recorded specs exactly this handle's (``ledgerq migrate``).

        Unlike opening, this removes what the specs no longer declare: states (refused
        while rows are in them unless ``mappings`` move those rows, each with a fact),
        edges, reason codes, columns (refused while rows hold values), indexes and
        entities (refused while their table has rows). A refused plan raises
        :class:`~ledgerq.errors.MigrationRefused` and changes nothing; ``dry_run``
        returns the plan, refusals included, and changes nothing either.
        """
        return await self._backend.migrate(list(mappings), dry_run=dry_run)

    async def check_integrity(self) -> list[str]:
        """The database's own consistency check: [] when sound, else its findings."""
        return await self._backend.check_integrity()

    async def durability(self) -> str:
        """What a commit waits for, as the backend reports it (for operators' logs)."""
        return await self._backend.durability()

    async def replica_as_of(self) -> float | None:
        """On a read replica (a PostgreSQL standby), the time its reads are as of: now
        while it has replayed everything it received, else the time of the last commit
        it replayed. None on a primary and on SQLite: reads are current."""
        return await self._backend.replica_as_of()

    async def listen(self, on_wake: Callable[[], None], channel: str = "claimable") -> None:
        """Call ``on_wake`` (from any thread) whenever another process or host may have
        made a row claimable (``channel="claimable"``) or ended a run (``"ended"``),
        until :meth:`unlisten`; a no-op where the backend has no channel for it (SQLite:
        other processes poll)."""
        await self._backend.listen(self.path, on_wake, channel)

    async def unlisten(self, on_wake: Callable[[], None] | None = None,
                       channel: str = "claimable") -> None:
        await self._backend.unlisten(on_wake, channel)

    async def run(self, fn: Callable[[Any], T]) -> T:
        """SQLite only: run ``fn`` with the raw write connection, outside any transaction.

        For what must happen on the connection writes use (a trace callback, a pragma).
        """
        from ledgerq.store.sqlite.backend import SqliteBackend

        if not isinstance(self._backend, SqliteBackend):
            raise TypeError("StateDB.run() gives a raw SQLite connection; this handle is "
                            f"{self.dialect}")
        return await self._backend.run(fn)
