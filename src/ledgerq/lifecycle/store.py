"""The engine's event store: the operations ``lifecycle`` and ``projections`` run, named once.

Every database operation ledgerq performs is a named method of a transaction; each
dialect under ``ledgerq.store`` (``sqlite/``, ``postgres/``) implements all of them with
its own SQL, kept by name in its ``*.sql`` files. The model is River's driver interface
(one method per operation, every driver implementing every method, one contract suite:
``tests/store/test_store_contract.py``) with eventsourcing's split by owner: this module
declares what the engine needs (:class:`EventStore`); the queue's wings declare theirs
beside their code (``ledgerq.queue.store``, ``ledgerq.queue.<wing>.store``), each a
protocol extending this one, and the store's transaction class matches them all by
structure, never importing them.

Why a leaf module: ``lifecycle``, ``projections`` and ``queue`` import this and never
``ledgerq.store``, so the dependency runs one way (the store renders DDL from the
registry; the registry knows nothing of the store).

A transaction is one unit's view. Write units (``db.write(unit)``) receive one inside a
write transaction; read units (``db.read(unit)``) inside a read-only snapshot.
Operations take the :class:`EntityPolicy` whose table they touch, never a table name
spelled in code. Rows come back as dicts keyed by column name; JSON columns hold their
JSON text (decode with :func:`ledgerq.codec.loads`), on both backends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

if TYPE_CHECKING:
    from ledgerq.lifecycle.facts import Fact
    from ledgerq.lifecycle.registry import EntityPolicy, Registry

T = TypeVar("T")
#: The transaction a :class:`Database` hands its units (covariant: a handle whose units
#: get a transaction with more operations serves a caller that needs fewer).
TxT = TypeVar("TxT", covariant=True)
Row = dict[str, Any]

#: The fact log's columns in the order :meth:`EventStore.append_facts` takes them (the
#: fields of :class:`~ledgerq.lifecycle.facts.Fact`).
FACT_COLUMNS = (
    "id", "entity_type", "entity_id", "previous_status", "status", "reason_code",
    "reason_summary", "evidence_refs", "source", "actor", "created_at", "metadata",
    "entity_version", "patch", "idempotency_key",
)


class SentMove(NamedTuple):
    """One move for :meth:`EventStore.update_entities_with_facts`:
    :meth:`EventStore.update_entity`'s terms and the fact to append where it matches."""

    entity_id: str
    observed: str
    version: int | None
    to_state: str | None
    changes: Row
    guards: Row
    skip_locked: bool
    fact: Fact


class ClaimFacts(NamedTuple):
    """The facts of claims written with them (:meth:`EventStore.claim_entities_with_facts`).

    Each claimed row's fact is ``fields`` (its id, entity id, version and patch left to
    fill) with the next of ``ids``, the row's id and new version, and as its patch
    ``common`` (what every row's patch holds alike) with the row's stored values of the
    ``stored`` columns (JSON columns as their text).
    ``exact``: the database gives back every ``stored`` column as its exact JSON, so a
    dialect may build the patches in the claims' own statement; otherwise they are built
    from the rows as returned.
    """

    ids: Sequence[str]
    fields: Fact
    common: Row
    stored: tuple[str, ...]
    exact: bool = False


