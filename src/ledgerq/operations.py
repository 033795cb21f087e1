"""The store boundary: every database operation ledgerq performs, named once.

The engine, the queue, the projections and the command call these methods and nothing
else; each dialect under ``ledgerq.store`` (``sqlite/``, ``postgres/``) implements all of
them with its own SQL, kept by name in its ``queries.sql``. The model is River's driver
interface: one method per operation, every driver implementing every method, one
contract suite (``tests/test_store_contract.py``) exercising each driver.

Why a leaf module: ``lifecycle`` and ``queue`` import this and never ``ledgerq.store``,
so the dependency runs one way (the store renders DDL from the registry; the registry
knows nothing of the store).

A :class:`Tx` is one transaction's view. Write units (``db.write(unit)``) receive one
inside a write transaction; read units (``db.read(unit)``) inside a read-only snapshot.
Operations take the :class:`EntityPolicy` whose table they touch, never a table name
spelled in code. Rows come back as dicts keyed by column name; JSON columns hold their
JSON text (decode with :func:`ledgerq.codec.loads`), on both backends.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

if TYPE_CHECKING:
    from ledgerq.lifecycle.facts import Fact
    from ledgerq.lifecycle.registry import EntityPolicy, Registry

T = TypeVar("T")
Row = dict[str, Any]

#: The fact log's columns in the order :meth:`Tx.append_facts` takes them (the fields of
#: :class:`~ledgerq.lifecycle.facts.Fact`).
FACT_COLUMNS = (
    "id", "entity_type", "entity_id", "previous_status", "status", "reason_code",
    "reason_summary", "evidence_refs", "source", "actor", "created_at", "metadata",
    "entity_version", "patch", "idempotency_key",
)
#: The run spec's column group that makes a lease (``[column_groups] lease = [...]``).
LEASE_GROUP = "lease"
#: What a claim pass reads of a candidate.
CANDIDATE_COLUMNS = ("id", "queued_at", "required_capabilities", "execution_target",
                     "concurrency_key", "lease_attempts", "priority", "queue")
#: The claim order's columns (specs that predate them: every run is priority 0 in the
#: default queue).
PRIORITY_COLUMN = "priority"
QUEUE_COLUMN = "queue"
#: The queue a run waits in, and a worker serves, when none is named.
DEFAULT_QUEUE = "default"


def lease_columns(policy: EntityPolicy) -> tuple[str, ...]:
    """What a lease check reads of a run: its status and its lease, as the spec groups it."""
    return ("id", "status", *policy.column_group(LEASE_GROUP))


def expired_columns(policy: EntityPolicy) -> tuple[str, ...]:
    """What the reaper reads of an expired lease: the lease, and how often it expired."""
    return ("id", *policy.column_group(LEASE_GROUP), "lease_attempts")
#: The run column a fire of ledgerq's scheduler records its slot in (``schedule_run.toml``).
SLOT_COLUMN = "slot_at"
#: Kinds of stuck run :meth:`Tx.stuck_runs` finds.
STUCK_KINDS = ("undeclared", "lease", "retry", "waiting")


class SentMove(NamedTuple):
    """One move for :meth:`Tx.update_entities_with_facts`: :meth:`Tx.update_entity`'s terms
    and the fact to append where it matches."""

    entity_id: str
    observed: str
    version: int | None
    to_state: str | None
    changes: Row
    guards: Row
    skip_locked: bool
    fact: Fact


class ClaimFacts(NamedTuple):
    """The facts of claims written with them (:meth:`Tx.claim_entities_with_facts`).

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


