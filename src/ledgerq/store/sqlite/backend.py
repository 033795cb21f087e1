"""SQLite behind StateDB: a write connection and a read connection (aiosqlite), group
commit, and writes that run in the event loop's own thread while nobody else holds the lock.

Why this shape: a hop to a connection's thread and back costs two cross-thread wake-ups
(~80 us on a VM), more than a move's statements. Writes are plain functions run from
``BEGIN IMMEDIATE`` to ``COMMIT``; in WAL mode the write lock is the only lock a writer
ever waits for, so the write connection tries it without waiting (busy timeout 0) in
the loop's thread, and only when another process holds it does the group go to the
connection's own thread, which waits up to the busy timeout while the loop runs on.
An uncontended write therefore blocks the loop for its statements and its commit (at
``synchronous=FULL`` an fsync), never for another process's transaction.
Reads go to a second, query-only connection with its own thread: in WAL mode a reader
never waits for a writer, and a long read (a scan, verify) never blocks the loop.
A write called while nothing else is ready to run in the loop's turn runs at once, in
the caller's own step (no other write could have joined its commit), then yields a
turn of the loop if 1 ms has passed since its last such turn; one called beside other
ready tasks waits for the turn's
group, which their writes may join. Units that arrive while a group runs are queued
and run together in the next transaction: a unit that raises is rolled back alone (see
:func:`_run_group`), the others commit, and every caller learns its outcome only after
the commit that made it durable. ``BEGIN IMMEDIATE`` takes the write lock before the
first read, so a read-then-write never fails with SQLITE_BUSY halfway; the one
exception is a unit that says it ``reads_first`` running at once in the loop's thread,
which begins deferred, so a unit that only reads takes no lock (one that then finds the
lock held is rolled back and queued, as a group that finds it held at BEGIN is). Units must not
sleep or wait on anything but the database: they may run in the loop's thread.

A damaged file is never written: opening for write runs ``PRAGMA quick_check`` when the
last writer did not close cleanly (see :mod:`ledgerq.store.integrity`), and any
"malformed"/"not a database" error later marks the handle damaged and refuses every
further write (:class:`~ledgerq.errors.DatabaseDamaged`). ``readonly=True`` opens the
file read-only: it never writes, never creates the schema, never sets WAL.
"""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

import aiosqlite

from ledgerq.errors import (
    DatabaseDamaged,
    DatabaseError,
    DatabaseUnavailable,
    IntegrityViolation,
    SchemaMissing,
)
from ledgerq.lifecycle.evolution import Normal, Plan, StateMapping
from ledgerq.lifecycle.registry import Registry
from ledgerq.store.sqlite import integrity
from ledgerq.store.sqlite.catalog import read_recorded
from ledgerq.store.sqlite.schema import apply_specs, missing_tables, open_schema
from ledgerq.store.sqlite.tx import CONSTRAINT_CODE, FAILURE_CODES, SqliteTx
from ledgerq.store.timeouts import BUSY_TIMEOUT_MS

T = TypeVar("T")
Unit = Callable[[SqliteTx], Any]
Synchronous = Literal["OFF", "NORMAL", "FULL", "EXTRA"]

_SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
#: Most units run in one group commit; bounds the latency one commit adds to the next.
MAX_GROUP = 256
#: Compiled statements sqlite3 keeps per connection (its default is 128). The engine has
#: one UPDATE text per shape of move, the queue dozens of its own; a miss re-prepares.
STATEMENT_CACHE = 512
#: A caller whose writes commit in its own step (see :meth:`SqliteBackend.write`) yields
#: a turn of the loop after one when this long has passed since the last such turn: a
#: due timer or signal waits at most this much longer, and a caller writing in a loop
#: does not pay a turn (a poll of the selector) for every write.
INLINE_YIELD_SECONDS = 0.001