class EventStore(Protocol):
    """The engine's operations on one transaction: moves, claims, creation, the log, and
    what verify and rebuild read and write (see the module docstring)."""

    @property
    def stores_as_sent(self) -> bool:
        """Whether a non-JSON column stores exactly the value sent (PostgreSQL: typed
        columns; not SQLite, whose type affinity may convert it): a move's fact can then be
        written from the values sent, in the swap's own statement
        (:meth:`update_entities_with_facts`)."""
        ...

    @property
    def binds_json_numbers(self) -> bool:
        """Whether a JSON column's number is sent as a number rather than as JSON text
        (SQLite: its JSON columns' numeric affinity would convert the text, keeping only
        about fifteen significant digits; a number bound as one is stored exactly)."""
        ...

    @property
    def exact_types(self) -> Mapping[str, type]:
        """Per logical column type, the one Python type whose values the dialect's column
        stores exactly (reads back equal, of the same type; a JSON column's text, if it
        begins as an object, array or string does); a type absent converts them."""
        ...

    # ------------------------------------------------------------ moves, claims, creation

    def read_for_move(self, policy: EntityPolicy, entity_id: str,
                      guard_cols: tuple[str, ...], *, skip_locked: bool = False
                      ) -> tuple[Any, ...] | None:
        """(status, version, *guard values) of one row, or None when it does not exist.

        Where writers run at once the row stays locked until the transaction ends;
        ``skip_locked`` returns None at once instead of waiting for another's lock (a
        claimant skips a row another claimant is taking)."""

    def update_entity(self, policy: EntityPolicy, entity_id: str, *, observed: str,
                      version: int | None, to_state: str | None, changes: dict[str, Any],
                      guards: dict[str, Any], returning: tuple[str, ...] | None,
                      skip_locked: bool = False) -> Row | None:
        """The compare-and-swap: set ``changes`` (and ``status``/``version``) where the row
        still has ``observed``, ``version`` and every guard value (NULL-safe equality).

        ``version`` None: the row was not read first; the swap holds whatever version the
        row has and increments it (ask for ``version`` in ``returning``), and with
        ``skip_locked`` a row another transaction holds matches nothing at once.
        ``to_state`` None leaves status as it is (a same-state move). Returns the
        ``returning`` columns as stored (``None``: the whole row), or None when no row
        matched (a conflict).
        """

    def prepare_swap(self, policy: EntityPolicy, *, same_state: bool,
                     change_cols: tuple[str, ...], guard_cols: tuple[str, ...], read: bool,
                     skip_locked: bool, returning: tuple[str, ...] | None) -> Any:
        """:meth:`update_entity`'s statement for one shape of move, made once and run by
        :meth:`swap` with each move's values: the engine keeps it per shape, so a hot move
        neither rebuilds nor looks up its text. ``read``: the caller read the row's
        version first (the swap requires it); ``same_state``: ``to_state`` will be None."""

    def swap(self, statement: Any, entity_id: str, observed: str, version: int | None,
             to_state: str | None, changes: Iterable[Any], guards: Iterable[Any]
             ) -> Row | None:
        """:meth:`update_entity` through a :meth:`prepare_swap`: ``changes`` and
        ``guards`` are the values of its ``change_cols`` and ``guard_cols``, in order."""

    def update_entities_with_facts(self, policy: EntityPolicy, moves: Sequence[SentMove]
                                   ) -> list[int | None]:
        """Each move's :meth:`update_entity` and, only where it matched, its fact (a row of
        :meth:`append_facts` whose ``entity_version`` is filled with the row's new
        version), in order: each one's new version, or None on a conflict
        (nothing of it written). Each move is its own statement or two; where the dialect
        can, they go to the database together (one round trip for all).

        The caller writes each fact from the values it sends, so it uses this only where
        they are what the row stores (:attr:`stores_as_sent`, no JSON column among them).
        """

    def claim_entities(self, policy: EntityPolicy, rows: Sequence[tuple[str, Row, Row]], *,
                       observed: str, to_state: str, changes: Row, limit: int) -> list[Row]:
        """Claimants' compare-and-swaps of several rows, in the given order, until ``limit``
        matched: each ``(id, guards, patch)`` row moves from ``observed`` to ``to_state``
        with ``changes`` and its own ``patch`` set and its version incremented, only where
        it still has ``observed`` and every one of its guard values (NULL-safe equality);
        a row another transaction holds is skipped at once (as ``update_entity`` with
        ``skip_locked``). Every row gives the same guard and patch columns, none of them
        JSON. Returns the whole rows as stored, in the given order: the first ``limit``
        rows that matched (rows after the ``limit``-th match are not tried)."""

    def claim_entities_with_facts(self, policy: EntityPolicy,
                                  rows: Sequence[tuple[str, Row, Row]], *, observed: str,
                                  to_state: str, changes: Row, limit: int,
                                  facts: ClaimFacts) -> list[Row]:
        """:meth:`claim_entities`, and a fact for each row it claimed (``facts``), in the
        same transaction; where the dialect can, in the same statement. ``facts.ids``
        holds at least ``limit`` ids (or one a row, if fewer rows are given)."""

    def find_fact_by_idempotency_key(self, entity_type: str, entity_id: str,
                                     key: str) -> tuple[str, str | None, str] | None:
        """(fact id, previous_status, status) of the fact recorded under ``key``."""

    def append_facts(self, facts: Sequence[Sequence[Any]]) -> None:
        """Append facts to the log, each a row in :data:`FACT_COLUMNS` order."""

    def insert_entity(self, policy: EntityPolicy, row: dict[str, Any], *,
                      returning: tuple[str, ...] | None = None) -> Row:
        """Insert one projection row; returns it as stored (defaults included), or only
        its ``returning`` columns ({} for none: nothing is read back)."""

    def insert_entities_with_facts(self, policy: EntityPolicy, columns: tuple[str, ...],
                                   rows: Sequence[tuple[Sequence[Any], Fact]],
                                   stored: tuple[str, ...]) -> None:
        """Projection rows and their creation facts, each ``(values in columns' order,
        fact)`` with the fact a row of :meth:`append_facts` whose patch, a JSON object,
        also gets the row's stored value of each ``stored`` column (a JSON column's as
        its text, as :meth:`insert_entity` returns it).

        The caller writes the rest of each patch from the values it sends, so it uses
        this only where they are what the row stores (:attr:`stores_as_sent`).
        """

    def insert_entities(self, policy: EntityPolicy, columns: tuple[str, ...],
                        rows: Iterable[Sequence[Any]]) -> None:
        """Insert many projection rows that name the same columns."""

    def read_entities(self, policy: EntityPolicy, ids: Sequence[str], *,
                      columns: tuple[str, ...] | None = None) -> list[Row]:
        """Whole rows of the given ids (any order; missing ids are absent), or only their
        ``columns``."""

    def count_statuses(self, policy: EntityPolicy) -> dict[str, int]:
        """Rows per status (only statuses some row is in)."""

    def read_page_before(self, policy: EntityPolicy, filters: dict[str, list[Any]],
                         columns: tuple[str, ...], before: tuple[float, str] | None,
                         limit: int) -> list[Row]:
        """One keyset page newest first ((created_at, id) descending), strictly older than
        ``before`` (None: from the newest), where each column is in its list: a cursor
        page stays correct while rows are added, which an offset page does not."""

    def lock_key(self, key: str) -> None:
        """Serialize this transaction with every other that locks ``key`` until it ends
        (two moves under one idempotency key, two claims of one concurrency key: the
        second waits for the first); a no-op where one writer runs at a time."""

    def savepoint(self) -> AbstractContextManager[None]:
        """A nested scope: an exception inside rolls back its writes alone, then propagates."""

    def is_database_failure(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised inside this transaction, says the database or the
        connection failed (the whole unit must fail) rather than one row's move."""

    # ------------------------------------------------------------ the log, verify, rebuild

    def read_facts(self, entity_type: str, entity_id: str) -> list[Row]:
        """Every fact of one entity, in version order, JSON columns as text."""

    def read_facts_of(self, entity_type: str, ids: Sequence[str]) -> list[Row]:
        """Every fact of the given entities, in (entity_id, entity_version) order, JSON
        columns as text: one read for a set of rows (a scoped verify, a test's check)."""

    def stream_facts(self, entity_type: str) -> Iterator[tuple[str, str, int, Any]]:
        """(entity_id, status, entity_version, patch) of every fact of an entity type, in
        (entity_id, entity_version) order, streamed (never the whole log in memory)."""

    def stream_entities(self, policy: EntityPolicy) -> Iterator[Row]:
        """Every projection row, by id, streamed."""

    def defer_constraints(self) -> None:
        """Check foreign keys at commit rather than per statement, for this transaction."""

    def delete_entities(self, policy: EntityPolicy) -> None:
        """Delete every projection row of an entity (rebuild only)."""


class Database(Protocol[TxT]):
    """What the engine and the queue need of a handle (:class:`ledgerq.StateDB` is one).

    ``TxT`` is the transaction its units receive: the engine asks for a
    ``Database[EventStore]``, each wing of the queue for a ``Database`` of its own
    protocol (``Database[WorkerTx]``), and a handle whose transaction class implements
    them all (``StateDB``) is every one of them.
    """

    @property
    def registry(self) -> Registry: ...

    @property
    def path(self) -> str:
        """The target as given: a SQLite path, or a PostgreSQL URL (also the key under
        which a process wakes its own workers)."""
        ...

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        ...

    @property
    def file(self) -> str | None:
        """The SQLite file the handle opened (None for ``:memory:`` and PostgreSQL)."""
        ...

    @property
    def readonly(self) -> bool:
        """Whether the handle never writes."""
        ...

    @property
    def many_writers(self) -> bool:
        """Whether writers run at once (PostgreSQL), so that a claim pass must lock the
        rows it scans, or one at a time (SQLite), so that it need not."""
        ...

    async def write(self, fn: Callable[[TxT], T], *, bulk: bool = False,
                    reads_first: bool = False, alone: bool = False) -> T: ...

    async def write_together(self, fn: Callable[[TxT], T]) -> T: ...

    async def read(self, fn: Callable[[TxT], T]) -> T: ...

    def log_policies(self) -> list[EntityPolicy]:
        """The entities as the database records them (what verify and rebuild fold)."""
        ...

    @property
    def is_open(self) -> bool: ...

    async def open(self) -> Any: ...

    async def close(self) -> None: ...

    def twin(self) -> Database[TxT] | None:
        """Another handle on the same database for a thread of its own; None where none
        can reach it (an in-memory database)."""
        ...

    async def check_integrity(self) -> list[str]: ...

    async def listen(self, on_wake: Callable[[], None], channel: str = "claimable") -> None: ...

    async def unlisten(self, on_wake: Callable[[], None] | None = None,
                       channel: str = "claimable") -> None: ...

