"""PostgreSQL behind StateDB: a psycopg 3 connection pool, one thread hop per unit.

Why synchronous psycopg in threads: a unit of work is plain code that calls the named
operations one after another (the engine, the queue's passes), the same code SQLite
runs in aiosqlite's thread. Each unit takes a pooled connection in a worker thread and
runs as one transaction: units of different tasks run in parallel on different
connections, and the database (row locks, ``SKIP LOCKED``, the version in every
compare-and-swap) keeps them apart. A call returns once its COMMIT has returned, so
an acknowledged terminal state is durable (``synchronous_commit`` as the server has it).

A unit its caller says is usually ``alone`` (one statement whose result it does not
read: a plain submit) is first built in the event loop's thread on a transaction with no
connection, and that one statement is sent on an asyncio connection (psycopg's
``AsyncConnection``, autocommit: a transaction of its own): no hop to a pool thread and
back, which costs more CPU than the statement (~140 us against ~65 on a VM). A unit that
asks a connection for anything else (a read, a second statement) stops there, having
sent nothing, and runs in a pool thread as any other.

Connections that die (``pg_terminate_backend``, a server restart) are discarded by the
pool; a unit that failed on one before it committed is run once more on a fresh
connection, since the server rolled it back. A failure during COMMIT is not retried
(its outcome is unknown): it raises DatabaseUnavailable, and the guards make whatever
the caller does next safe. Wake-ups use ``LISTEN`` on a dedicated connection (psycopg's
``notifies()`` holds its connection while it waits, so a shared one would stall).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import select
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
import psycopg.conninfo
import psycopg_pool
from psycopg.types.string import TextLoader

from ledgerq.errors import (
    DatabaseError,
    DatabaseUnavailable,
    IntegrityViolation,
    InvalidInput,
    SchemaMissing,
)
from ledgerq.lifecycle.evolution import Normal, Plan, StateMapping
from ledgerq.lifecycle.registry import Registry
from ledgerq.store.postgres.catalog import read_recorded
from ledgerq.store.postgres.schema import apply_specs, open_schema
from ledgerq.store.postgres.tx import QUERIES, PostgresTx, qmark_to_psycopg, stale_plan
from ledgerq.store.timeouts import BUSY_TIMEOUT_MS

log = logging.getLogger("ledgerq.postgres")
SNAPSHOT = psycopg.IsolationLevel.REPEATABLE_READ
T = TypeVar("T")

#: Connections per handle: a worker's concurrent claims, renewals and terminal writes.
POOL_SIZE = 8
#: Asyncio connections per handle for units sent alone, at most: single statements, each
#: over in one round trip, and concurrent submits share one already
#: (ledgerq.queue.submission.joined).
#: None is opened until a unit is first sent alone (a worker's handle sends none); one
#: is then kept for the next (see _send_alone). While this many are in flight, the next
#: unit goes to a pool thread, as every unit did.
ALONE_POOL_SIZE = 2
CONNECT_TIMEOUT = 10.0
#: Tries of a unit whose connection died before it committed, or that the server
#: rolled back to break a deadlock (or a serialization failure).
ATTEMPTS = 3
#: SQLSTATEs of a transaction the server rolled back whole, so that it may run again:
#: ``serialization_failure`` and ``deadlock_detected`` (a migration's DDL beside writers).
ROLLED_BACK = frozenset({"40001", "40P01"})
#: Units of one group commit (write_together), at most.
MAX_GROUP = 64
#: The listener's reconnect backoff, from first to longest wait (seconds).
LISTEN_BACKOFF = (0.1, 5.0)
#: NOTIFY channel -> the channel name callers listen to.
CHANNELS = {"ledgerq_claimable": "claimable", "ledgerq_ended": "ended"}


def url_connect_timeout(url: str) -> float:
    """The URL's ``connect_timeout`` (seconds, libpq's option), else :data:`CONNECT_TIMEOUT`;
    InvalidInput for a URL libpq cannot parse or a timeout that is not a positive number.
    A URL with no database, host or user at all (``postgresql://``) is refused too: libpq
    would connect to its defaults, a database the caller never named."""
    try:
        parts = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError as exc:
        raise InvalidInput(f"not a PostgreSQL URL libpq can read: {exc}") from None
    if not any(parts.get(k) for k in ("dbname", "host", "hostaddr", "user", "service")):
        raise InvalidInput(f"{url!r} names no database, host or user; give "
                           "postgresql://user@host:port/dbname")
    raw = parts.get("connect_timeout")
    if raw is None:
        return CONNECT_TIMEOUT
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise InvalidInput(f"connect_timeout must be a positive number of seconds, "
                           f"not {raw!r}")
    return seconds


#: libpq's TCP keepalive options, where the URL gives none: a connection to a server that
#: is gone (a partition, a host that died) fails within ~25 s of silence instead of the
#: kernel's two hours.
KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
              "keepalives_count": 3}


def _keepalives(url: str, user_timeout_ms: int) -> dict[str, Any]:
    """The TCP options for ``url``'s connections that its URL does not set: keepalives,
    and ``tcp_user_timeout`` (how long sent data may go unacknowledged before the
    connection fails: a statement sent into a partition) as the lock timeout."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    wanted = {**KEEPALIVES, "tcp_user_timeout": user_timeout_ms}
    return {k: v for k, v in wanted.items() if k not in given}


def _libpq_seconds(seconds: float) -> int:
    """libpq takes whole seconds, and treats 0 as "wait forever": at least 1."""
    return max(1, math.ceil(seconds))


class PostgresBackend:
    """One PostgreSQL database (its current schema) behind a :class:`~ledgerq.StateDB`."""

    dialect = "postgresql"

    def __init__(self, url: str, *, registry: Registry, readonly: bool = False,
                 pool_size: int = POOL_SIZE, migrate_on_open: bool = True,
                 lock_timeout_ms: int = BUSY_TIMEOUT_MS, pooled: bool = False,
                 listen_url: str | None = None) -> None:
        self.migrate_on_open = migrate_on_open
        #: Where LISTEN connects: the server itself, when ``url`` goes through a pooler.
        self.listen_url = listen_url
        if listen_url is not None:
            url_connect_timeout(listen_url)  # (refused now, not by the listener's thread)
        #: Whether ``url`` goes through a pooler in transaction mode (PgBouncer's
        #: ``pool_mode = transaction``): each transaction may run on another server
        #: connection, so nothing is kept on one between transactions (see
        #: ``_connect_kwargs``). A ``listen_url`` says so too.
        self.pooled = pooled or listen_url is not None
        #: Whether the fallback to polling (pooled, no ``listen_url``) was logged yet.
        self._said_polling = False
        #: How long a statement waits for a lock (a row another writer holds, a table a
        #: migration or an operator locked) before it fails: SQLite's busy timeout, with
        #: the same meaning and default. Without it a wait behind a lock never ends. Also
        #: how long a session of this handle may sit idle in a transaction before the
        #: server ends it (a handle cut off mid-transaction), so that no lock of ours is
        #: held idle longer than another writer waits for it.
        self.lock_timeout_ms = int(lock_timeout_ms)
        self._timeouts = (f"{self.lock_timeout_ms}ms",) * 2
        self.url = url
        #: The URL's own ``connect_timeout`` (libpq's option) where it gives one, else ours.
        self.connect_timeout = url_connect_timeout(url)
        self.registry = registry
        self.readonly = readonly
        self.pool_size = pool_size
        #: Connections for units sent alone, at most: never more than the pool's, so a
        #: handle of ``pool_size`` 1 holds at most two connections (LISTEN aside).
        self.alone_size = min(ALONE_POOL_SIZE, pool_size)
        #: psycopg's options of every connection: behind a transaction pooler, no
        #: prepared statements (a statement prepared on one server connection is unknown
        #: to the next; PgBouncer before 1.21 does not track them).
        self._connect_kwargs: dict[str, Any] = {
            **({"prepare_threshold": None} if self.pooled else {}),
            **_keepalives(url, self.lock_timeout_ms)}
        self.damaged: str | None = None
        #: What opening migrated (None: the database was already at these specs).
        self.migration: Plan | None = None
        #: The specs the database records, as of opening (or the last migrate).
        self.recorded: dict[str, Normal] = {}
        self._pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[Any, ...]]] | None = None
        #: The asyncio connections units sent alone use (none on a read-only handle).
        self._alone_pool: psycopg_pool.AsyncConnectionPool[
            psycopg.AsyncConnection[tuple[Any, ...]]] | None = None
        #: Units being sent alone now (at most ``alone_size``).
        self._alone_sending = 0
        #: The alone pool's connection kept out of it between units sent alone, with the
        #: cursor that sends them, and when it was taken (see :meth:`_send_alone`).
        self._kept: psycopg.AsyncConnection[tuple[Any, ...]] | None = None
        self._kept_cursor: psycopg.AsyncCursor[tuple[Any, ...]] | None = None
        self._kept_since = 0.0
        self._executor: ThreadPoolExecutor | None = None
        #: Channel ("claimable", "ended") -> the callbacks its notifications call.
        self._wakers: dict[str, list[Callable[[], None]]] = {}
        self._listen_thread: threading.Thread | None = None
        self._listen_stop = threading.Event()
        self._closing = False
        #: write_together's units waiting for the next group, and the task running them.
        self._together: list[tuple[Callable[[PostgresTx], Any], asyncio.Future[Any]]] = []
        self._together_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ lifecycle

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    def _configure(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        # JSON columns come back as their JSON text on both backends (callers decode
        # with ledgerq.codec.loads), so a fold of the log compares text with text.
        conn.adapters.register_loader("jsonb", TextLoader)
        conn.adapters.register_loader("json", TextLoader)
        conn.read_only = self.readonly
        if not self.pooled:  # (pooled: set in each transaction, see _in_transaction)
            conn.execute(QUERIES("set_timeouts"), self._timeouts)
            conn.commit()

    async def _configure_alone(self, conn: psycopg.AsyncConnection[tuple[Any, ...]]) -> None:
        await conn.execute(QUERIES("set_timeouts"), self._timeouts)

    async def open(self) -> None:
        if self._pool is not None:
            return
        pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[Any, ...]]] = \
            psycopg_pool.ConnectionPool(self.url, open=False, min_size=1,
                                        max_size=self.pool_size, configure=self._configure,
                                        kwargs=self._connect_kwargs,
                                        timeout=self.connect_timeout, name="ledgerq")
        executor = ThreadPoolExecutor(max_workers=self.pool_size,
                                      thread_name_prefix="ledgerq-pg")
        loop = asyncio.get_running_loop()
        alone: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[tuple[Any, ...]]] | \
            None = None
        try:
            await loop.run_in_executor(executor, self._open_sync, pool)
            # Units sent alone run in autocommit, where a pooled connection could not
            # have its lock timeout: behind a pooler every unit is a transaction.
            if not self.readonly and not self.pooled:
                alone = psycopg_pool.AsyncConnectionPool(
                    self.url, open=False, min_size=0, max_size=self.alone_size,
                    kwargs={"autocommit": True, **self._connect_kwargs},
                    timeout=self.connect_timeout,
                    configure=self._configure_alone, name="ledgerq-alone")
                await alone.open()  # (it connects when a unit is first sent alone)
        except BaseException:
            if alone is not None:
                await alone.close()
            await loop.run_in_executor(executor, pool.close)
            executor.shutdown(wait=False)
            raise
        self._pool, self._executor, self._alone_pool = pool, executor, alone

    def _open_sync(self, pool: psycopg_pool.ConnectionPool[Any]) -> None:
        # One direct connection first: a server that is not there fails at once with
        # libpq's own reason (the pool would retry quietly until its timeout), and the
        # schema is checked or created on it before any pooled connection exists.
        try:
            with psycopg.connect(self.url, connect_timeout=_libpq_seconds(self.connect_timeout),
                                 **self._connect_kwargs) as conn:
                if not self.readonly and _in_recovery(conn):
                    raise DatabaseError(
                        f"{_redacted(self.url)} is a read replica (a standby in recovery): "
                        "it takes no writes; open it with readonly=True to read (the "
                        "command line's read commands do), and write to the primary")
                self._configure(conn)
                if self.readonly or not self.migrate_on_open:
                    self._require_schema(conn)
                else:
                    self._create_schema(conn)
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailable(f"{_redacted(self.url)}: {exc}".strip()) from exc
        except psycopg.Error as exc:
            raise _translate(exc) from exc
        try:
            pool.open(wait=True, timeout=self.connect_timeout)
        except psycopg_pool.PoolTimeout as exc:
            raise DatabaseUnavailable(f"{_redacted(self.url)}: {exc}") from exc

    def _create_schema(self, conn: psycopg.Connection[Any]) -> None:
        self.migration = open_schema(conn, self.registry)
        self.recorded = read_recorded(conn)
        conn.rollback()

    async def migrate(self, mappings: Sequence[StateMapping], *, dry_run: bool) -> Plan:
        """``ledgerq migrate``, on one pooled connection behind the schema lock."""
        def unit() -> Plan:
            assert self._pool is not None
            try:
                with self._pool.connection() as conn:
                    conn.isolation_level = None
                    conn.read_only = False
                    plan = apply_specs(conn, self.registry, mappings, dry_run=dry_run)
                    self.recorded = read_recorded(conn)
                    conn.rollback()
                    return plan
            except psycopg.Error as exc:
                raise _translate(exc) from exc

        return await self._submit(unit)

    def _require_schema(self, conn: psycopg.Connection[Any]) -> None:
        # Without a migration at open (``ledgerq migrate``), the log is what must exist:
        # the specs' new entities are the migration's to create.
        # A read-only open needs no more: an entity's table the specs declare and the
        # database lacks was added by newer specs no writer has migrated it to yet, and
        # reads of the other entities go on.
        wanted = ["status_transitions"]
        have = {r[0] for r in conn.execute(QUERIES("tables_present"), (wanted,))}
        self.recorded = read_recorded(conn)
        conn.rollback()
        missing = [t for t in wanted if t not in have]
        if missing:
            raise SchemaMissing(
                f"{_redacted(self.url)} has no ledgerq schema (missing table(s) "
                f"{', '.join(missing)}); a read-only open never creates one: open it for "
                "writing first")

    async def close(self) -> None:
        if self._pool is None or self._closing:
            return
        self._closing = True
        try:
            self._stop_listener()
            pool, executor = self._pool, self._executor
            assert executor is not None
            # Units already running finish (and commit) first: shutdown waits for them.
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)
            alone, self._alone_pool = self._alone_pool, None
            if alone is not None:
                kept, self._kept, self._kept_cursor = self._kept, None, None
                if kept is not None:
                    await alone.putconn(kept)
                await alone.close()
            self._pool = self._executor = None
            await asyncio.get_running_loop().run_in_executor(None, pool.close)
        finally:
            self._closing = False

    # ------------------------------------------------------------ units

    async def _submit(self, fn: Callable[[], T]) -> T:
        if self._pool is None or self._executor is None:
            raise RuntimeError("StateDB is not open; use 'async with StateDB(url)' or open()")
        if self._closing:
            raise RuntimeError("StateDB is closing; no new work is accepted")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _in_transaction(self, fn: Callable[[PostgresTx], T], *, readonly: bool,
                        alone: bool = False) -> T:
        """``fn`` in one transaction on a pooled connection. ``alone``: a unit whose only
        statement nobody reads the result of runs it as a transaction of its own."""
        pool = self._pool
        assert pool is not None
        for attempt in range(1, ATTEMPTS + 1):
            committing = False
            try:
                with pool.connection() as conn:
                    tx = PostgresTx(conn, hold_first=alone and not self.pooled)
                    # Sent with the BEGIN psycopg issues before the first statement: a
                    # read is one snapshot, and costs no round trip of its own to say so.
                    conn.isolation_level = SNAPSHOT if readonly else None
                    conn.read_only = readonly or self.readonly
                    if self.pooled:  # for this transaction: the next may be elsewhere
                        conn.execute(QUERIES("set_local_timeouts"), self._timeouts)
                    try:
                        value = fn(tx)
                        held = tx.take_alone()
                        if held is not None:
                            if _received_nothing(conn):
                                committing = True
                                tx.run_alone(*held)
                                return value
                            # The server may have closed this connection (a restart, a
                            # terminated backend): send it in a transaction, which a lost
                            # connection fails before COMMIT, so it runs again below.
                            tx.execute(*held)
                    except psycopg.Error as exc:
                        if not stale_plan(exc) or attempt == ATTEMPTS:
                            raise
                        conn.rollback()
                        # Forget every prepared statement, here and in psycopg's cache
                        # (it clears its own on DEALLOCATE ALL), then run the unit again.
                        conn.execute(QUERIES("forget_prepared"))
                        conn.commit()
                        log.info("a table changed under prepared statements (a migration"
                                 " by another process); running the unit again")
                        continue
                    committing = True
                    conn.commit()
                    return value
            except psycopg.OperationalError as exc:
                # Chosen to break a deadlock, or died before COMMIT was sent: the server
                # rolled the unit back, so it can run again (on a fresh connection). Lost
                # during COMMIT: the outcome is unknown, raise.
                if attempt == ATTEMPTS:
                    raise _translate(exc) from exc
                if exc.sqlstate in ROLLED_BACK:  # said by the server: nothing committed
                    log.warning("the server rolled the unit back (%s); running it again",
                                str(exc).splitlines()[0])
                    time.sleep(0.05 * attempt)
                    continue
                if committing or not _connection_lost(exc):
                    raise _translate(exc) from exc
                log.warning("connection lost (%s); running the unit again", exc)
                # Its idle siblings likely died with it (a restart, a mass terminate):
                # have the pool test them now rather than hand them out one by one.
                with contextlib.suppress(Exception):
                    pool.check()
                time.sleep(0.05 * attempt)
            except psycopg.Error as exc:
                raise _translate(exc) from exc
            except psycopg_pool.PoolTimeout as exc:
                raise DatabaseUnavailable(f"{_redacted(self.url)}: {exc}") from exc
        raise AssertionError("unreachable")

    async def write(self, fn: Callable[[PostgresTx], T], *, bulk: bool = False,
                    reads_first: bool = False, alone: bool = False) -> T:
        """A unit runs in a pool thread here, ``bulk`` or not, unless it is ``alone`` and
        turns out to be one statement whose result it does not read (see the module's
        note); every one takes its locks as it writes (a BEGIN takes none),
        ``reads_first`` or not."""
        if self.readonly:
            raise DatabaseError(f"{_redacted(self.url)} is open read-only (readonly=True): "
                                "writes refused")
        if alone and not bulk and self._alone_pool is not None and not self._closing \
                and self._alone_sending < self.alone_size:
            tx = PostgresTx(_NO_CONNECTION, hold_first=True)
            try:
                value = fn(tx)
            except _NeedsConnection:
                pass  # (it sent nothing: it runs again on a connection, below)
            else:
                held = tx.take_alone()
                if held is None:
                    return value  # it wrote nothing
                # Shielded: a caller cancelled meanwhile leaves the statement to finish,
                # as a unit in a pool thread would.
                sending = asyncio.ensure_future(
                    _settled(self._send_alone(self._alone_pool, *held)))
                self._alone_sending += 1
                sending.add_done_callback(self._sent_alone)
                sent = await asyncio.shield(sending)
                if isinstance(sent, Exception):
                    raise sent
                if sent:
                    return value
        return await self._submit(lambda: self._in_transaction(fn, readonly=False, alone=True))

    async def _send_alone(self, pool: psycopg_pool.AsyncConnectionPool[Any], sql: str,
                          params: Sequence[Any]) -> bool:
        """One statement as a transaction of its own on an asyncio connection; False,
        having committed nothing, when it must run in a pool thread instead (on a
        connection the server closed, after a stale plan, or rolled back by the server).
        A failure while it runs is one of COMMIT's: its outcome is unknown, it raises.

        The connection that sent the last one is kept out of the pool for the next, with
        its cursor (a checkout and return cost ~30 us of CPU, a new cursor ~15, of a
        plain submit's ~210); it goes back after any failure, and after the pool's
        ``max_lifetime``, so the pool still replaces a broken or old one. A send while
        it is in use takes one from the pool.
        """
        conn, cur = self._kept, self._kept_cursor
        self._kept = self._kept_cursor = None
        try:
            if conn is None or cur is None:
                conn = await pool.getconn()
                cur = conn.cursor()
                self._kept_since = time.monotonic()
        except psycopg_pool.PoolTimeout as exc:
            raise DatabaseUnavailable(f"{_redacted(self.url)}: {exc}") from exc
        keep = False
        try:  # the connection is kept or goes back to the pool once, however this ends
            if not _received_nothing(conn):
                await conn.close()  # (the pool replaces a closed connection)
                return False
            try:
                await cur.execute(sql, params or None)
            except psycopg.Error as exc:
                if stale_plan(exc):
                    await conn.execute(QUERIES("forget_prepared"))
                    return False
                if isinstance(exc, psycopg.OperationalError) and exc.sqlstate in ROLLED_BACK:
                    return False
                raise _translate(exc) from exc
            keep = self._kept is None and self._alone_pool is pool \
                and time.monotonic() - self._kept_since < pool.max_lifetime
            return True
        finally:
            if keep:
                self._kept, self._kept_cursor = conn, cur
            else:
                await pool.putconn(conn)

    def _sent_alone(self, _: asyncio.Future[Any]) -> None:
        self._alone_sending -= 1

    async def write_together(self, fn: Callable[[PostgresTx], T]) -> T:
        """:meth:`write`, sharing one transaction with the units that arrive while a group
        is in flight (group commit: one BEGIN, one COMMIT and one thread hop for all).

        Each unit still runs its own statements (its guarded moves, each with its fact);
        every caller's result is handed back only after the group's COMMIT returned. A
        unit that raises rolls the group back; the group's units then run again, each
        in its own transaction, so the others commit and it raises alone, as with
        :meth:`write`. A failure of the COMMIT itself (outcome unknown) is every unit's.
        """
        if self.readonly or self._pool is None or self._closing:
            return await self.write(fn)  # refused as write refuses it
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._together.append((fn, fut))
        if self._together_task is None:
            self._together_task = asyncio.get_running_loop().create_task(
                self._run_together())
        return await fut

    async def _run_together(self) -> None:
        try:
            while self._together:
                batch = self._together[:MAX_GROUP]
                del self._together[:MAX_GROUP]
                if len(batch) == 1:
                    await self._alone(*batch[0])
                else:
                    await self._group(batch)
        finally:
            self._together_task = None

    async def _group(self, batch: list[tuple[Callable[[PostgresTx], Any], asyncio.Future[Any]]]
                     ) -> None:
        units = [fn for fn, _ in batch]
        ran_all = False

        def group(tx: PostgresTx) -> list[Any]:
            nonlocal ran_all
            ran_all = False  # a rerun after a lost connection starts over
            values = [unit(tx) for unit in units]
            ran_all = True
            return values

        try:
            values = await self._submit(lambda: self._in_transaction(group, readonly=False))
        except Exception as exc:
            if not ran_all:
                # One unit raised and rolled the group back: each alone, at once.
                await asyncio.gather(*(self._alone(fn, fut) for fn, fut in batch))
                return
            # Every unit ran; the COMMIT failed (its outcome unknown): every unit's.
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            return
        except BaseException as exc:
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            raise
        for (_, fut), value in zip(batch, values, strict=True):
            if not fut.done():
                fut.set_result(value)

    async def _alone(self, fn: Callable[[PostgresTx], Any], fut: asyncio.Future[Any]) -> None:
        try:
            value = await self.write(fn)
        except Exception as exc:
            if not fut.done():
                fut.set_exception(exc)
        else:
            if not fut.done():
                fut.set_result(value)

    async def read(self, fn: Callable[[PostgresTx], T]) -> T:
        return await self._submit(lambda: self._in_transaction(fn, readonly=True))

    async def fetch_one(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> dict[str, Any] | None:
        rows = await self.fetch_all(sql, params)
        return rows[0] if rows else None

    async def fetch_all(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()
                        ) -> list[dict[str, Any]]:
        text, args = _paramstyle(sql, params)

        def rows(tx: PostgresTx) -> list[dict[str, Any]]:
            return tx.dicts(tx.conn.execute(text, args))

        return await self._submit(lambda: self._in_transaction(rows, readonly=True))

    async def check_integrity(self) -> list[str]:
        """PostgreSQL checks its own pages (checksums, WAL): nothing for ledgerq to scan."""
        return []

    async def replica_as_of(self) -> float | None:
        """The time a standby's reads are as of; None on a primary."""
        def as_of(tx: PostgresTx) -> float | None:
            value = tx.execute(QUERIES("replica_as_of")).fetchone()[0]
            return None if value is None else float(value)

        return await self._submit(lambda: self._in_transaction(as_of, readonly=True))

    async def durability(self) -> str:
        def show(tx: PostgresTx) -> str:
            return f"synchronous_commit {tx.execute(QUERIES('durability')).fetchone()[0]}"

        return await self._submit(lambda: self._in_transaction(show, readonly=True))

    # ------------------------------------------------------------ wake-ups

    async def listen(self, key: str, on_wake: Callable[[], None],
                     channel: str = "claimable") -> None:
        self._wakers.setdefault(channel, []).append(on_wake)
        if self.pooled and self.listen_url is None:
            # A LISTEN through a transaction pooler holds no server connection: its
            # notifications would go to whichever client has that connection next.
            if not self._said_polling:
                self._said_polling = True
                log.warning("%s goes through a pooler and no listen_url names the server "
                            "itself: no LISTEN, waits poll instead", _redacted(self.url))
            return
        if self._listen_thread is None:
            self._listen_stop.clear()
            self._listen_thread = threading.Thread(
                target=self._listen_loop, name="ledgerq-pg-listen", daemon=True)
            self._listen_thread.start()

    async def unlisten(self, on_wake: Callable[[], None] | None = None,
                       channel: str = "claimable") -> None:
        wakers = self._wakers.get(channel, [])
        if on_wake is not None and on_wake in wakers:
            wakers.remove(on_wake)
        elif wakers:
            wakers.pop()
        if not any(self._wakers.values()):
            await asyncio.get_running_loop().run_in_executor(None, self._stop_listener)

    def _wake(self, channel: str | None) -> None:
        """Call the callbacks of ``channel`` (None: of every channel)."""
        for name, wakers in list(self._wakers.items()):
            if channel is None or name == channel:
                for wake in list(wakers):
                    wake()

    def _stop_listener(self) -> None:
        thread, self._listen_thread = self._listen_thread, None
        if thread is not None:
            self._listen_stop.set()
            thread.join(timeout=5)

    def _listen_loop(self) -> None:
        """LISTEN on a connection of its own; reconnect with backoff when it dies, and
        wake every channel once after each reconnect (a notification may have been
        missed)."""
        delay = LISTEN_BACKOFF[0]
        while not self._listen_stop.is_set():
            try:
                with psycopg.connect(self.listen_url or self.url, autocommit=True,
                                     **_keepalives(self.listen_url or self.url,
                                                   self.lock_timeout_ms),
                                     connect_timeout=_libpq_seconds(self.connect_timeout)) as conn:
                    conn.execute(QUERIES("listen"))
                    conn.execute(QUERIES("listen_ended"))
                    delay = LISTEN_BACKOFF[0]
                    self._wake(None)
                    while not self._listen_stop.is_set():
                        for note in conn.notifies(timeout=0.5, stop_after=64):
                            self._wake(CHANNELS.get(note.channel))
            except psycopg.Error as exc:
                if self._listen_stop.is_set():
                    return
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
                self._listen_stop.wait(delay)
                delay = min(delay * 2, LISTEN_BACKOFF[1])


class _NeedsConnection(BaseException):
    """A unit tried in the loop's thread asked for a connection. A BaseException, so that
    no ``except Exception`` in a unit takes it for the unit's own failure."""


class _NoConnection:
    """The connection of a unit's try in the loop's thread: it has none."""

    def __getattr__(self, name: str) -> Any:
        raise _NeedsConnection(name)


_NO_CONNECTION = _NoConnection()


async def _settled(aw: Awaitable[T]) -> T | Exception:
    """``aw``'s value, or the exception it raised as a value: a shielded task whose caller
    was cancelled must not end with an exception nobody retrieves (and a done callback to
    retrieve it would still be waiting in the loop when the caller resumes)."""
    try:
        return await aw
    except Exception as exc:
        return exc


def _in_recovery(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server is a standby (it takes no writes)."""
    row = conn.execute(QUERIES("in_recovery")).fetchone()
    conn.rollback()
    return bool(row and row[0])


def _received_nothing(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether the idle connection has nothing to read. A server that closed it (a
    restart, ``pg_terminate_backend``) has sent its goodbye, or at least the socket's end:
    a statement sent on it would fail with an outcome nobody can tell, so it goes the
    way that can be retried. (Anything else to read, a notice say, is as good a reason.)"""
    try:
        fd = conn.pgconn.socket
    except psycopg.OperationalError:
        return False
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
    return not poller.poll(0)


def _connection_lost(exc: psycopg.OperationalError) -> bool:
    """A dead connection or a server going away, not (say) a lock timeout."""
    return isinstance(exc, psycopg.errors.AdminShutdown | psycopg.errors.CannotConnectNow) \
        or exc.sqlstate is None or exc.sqlstate.startswith("08")


def _translate(exc: psycopg.Error) -> DatabaseError:
    """A driver error as the ledgerq error it means (the driver's stays the __cause__)."""
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, psycopg.IntegrityError):
        return IntegrityViolation(text)
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(text)
    return DatabaseError(text)


def _paramstyle(sql: str, params: Sequence[Any] | dict[str, Any]
                ) -> tuple[str, Sequence[Any] | dict[str, Any] | None]:
    """psycopg's style, also from SQLite's ``?``; no parameters: ``%`` is plain text."""
    if not params:
        return sql, None
    if isinstance(params, dict):
        return _NAMED.sub(lambda m: m.group(1) or f"%({m.group(2)})s", sql), params
    return qmark_to_psycopg(sql), params


_NAMED = re.compile(r"('(?:[^']|'')*')|(?<!:):([A-Za-z_][A-Za-z0-9_]*)")


def _redacted(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"(://[^:/@]+):[^@]*@", r"\1:***@", url)