class SqliteBackend:
    """One SQLite file (or ``:memory:``) behind a :class:`~ledgerq.StateDB`."""

    dialect = "sqlite"

    def __init__(self, path: str, *, registry: Registry, synchronous: str = "NORMAL",
                 readonly: bool = False, busy_timeout_ms: int = BUSY_TIMEOUT_MS,
                 migrate_on_open: bool = True) -> None:
        self.migrate_on_open = migrate_on_open
        sync = str(synchronous).upper()
        if sync not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError(f"synchronous must be NORMAL, FULL, EXTRA or OFF, not {synchronous!r}")
        self.path = str(path)
        self.registry = registry
        self.synchronous = sync
        self.busy_timeout_ms = busy_timeout_ms
        self.readonly = bool(readonly)
        #: Why this handle refuses writes, once SQLite has reported the file damaged.
        self.damaged: str | None = None
        #: What opening migrated (None: the database was already at these specs).
        self.migration: Plan | None = None
        #: The specs the database records, as of opening (or the last migrate).
        self.recorded: dict[str, Normal] = {}
        self._writer_lock: integrity.WriterLock | None = None
        self._conn: aiosqlite.Connection | None = None
        #: The event loop the handle was opened on: the only one it serves.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader: aiosqlite.Connection | None = None
        self._pending: list[_Queued] = []
        self._drainer: asyncio.Task[None] | None = None
        self._closing = False
        #: Whether write groups run in the event loop's thread (see :meth:`_drain`): the
        #: journal lets a writer take the lock without waiting or find it held at once.
        self._inline = False
        #: Calls in flight on the write connection's own thread: an inline group waits
        #: its turn behind them (the connection is never used by two threads at once).
        self._writer_calls = 0
        #: When a write that committed in its caller's step last yielded a turn.
        self._yielded = 0.0

    # ------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        if self._conn is not None:
            return
        if self.readonly:
            self._conn = await self._open_readonly()
            self._loop = asyncio.get_running_loop()
            return
        if self.path not in (":memory:", ""):
            # Before SQLite touches the file: only the first writer after a crash checks.
            self._writer_lock = integrity.WriterLock(self.path)
        try:
            if self._writer_lock is not None and self._writer_lock.unclean:
                await self._check_before_writing()
            conn = await self._connect(self._configure)
            self._inline = await _in_thread(conn, self._impatient)
        except BaseException:
            self._release_writer_lock()
            raise
        # ":memory:" and "" (a private temporary file) are per connection: a second
        # connection would open another, empty database.
        if self.path not in (":memory:", ""):
            try:
                self._reader = await self._connect(self._configure_reader)
            except BaseException:
                await conn.close()
                self._release_writer_lock()
                raise
        self._conn, self._loop = conn, asyncio.get_running_loop()

    async def _check_before_writing(self) -> None:
        """quick_check on a read-only connection: closing it checkpoints nothing, so a
        damaged file (and the WAL a crashed writer left) stays exactly as it was found."""
        found: list[str] = []
        uri = Path(self.path).resolve().as_uri() + "?mode=ro"
        conn = await self._connect(lambda c: found.extend(integrity.quick_check(c)), uri)
        await conn.close()
        if found:
            self.damaged = found[0]
            raise DatabaseDamaged(f"database is damaged: {self.path}: quick_check: "
                                  + "; ".join(found[:5]))

    async def _open_readonly(self) -> aiosqlite.Connection:
        """A read-only connection, or a clear error; never creates or changes a file.

        ``mode=ro`` still needs the WAL index (``-shm``): where the directory is not
        writable and no ``-wal`` file exists (so no writer has the file open), SQLite
        cannot build one, and the file is opened ``immutable`` instead.
        """
        if self.path in (":memory:", ""):
            raise DatabaseError("readonly=True needs a database file, not a private database")
        if not Path(self.path).is_file():
            raise DatabaseError(f"no database at {self.path}")
        uri = Path(self.path).resolve().as_uri() + "?mode=ro"
        try:
            conn = await self._connect(self._configure_readonly, uri)
        except DatabaseUnavailable as exc:
            if Path(self.path + "-wal").exists():
                raise DatabaseError(f"cannot open {self.path} read-only: {exc}") from exc
            conn = await self._connect(self._configure_readonly, uri + "&immutable=1")
        return conn

    async def _connect(self, configure: Callable[[sqlite3.Connection], None],
                       uri: str | None = None) -> aiosqlite.Connection:
        try:
            conn = await aiosqlite.connect(uri or self.path, isolation_level=None,
                                           timeout=self.busy_timeout_ms / 1000,
                                           cached_statements=STATEMENT_CACHE,
                                           uri=uri is not None, factory=_Connection,
                                           check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        try:
            await self._call(conn, configure)
        except BaseException:
            await conn.close()
            raise
        return conn

    def _translate(self, exc: BaseException, *, raw: bool = False) -> BaseException:
        """A driver error becomes the ledgerq error it means (the driver's stays as the
        ``__cause__``). A corruption error becomes DatabaseDamaged, and the handle then
        refuses writes. ``raw`` (:meth:`run`'s raw connection) translates damage only."""
        out: BaseException
        if isinstance(exc, UnicodeDecodeError):
            # ledgerq stores only UTF-8 (every text is checked before it is written), so
            # text that does not decode (a row, or the schema itself, whose text SQLite's
            # messages quote) is a damaged page or a foreign writer's bytes.
            self.damaged = str(exc)
            out = DatabaseDamaged(f"database is damaged: {self.path}: it holds text that "
                                  f"is not UTF-8 ({exc.reason} at byte {exc.start})")
            out.__cause__ = exc
            return out
        if not isinstance(exc, sqlite3.Error):
            return exc
        if isinstance(exc, sqlite3.DatabaseError) and integrity.is_damage(exc):
            self.damaged = str(exc)
            out = DatabaseDamaged(f"database is damaged: {self.path}: {exc}")
        elif raw:
            return exc
        else:
            code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
            if code == CONSTRAINT_CODE:
                out = IntegrityViolation(str(exc))
            elif code in FAILURE_CODES:
                out = DatabaseUnavailable(f"{self.path}: {exc}")
            else:
                out = DatabaseError(f"{self.path}: {exc}")
        out.__cause__ = exc
        return out

    async def _call(self, conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T],
                    *, raw: bool = False) -> T:
        writer = conn is self._conn
        if writer:
            self._writer_calls += 1
            if self._inline:
                fn = functools.partial(self._patiently, fn)
        try:
            return await _in_thread(conn, fn)
        except (sqlite3.Error, UnicodeDecodeError) as exc:
            translated = self._translate(exc, raw=raw)
            if translated is exc:
                raise
            raise translated from exc
        finally:
            if writer:
                self._writer_calls -= 1

    def _impatient(self, conn: sqlite3.Connection) -> bool:
        """Make the write connection fail at once on a held lock, where that is safe; True
        when it did (write groups then run inline, see :meth:`_drain`).

        In WAL mode (and in a private database) the write lock is the only lock a writer
        can wait for, and ``BEGIN IMMEDIATE`` takes it: a transaction that has begun never
        meets SQLITE_BUSY again. In a rollback journal a COMMIT waits for readers, so
        there the connection keeps waiting in its own thread, as before.
        """
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() not in ("wal", "memory") and self.path != "":
            return False
        conn.execute("PRAGMA busy_timeout = 0")
        return True

    def _patiently(self, fn: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
        """Run ``fn`` in the write connection's thread with the busy timeout it had, for
        what may wait for another process's lock (a group that found it held, a migration)."""
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        try:
            return fn(conn)
        finally:
            conn.execute("PRAGMA busy_timeout = 0")

    def _release_writer_lock(self) -> None:
        lock, self._writer_lock = self._writer_lock, None
        if lock is not None:
            lock.release()

    def _configure(self, conn: sqlite3.Connection) -> None:
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        if self.path != ":memory:":
            conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        # UPDATE ... RETURNING (every transition) stages its rows in a temp table: in
        # memory that costs a third of what temp files do (measured with sqlite3 alone).
        conn.execute("PRAGMA temp_store = MEMORY")
        if self.migrate_on_open:
            self.migration = open_schema(conn, self.registry)
        elif "status_transitions" in missing_tables(conn, self.registry):
            # The log is what must exist; the specs' new entities are the migration's.
            raise SchemaMissing(f"{self.path} has no ledgerq schema; `ledgerq migrate` "
                                "works on an existing database")
        self.recorded = read_recorded(conn)

    def _configure_readonly(self, conn: sqlite3.Connection) -> None:
        self._configure_reader(conn)
        self.recorded = read_recorded(conn)
        self._no_schema(conn)

    def _no_schema(self, conn: sqlite3.Connection) -> None:
        # The log is what must exist. An entity's table the specs declare and the file
        # lacks was added by newer specs that no writer has migrated it to yet (a new
        # release's read command before its first worker started): reads of other
        # entities go on.
        missing = [t for t in missing_tables(conn, self.registry) if t == "status_transitions"]
        if missing:
            raise SchemaMissing(
                f"{self.path} has no ledgerq schema (missing table(s) {', '.join(missing)}); "
                "a read-only open never creates one: open it for writing first")

    def _configure_reader(self, conn: sqlite3.Connection) -> None:
        # The writer's settings (so a PRAGMA read through either reports the same), plus
        # query_only: every write goes through write(), never through this connection.
        conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_ms)}")
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute("PRAGMA query_only = ON")

    async def close(self) -> None:
        """Close after every write already accepted has committed (or failed) for real."""
        if self._conn is None or self._closing:
            return
        self._closing = True
        try:
            while self._drainer is not None:
                await asyncio.shield(self._drainer)
            conn, self._conn = self._conn, None
            reader, self._reader = self._reader, None
            try:
                if reader is not None:
                    await reader.close()
            finally:
                try:
                    if conn is not None:
                        await conn.close()
                finally:
                    self._release_writer_lock()
        finally:
            self._closing = False

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    def _require(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise RuntimeError("StateDB is not open; use 'async with StateDB(path)' or open()")
        loop: asyncio.AbstractEventLoop | None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = self._loop
        if loop is not self._loop:
            # Writes run inline in the caller's thread: two loops (two threads) on one
            # connection would interleave their transactions, or wait on each other's
            # futures forever. One handle per event loop.
            raise DatabaseError(f"{self.path}: this StateDB was opened on another event "
                                "loop (another thread's asyncio.run?); open one StateDB "
                                "per event loop")
        return self._conn

    # ------------------------------------------------------------ reads

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` in the write connection's thread, outside any transaction (one hop).

        For what must happen on the connection writes use (a trace callback, a pragma);
        plain reads belong in :meth:`read`, :meth:`fetch_one` and :meth:`fetch_all`.
        """
        conn = self._require()
        return await self._call(conn, fn, raw=True)

    async def migrate(self, mappings: Sequence[StateMapping], *, dry_run: bool) -> Plan:
        """``ledgerq migrate``: on the write connection, so no write of this handle is
        interleaved, in one transaction (the twelve-step rebuild needs foreign keys off,
        which only a connection outside a transaction can switch)."""
        def unit(conn: sqlite3.Connection) -> Plan:
            plan = apply_specs(conn, self.registry, mappings, dry_run=dry_run)
            self.recorded = read_recorded(conn)
            return plan

        return await self.run(unit)

    async def _query(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        self._require()
        return await self._call(self._reader or self._require(), fn)

    async def listen(self, key: str, on_wake: Callable[[], None],
                     channel: str = "claimable") -> None:
        """SQLite has no cross-process channel: other processes' workers poll."""

    async def unlisten(self, on_wake: Callable[[], None] | None = None,
                       channel: str = "claimable") -> None:
        """See :meth:`listen`."""

    async def replica_as_of(self) -> float | None:
        """A SQLite file is never a replica."""
        return None

    async def durability(self) -> str:
        level = await self.run(lambda c: c.execute("PRAGMA synchronous").fetchone()[0])
        return f"synchronous {_SYNC_NAMES.get(level, level)}"

    async def check_integrity(self) -> list[str]:
        """``PRAGMA quick_check`` of the whole file: [] when it is sound, else its findings."""
        problems = await self._query(integrity.quick_check)
        if problems:
            self.damaged = problems[0]
        return problems

    async def read(self, fn: Callable[[SqliteTx], T]) -> T:
        """Run ``fn`` inside one read transaction, so every statement sees one snapshot.

        It runs on the read connection: it sees every write whose ``write()`` has
        returned, and it never waits for a commit in flight.
        """

        def snapshot(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN")
            try:
                return fn(_tx(conn))
            finally:
                conn.execute("COMMIT")

        return await self._query(snapshot)

    async def fetch_one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> dict[str, Any] | None:
        """The first row of a query, as a dict (read connection: a statement that writes
        fails with "attempt to write a readonly database"; writes go through write())."""

        def one(conn: sqlite3.Connection) -> dict[str, Any] | None:
            cur = conn.execute(sql, params)
            row = cur.fetchone()
            if row is None:
                return None
            return dict(zip([d[0] for d in cur.description], row, strict=True))

        return await self._query(one)

    async def fetch_all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> list[dict[str, Any]]:
        """Every row of a query, as dicts (read connection, like :meth:`fetch_one`)."""

        def rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            return SqliteTx.dicts(conn.execute(sql, params))

        return await self._query(rows)

    # ------------------------------------------------------------ writes

    async def write(self, fn: Callable[[SqliteTx], T], *, bulk: bool = False,
                    reads_first: bool = False, alone: bool = False) -> T:
        """Run ``fn`` in a write transaction, grouped with concurrent writers into one commit.

        If ``fn`` raises, its changes are rolled back (its alone: see :func:`_run_group`)
        and the exception is raised here; nothing it wrote survives. It runs in the
        loop's thread when the lock is free (see the module's note), so it must not
        block on anything but the database; a ``bulk`` unit (one that may take long)
        always runs in the connection's thread. A ``reads_first`` unit that runs inline
        takes the lock at its first write, not at BEGIN (see the module's note).
        ``alone`` changes nothing here: every uncontended write already runs in the
        caller's thread.
        """
        if self._closing:
            raise RuntimeError("StateDB is closing; no new writes are accepted")
        self._require()
        if self.readonly:
            raise DatabaseError(f"{self.path} is open read-only (readonly=True): writes refused")
        if self.damaged is not None:
            raise DatabaseDamaged(f"database is damaged: {self.path}: {self.damaged}; "
                                  "writes refused")
        loop = asyncio.get_running_loop()
        if self._drainer is None and self._may_run_inline(bulk) \
                and not getattr(loop, "_ready", True):
            # Nothing else is ready to run in this turn of the loop, so no other write can
            # join this one's commit: run it now, in the caller's own step, instead of
            # through a future and a task in two more turns of the loop.
            try:
                outcomes = _run_group(self._require()._conn, units=[fn], wait=False,
                                      deferred=reads_first)
            except BaseException as exc:
                raise self._translate(exc)  # noqa: B904  (its cause is set: the driver's error)
            if outcomes is not None:
                # A turn of the loop before returning, as a queued write takes, at least
                # every INLINE_YIELD_SECONDS: a caller that writes in a loop must not keep
                # timers, I/O and signals waiting.
                now = time.monotonic()
                if now - self._yielded >= INLINE_YIELD_SECONDS:
                    self._yielded = now
                    await asyncio.sleep(0)
                ok, value = outcomes[0]
                if ok:
                    return value  # type: ignore[no-any-return]
                raise self._translate(value)
            # The lock was held (a unit that read first found it held when it wrote): it
            # queues as a writer, to take the lock at BEGIN.
            reads_first = False
        fut: asyncio.Future[T] = loop.create_future()
        self._pending.append(_Queued(fn, fut, bulk, reads_first))
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        return await fut

    def _may_run_inline(self, bulk: bool) -> bool:
        """Whether a group may run in the loop's thread now: the journal lets the writer
        find the lock held at once, no call is in flight on the connection's own thread,
        and it is not a bulk unit (which may take long)."""
        return self._inline and self._writer_calls == 0 and not bulk

    def _next_group(self) -> list[_Queued]:
        """The next units to run together: a bulk unit alone (it may be run again if it
        shared a group with a unit that raised, and it may write outside the database),
        else up to MAX_GROUP others in the order they came."""
        pending = self._pending
        if pending[0].bulk:
            return [pending.pop(0)]
        end = 1
        while end < len(pending) and end < MAX_GROUP and not pending[end].bulk:
            end += 1
        batch = pending[:end]
        del pending[:end]
        return batch

    async def write_together(self, fn: Callable[[SqliteTx], T]) -> T:
        """:meth:`write`: every write already shares a group commit here."""
        return await self.write(fn)

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._next_group()
                conn = self._conn
                if conn is None:
                    err = RuntimeError("StateDB closed before the write ran")
                    for queued in batch:
                        if not queued.fut.done():
                            queued.fut.set_exception(err)
                    continue
                units = [queued.unit for queued in batch]
                try:
                    outcomes = None
                    if self._may_run_inline(batch[0].bulk):
                        # In the loop's own thread: no hop to the connection's thread and
                        # back (~80 us each way on a VM, more than a move's statements).
                        # The lock is tried without waiting; if another process holds it,
                        # the group runs in the connection's thread, which waits for it.
                        outcomes = _run_group(conn._conn, units=units, wait=False, deferred=all(
                            queued.reads_first for queued in batch))
                    if outcomes is None:
                        outcomes = await self._call(conn, functools.partial(
                            _run_group, units=units, wait=True))
                    assert outcomes is not None
                except BaseException as exc:  # the commit itself failed: nobody's write held
                    exc = self._translate(exc)
                    for queued in batch:
                        if not queued.fut.done():
                            queued.fut.set_exception(exc)
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    continue
                for (_, fut, _, _), (ok, value) in zip(batch, outcomes, strict=True):
                    if fut.done():
                        continue
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(self._translate(value))
        finally:
            self._drainer = None


async def _in_thread(conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn`` with the raw connection in aiosqlite's thread: one hop, however many statements.

    aiosqlite has no public call for this; ``_execute`` is what its own cursors use.
    """
    raw: sqlite3.Connection = conn._conn
    result: T = await conn._execute(fn, raw)  # type: ignore[no-untyped-call]
    return result


class _Queued(NamedTuple):
    """A write waiting for its group: the unit, its caller's future, and how it asked to
    run (:meth:`SqliteBackend.write`'s ``bulk`` and ``reads_first``)."""

    unit: Unit
    fut: asyncio.Future[Any]
    bulk: bool
    reads_first: bool


class _Connection(sqlite3.Connection):
    """A connection that carries its SqliteTx (which caches statement texts per shape)."""

    ledgerq_tx: SqliteTx | None = None


def _tx(conn: sqlite3.Connection) -> SqliteTx:
    tx = getattr(conn, "ledgerq_tx", None)
    if tx is None:
        tx = SqliteTx(conn)
        if isinstance(conn, _Connection):
            conn.ledgerq_tx = tx
    return tx


def _run_group(conn: sqlite3.Connection, *, units: list[Unit], wait: bool,
               savepoints: bool = False, deferred: bool = False
               ) -> list[tuple[bool, Any]] | None:
    """Run ``units`` in one transaction; each one's outcome.

    Units rarely raise, so they first run together, with no savepoint around each; when
    one raises, the transaction is rolled back and the group runs again with every unit
    in its own savepoint (``savepoints``), so that unit is rolled back alone and the
    others commit. Units are plain functions of their transaction, and may run more than
    once before the commit that keeps their writes (as on PostgreSQL after a lost connection).

    ``wait=False`` (an inline group on a connection that does not wait for locks): None,
    with nothing written, when another process holds the write lock, so the caller can
    run the group again where waiting blocks nobody. ``deferred`` (only with
    ``wait=False``): begin without the lock, which the first write then takes; None, too,
    when that write finds it held or another process wrote since the group's first read.
    """
    tx = _tx(conn)
    assert not (deferred and wait), "a deferred group would fail, not wait, at its first write"
    try:
        conn.execute("BEGIN" if deferred else "BEGIN IMMEDIATE")
    except sqlite3.OperationalError as exc:
        if not wait and _busy(exc):
            return None
        raise
    outcomes: list[tuple[bool, Any]] = []
    try:
        if not savepoints:
            try:
                outcomes = [(True, unit(tx)) for unit in units]
            except Exception as exc:
                if conn.in_transaction:  # some errors (a full disk) end it themselves
                    conn.execute("ROLLBACK")
                if not wait and _busy(exc):
                    return None
                if len(units) == 1:  # rolling back the transaction rolled back just it
                    return [(False, exc)]
                return _run_group(conn, units=units, wait=wait, savepoints=True,
                                  deferred=deferred)
        else:
            for unit in units:
                conn.execute("SAVEPOINT unit")
                try:
                    value = unit(tx)
                except Exception as exc:
                    conn.execute("ROLLBACK TO unit")
                    conn.execute("RELEASE unit")
                    if not wait and _busy(exc):
                        conn.execute("ROLLBACK")
                        return None
                    outcomes.append((False, exc))
                else:
                    conn.execute("RELEASE unit")
                    outcomes.append((True, value))
        conn.execute("COMMIT")
    except BaseException as exc:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if not wait and isinstance(exc, sqlite3.OperationalError) and _busy(exc):
            return None
        raise
    return outcomes


def _busy(exc: BaseException) -> bool:
    """SQLITE_BUSY (any extended code): a lock another connection holds."""
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, sqlite3.Error) and code is not None and code & 0xFF == 5