class Tx(abc.ABC):
    """One transaction's named operations (see the module docstring)."""

    #: ``"sqlite"`` or ``"postgresql"``.
    dialect: str
    #: Whether a non-JSON column stores exactly the value sent (PostgreSQL: typed columns;
    #: not SQLite, whose type affinity may convert it): a move's fact can then be written
    #: from the values sent, in the swap's own statement (:meth:`update_entities_with_facts`).
    stores_as_sent: bool = False
    #: Per logical column type, the one Python type whose values the dialect's column
    #: stores exactly (reads back equal, of the same type; a JSON column's text, if it
    #: begins as an object, array or string does); a type absent converts them.
    exact_types: Mapping[str, type] = MappingProxyType({})

    # ------------------------------------------------------------ the engine

    @abc.abstractmethod
    def entity_for_move(self, policy: EntityPolicy, entity_id: str,
                        guard_cols: tuple[str, ...], *, skip_locked: bool = False
                        ) -> tuple[Any, ...] | None:
        """(status, version, *guard values) of one row, or None when it does not exist.

        Where writers run at once the row stays locked until the transaction ends;
        ``skip_locked`` returns None at once instead of waiting for another's lock (a
        claimant skips a row another claimant is taking)."""

    @abc.abstractmethod
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

    @abc.abstractmethod
    def swap_statement(self, policy: EntityPolicy, *, same_state: bool,
                       change_cols: tuple[str, ...], guard_cols: tuple[str, ...], read: bool,
                       skip_locked: bool, returning: tuple[str, ...] | None) -> Any:
        """:meth:`update_entity`'s statement for one shape of move, made once and run by
        :meth:`swap` with each move's values: the engine keeps it per shape, so a hot move
        neither rebuilds nor looks up its text. ``read``: the caller read the row's
        version first (the swap requires it); ``same_state``: ``to_state`` will be None."""

    @abc.abstractmethod
    def swap(self, statement: Any, entity_id: str, observed: str, version: int | None,
             to_state: str | None, changes: Iterable[Any], guards: Iterable[Any]
             ) -> Row | None:
        """:meth:`update_entity` through a :meth:`swap_statement`: ``changes`` and
        ``guards`` are the values of its ``change_cols`` and ``guard_cols``, in order."""

    @abc.abstractmethod
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

    @abc.abstractmethod
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

    @abc.abstractmethod
    def claim_entities_with_facts(self, policy: EntityPolicy,
                                  rows: Sequence[tuple[str, Row, Row]], *, observed: str,
                                  to_state: str, changes: Row, limit: int,
                                  facts: ClaimFacts) -> list[Row]:
        """:meth:`claim_entities`, and a fact for each row it claimed (``facts``), in the
        same transaction; where the dialect can, in the same statement. ``facts.ids``
        holds at least ``limit`` ids (or one a row, if fewer rows are given)."""

    @abc.abstractmethod
    def fact_by_idempotency_key(self, entity_type: str, entity_id: str,
                                key: str) -> tuple[str, str | None, str] | None:
        """(fact id, previous_status, status) of the fact recorded under ``key``."""

    @abc.abstractmethod
    def append_facts(self, facts: Sequence[Sequence[Any]]) -> None:
        """Append facts to the log, each a row in :data:`FACT_COLUMNS` order."""

    @abc.abstractmethod
    def insert_entity(self, policy: EntityPolicy, row: dict[str, Any], *,
                      returning: tuple[str, ...] | None = None) -> Row:
        """Insert one projection row; returns it as stored (defaults included), or only
        its ``returning`` columns ({} for none: nothing is read back)."""

    @abc.abstractmethod
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

    @abc.abstractmethod
    def insert_entities(self, policy: EntityPolicy, columns: tuple[str, ...],
                        rows: Iterable[Sequence[Any]]) -> None:
        """Insert many projection rows that name the same columns."""

    @abc.abstractmethod
    def entities_by_id(self, policy: EntityPolicy, ids: Sequence[str], *,
                       columns: tuple[str, ...] | None = None) -> list[Row]:
        """Whole rows of the given ids (any order; missing ids are absent), or only their
        ``columns``."""

    @abc.abstractmethod
    def entity_row(self, policy: EntityPolicy, entity_id: str) -> Row | None:
        """One whole row, or None."""

    @abc.abstractmethod
    def statuses(self, policy: EntityPolicy, ids: Sequence[str]) -> dict[str, str]:
        """id -> status for the ids that exist."""

    @abc.abstractmethod
    def savepoint(self) -> AbstractContextManager[None]:
        """A nested scope: an exception inside rolls back its writes alone, then propagates."""

    @abc.abstractmethod
    def database_failure(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised inside this transaction, says the database or the
        connection failed (the whole unit must fail) rather than one row's move."""

    # ------------------------------------------------------------ submission

    @abc.abstractmethod
    def run_by_idempotency_key(self, policy: EntityPolicy, key: str) -> Row | None:
        """``id`` and ``application_digest`` of the run submitted under ``key``."""

    @abc.abstractmethod
    def ensure_schedule(self, schedule_id: str, name: str | None, created_at: float) -> None:
        """Insert the schedules row a fire references, unless it exists."""

    @abc.abstractmethod
    def waiting_runs(self, policy: EntityPolicy, ids: Sequence[str]) -> list[tuple[str, Any]]:
        """(id, depends_on) of the given runs still waiting for dependencies."""

    @abc.abstractmethod
    def dependents_of(self, policy: EntityPolicy, run_ids: Sequence[str]
                      ) -> list[tuple[str, Any]]:
        """(id, depends_on) of waiting runs whose depends_on names any of ``run_ids``, each
        once."""

    @abc.abstractmethod
    def notify_claimable(self) -> None:
        """Tell workers of other processes and hosts that a row may have become claimable
        without entering the claim's source state (a cancel freed its concurrency key);
        delivered at commit; a no-op where the dialect has no such channel. A row that
        enters that state tells them by itself (PostgreSQL: a trigger)."""

    # ------------------------------------------------------------ schedules

    @abc.abstractmethod
    def latest_fire(self, policy: EntityPolicy, schedule_id: str) -> Row | None:
        """``id``, ``status``, ``slot_at``, ``ended_at``, ``exit_code`` of the schedule's run
        with the latest slot (runs without a slot are not fires of ledgerq's scheduler)."""

    @abc.abstractmethod
    def run_for_slot(self, policy: EntityPolicy, schedule_id: str, slot_at: float) -> str | None:
        """The id of the schedule's run for ``slot_at``, if that slot has fired."""

    @abc.abstractmethod
    def fire_in_progress(self, policy: EntityPolicy, schedule_id: str) -> str | None:
        """The id of one fire of the schedule that is in no terminal state (the spec's)."""

    # ------------------------------------------------------------ workers

    @abc.abstractmethod
    def upsert_worker(self, worker_id: str, capabilities: str, targets: str, now: float,
                      hostname: str, pid: int, queues: str) -> None:
        """Insert or refresh a worker's row (its heartbeat); ``queues`` is the JSON list
        of queues it serves (a row an older release wrote has NULL: every queue)."""

    @abc.abstractmethod
    def worker_heartbeat(self, worker_id: str) -> float | None:
        """The worker's last heartbeat, or None when it has no row."""

    @abc.abstractmethod
    def workers(self) -> list[Row]:
        """worker_id, hostname, pid, last_heartbeat_at of every worker, by id."""

    @abc.abstractmethod
    def worker_rows(self) -> list[Row]:
        """Every worker's whole row, by id (columns a newer schema added appear only
        where the database has them: a read-only open never upgrades it)."""

    @abc.abstractmethod
    def request_worker_stop(self, worker_id: str, now: float) -> bool:
        """Record that ``worker_id`` is asked to drain and exit; False when no such row."""

    @abc.abstractmethod
    def worker_stop_requested(self, worker_id: str) -> float | None:
        """When the worker was last asked to stop, or None."""

    @abc.abstractmethod
    def expired_leases(self, policy: EntityPolicy, now: float,
                       limit: int | None = None) -> list[Row]:
        """Running rows whose lease expired before ``now`` (:func:`expired_columns`)."""

    @abc.abstractmethod
    def due_retries(self, policy: EntityPolicy, now: float,
                    limit: int | None = None) -> list[Row]:
        """``id``, ``retry_due_at`` of retry_wait rows due at ``now``."""

    @abc.abstractmethod
    def due_starts(self, policy: EntityPolicy, now: float,
                   limit: int | None = None) -> list[Row]:
        """``id``, ``not_before`` of delayed rows whose start time is at or before ``now``."""

    @abc.abstractmethod
    def settled_waiting(self, policy: EntityPolicy, limit: int | None = None) -> list[str]:
        """Ids of waiting runs that can move now: a dependency ended in a terminal state
        whose outcome is not ``succeeded``, or every one ended in one whose outcome is
        (outcomes are the spec's). A depends_on that is not a JSON list never settles."""

    @abc.abstractmethod
    def claim_page(self, policy: EntityPolicy, excluded_kinds: Sequence[str], queue: str,
                   after: tuple[int, float, str] | None, limit: int) -> list[Row]:
        """One keyset page of queue ``queue``'s queued, unscheduled rows after ``after``
        (None: from the start) in claim order: priority descending, then (queued_at, id)
        (:data:`CANDIDATE_COLUMNS`). Rows without a ``queued_at`` are never claimed."""

    @abc.abstractmethod
    def running_keys(self, policy: EntityPolicy) -> set[str]:
        """Concurrency keys of running rows."""

    @abc.abstractmethod
    def key_running(self, policy: EntityPolicy, key: str) -> bool:
        """Whether a row with concurrency key ``key`` is running."""

    @abc.abstractmethod
    def lock_key(self, key: str) -> None:
        """Serialize this transaction with every other that locks ``key`` until it ends
        (so two claims of one concurrency key cannot both see it free)."""

    @abc.abstractmethod
    def lease_rows(self, policy: EntityPolicy, ids: Sequence[str]) -> list[Row]:
        """:func:`lease_columns` of the given runs."""

    # ------------------------------------------------------------ the log

    @abc.abstractmethod
    def facts_of(self, entity_type: str, entity_id: str) -> list[Row]:
        """Every fact of one entity, in version order, JSON columns as text."""

    @abc.abstractmethod
    def facts_after(self, entity_type: str, after_id: str, limit: int) -> list[Row]:
        """Up to ``limit`` facts of an entity type whose id sorts after ``after_id``, in id
        order (ids are time-ordered, so: in the order they were appended), JSON as text."""

    @abc.abstractmethod
    def fact_stream(self, entity_type: str) -> Iterator[tuple[str, str, int, Any]]:
        """(entity_id, status, entity_version, patch) of every fact of an entity type, in
        (entity_id, entity_version) order, streamed (never the whole log in memory)."""

    @abc.abstractmethod
    def rows_in_id_order(self, policy: EntityPolicy) -> Iterator[Row]:
        """Every projection row, by id, streamed."""

    @abc.abstractmethod
    def count_facts(self) -> int:
        """Facts in the log."""

    @abc.abstractmethod
    def defer_constraints(self) -> None:
        """Check foreign keys at commit rather than per statement, for this transaction."""

    @abc.abstractmethod
    def delete_rows(self, policy: EntityPolicy) -> None:
        """Delete every projection row of an entity (rebuild only)."""

    # ------------------------------------------------------------ the archive
    # ``ledgerq archive`` (ledgerq.queue.maintenance.archive): the runs it moves out are listed in
    # ``ledgerq_archive_batch`` for the one transaction that copies and deletes them; the
    # log's DELETE guard admits a fact only while its entity is listed there.

    @abc.abstractmethod
    def lock_archives(self) -> None:
        """Serialize this transaction with every other archive until it ends (a no-op
        where one writer runs at a time)."""

    @abc.abstractmethod
    def mark_ended(self, policy: EntityPolicy, states: Sequence[str], before: float,
                   limit: int | None = None) -> int:
        """List every row in one of ``states`` whose last move (``updated_at``, else
        ``created_at``) is before ``before``, the oldest ``limit`` of them (None: all);
        where writers run at once the rows stay locked until the transaction ends.
        Returns how many were listed."""

    @abc.abstractmethod
    def unmark_referenced(self, policy: EntityPolicy, referrer: EntityPolicy,
                          column: str) -> int:
        """Take off the list each listed row that a row of ``referrer`` which is not listed
        itself names in ``column`` (a foreign key to ``policy``'s table). Returns how many."""

    @abc.abstractmethod
    def unmark_dependencies(self, policy: EntityPolicy) -> int:
        """Take off the list each listed run that the ``depends_on`` of an unlisted run
        names (a dependency is read by id; it is no foreign key). Returns how many."""

    @abc.abstractmethod
    def unmark_leased(self, policy: EntityPolicy) -> int:
        """Take off the list each listed run a worker row names as its lease."""

    @abc.abstractmethod
    def marked_rows(self, policy: EntityPolicy) -> Iterator[Row]:
        """The listed rows, whole, by id, streamed (JSON as text)."""

    @abc.abstractmethod
    def marked_facts(self, entity_type: str) -> Iterator[Row]:
        """Every fact of the listed entities in (entity_id, entity_version) order, keyed by
        :data:`FACT_COLUMNS`, streamed (JSON as text)."""

    @abc.abstractmethod
    def delete_marked(self, policy: EntityPolicy) -> tuple[int, int]:
        """Delete the listed entities' facts, then their rows: (facts, rows) deleted."""

    @abc.abstractmethod
    def clear_marks(self) -> None:
        """Empty the list (before the transaction commits: the guard is strict again)."""

    @abc.abstractmethod
    def record_archive(self, row: dict[str, Any]) -> None:
        """Insert one ``ledgerq_archives`` row (its columns by name)."""

    @abc.abstractmethod
    def archives(self) -> list[Row]:
        """Every ``ledgerq_archives`` row, oldest first ([] where the table is missing: a
        database from before archives, opened read-only)."""

    # ------------------------------------------------------------ read models

    @abc.abstractmethod
    def run_page(self, policy: EntityPolicy, filters: dict[str, list[Any]],
                 columns: tuple[str, ...], limit: int, offset: int, *,
                 since: tuple[str, float] | None = None) -> tuple[int, list[Row]]:
        """(matching total, one page newest first) where each column is in its list and,
        with ``since`` = (column, value), that column (NULL: ``created_at``) is at least
        the value."""

    @abc.abstractmethod
    def run_page_before(self, policy: EntityPolicy, filters: dict[str, list[Any]],
                        columns: tuple[str, ...], before: tuple[float, str] | None,
                        limit: int) -> list[Row]:
        """One keyset page newest first ((created_at, id) descending), strictly older than
        ``before`` (None: from the newest), where each column is in its list: a cursor
        page stays correct while rows are added, which an offset page does not."""

    @abc.abstractmethod
    def fact_counts(self) -> list[tuple[str, str, int]]:
        """(entity_type, reason_code, facts) of every pair in the log, sorted."""

    @abc.abstractmethod
    def wait_histogram(self, entity_type: str, reason_code: str,
                       bounds: Sequence[float]) -> tuple[list[int], int, float]:
        """How long entities waited before each fact with ``reason_code``: the seconds from
        the entity's previous fact to it. (facts at or below each bound, facts, seconds)."""

    @abc.abstractmethod
    def ids_matching(self, policy: EntityPolicy, piece: str, *, suffix: bool,
                     limit: int) -> list[str]:
        """Ids starting (or, ``suffix``, ending) with ``piece``, in id order."""

    @abc.abstractmethod
    def status_counts(self, policy: EntityPolicy) -> dict[str, int]:
        """Rows per status."""

    @abc.abstractmethod
    def oldest_queued_at(self, policy: EntityPolicy) -> float | None:
        """The earliest queued_at among queued rows (whatever queue and priority)."""

    @abc.abstractmethod
    def running_by_worker(self, policy: EntityPolicy) -> dict[str, int]:
        """Running rows per leasing worker."""

    @abc.abstractmethod
    def stuck_runs(self, policy: EntityPolicy, kind: str, now: float, grace: float,
                   limit: int) -> tuple[int, list[tuple[str, str, str]]]:
        """(count, first ``limit`` (id, status, why)) of one kind of stuck run
        (:data:`STUCK_KINDS`; see :func:`ledgerq.queue.reads.queue_stats`)."""


Unit = Callable[[Tx], T]


class Database(Protocol):
    """What the engine and the queue need of a handle (:class:`ledgerq.StateDB` is one)."""

    @property
    def registry(self) -> Registry: ...

    async def write(self, fn: Callable[[Tx], T], *, bulk: bool = False,
                    reads_first: bool = False, alone: bool = False) -> T: ...

    async def read(self, fn: Callable[[Tx], T]) -> T: ...
