"""The store operations of maintenance: the sweeps (expired leases, due retries and starts,
settled dependencies) and the archive."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ledgerq.lifecycle.store import Row
from ledgerq.queue.store import SharedTx

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy


class MaintenanceTx(SharedTx, Protocol):
    """What the reaper, promotion and the archive call."""

    # ------------------------------------------------------------ the sweeps

    def list_expired_leases(self, policy: EntityPolicy, now: float,
                            limit: int | None = None, *, columns: tuple[str, ...]
                            ) -> list[Row]:
        """``columns`` (:func:`~ledgerq.queue.moves.expired_columns`) of running rows whose
        lease expired before ``now``."""

    def list_due_retries(self, policy: EntityPolicy, now: float,
                         limit: int | None = None) -> list[Row]:
        """``id``, ``retry_due_at`` of retry_wait rows due at ``now``."""

    def list_due_starts(self, policy: EntityPolicy, now: float,
                        limit: int | None = None) -> list[Row]:
        """``id``, ``not_before`` of delayed rows whose start time is at or before ``now``."""

    def list_settled_waiting(self, policy: EntityPolicy, limit: int | None = None) -> list[str]:
        """Ids of waiting runs that can move now: a dependency ended in a terminal state
        whose outcome is not ``succeeded``, or every one ended in one whose outcome is
        (outcomes are the spec's). A depends_on that is not a JSON list never settles."""

    # ------------------------------------------------------------ the archive
    # ``ledgerq archive`` (:mod:`ledgerq.queue.maintenance.archive`): the runs it moves out
    # are listed in ``ledgerq_archive_batch`` for the one transaction that copies and
    # deletes them; the log's DELETE guard admits a fact only while its entity is listed.

    def lock_archives(self) -> None:
        """Serialize this transaction with every other archive until it ends (a no-op
        where one writer runs at a time)."""

    def mark_ended(self, policy: EntityPolicy, states: Sequence[str], before: float,
                   limit: int | None = None) -> int:
        """List every row in one of ``states`` whose last move (``updated_at``, else
        ``created_at``) is before ``before``, the oldest ``limit`` of them (None: all);
        where writers run at once the rows stay locked until the transaction ends.
        Returns how many were listed."""

    def list_departed_workers(self, before: float, limit: int | None = None) -> list[str]:
        """Ids of workers whose last heartbeat is before ``before``."""

    def delete_departed_workers(self, before: float) -> list[str]:
        """Delete the rows of workers whose last heartbeat is before ``before``; their
        ids."""

    def list_marked(self, entity_type: str) -> list[str]:
        """The ids on the list."""

    def list_references(self, referrer: EntityPolicy, column: str) -> list[tuple[str, str]]:
        """(id, value) of each row of ``referrer`` whose ``column`` (a foreign key) is set."""

    def list_depends_on(self, policy: EntityPolicy) -> list[tuple[str, Any]]:
        """(id, depends_on) of each run that names dependencies (a dependency is read by
        id; it is no foreign key)."""

    def list_marked_keyed(self, policy: EntityPolicy, created_after: float) -> list[str]:
        """The listed runs that carry an idempotency key and were created at or after
        ``created_after``."""

    def list_leased_runs(self) -> list[str]:
        """The runs worker rows name as their lease."""

    def unmark(self, entity_type: str, ids: Sequence[str]) -> int:
        """Take ``ids`` off the list; how many were on it."""

    def stream_marked_rows(self, policy: EntityPolicy) -> Iterator[Row]:
        """The listed rows, whole, by id, streamed (JSON as text)."""

    def stream_marked_facts(self, entity_type: str) -> Iterator[Row]:
        """Every fact of the listed entities in (entity_id, entity_version) order, keyed by
        :data:`~ledgerq.lifecycle.store.FACT_COLUMNS`, streamed (JSON as text)."""

    def delete_marked(self, policy: EntityPolicy) -> tuple[int, int]:
        """Delete the listed entities' facts, then their rows: (facts, rows) deleted."""

    def clear_marks(self) -> None:
        """Empty the list (before the transaction commits: the guard is strict again)."""

    def record_archive(self, row: dict[str, Any]) -> None:
        """Insert one ``ledgerq_archives`` row (its columns by name)."""

    def list_archives(self) -> list[Row]:
        """Every ``ledgerq_archives`` row, oldest first ([] where the table is missing: a
        database from before archives, opened read-only)."""
