"""The store operations of the queue's shared parts, and of its read models.

Each wing of the queue (``submission``, ``worker``, ``maintenance``, ``scheduling``)
declares the operations it calls in its own ``store.py``, a protocol extending
:class:`SharedTx`, which declares those more than one wing calls, once; the read models
(:mod:`ledgerq.queue.reads`) declare theirs here (:class:`ReadsTx`). Every one extends the
engine's :class:`~ledgerq.lifecycle.store.EventStore` (each wing moves runs through the
engine). The store's transaction class implements them all and imports none of them:
the match is structural (``tests/lifecycle/test_engine_boundary.py`` checks both dialects).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ledgerq.lifecycle.store import EventStore, Row

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy

#: Kinds of stuck run :meth:`SharedTx.find_stuck_runs` finds.
STUCK_KINDS = ("undeclared", "lease", "retry", "waiting", "held")


class SharedTx(EventStore, Protocol):
    """What more than one wing of the queue calls (runs and schedules read by id, the
    dependency lookups of :func:`ledgerq.queue.dependencies.resolve_dependents`, a page of rows,
    stuck runs)."""

    def read_entity(self, policy: EntityPolicy, entity_id: str) -> Row | None:
        """One whole row, or None."""

    def read_statuses(self, policy: EntityPolicy, ids: Sequence[str]) -> dict[str, str]:
        """id -> status for the ids that exist."""

    def list_waiting_runs(self, policy: EntityPolicy, ids: Sequence[str]
                          ) -> list[tuple[str, Any]]:
        """(id, depends_on) of the given runs still waiting for dependencies."""

    def list_dependents(self, policy: EntityPolicy, run_ids: Sequence[str]
                        ) -> list[tuple[str, Any]]:
        """(id, depends_on) of waiting runs whose depends_on names any of ``run_ids``, each
        once."""

    def list_all_waiting(self, policy: EntityPolicy) -> list[tuple[str, Any]]:
        """(id, depends_on) of every run waiting for dependencies: one read, from which a
        cascade or a cycle check follows the dependency graph in memory."""

    def ensure_schedule(self, schedule_id: str, name: str | None, created_at: float) -> None:
        """Insert the schedules row a fire references, unless it exists."""

    def read_page(self, policy: EntityPolicy, filters: dict[str, list[Any]],
                  columns: tuple[str, ...], limit: int, offset: int, *,
                  since: tuple[str, float] | None = None) -> tuple[int, list[Row]]:
        """(matching total, one page newest first) where each column is in its list and,
        with ``since`` = (column, value), that column (NULL: ``created_at``) is at least
        the value."""

    def find_stuck_runs(self, policy: EntityPolicy, kind: str, now: float, grace: float,
                        limit: int) -> tuple[int, list[tuple[str, str, str]]]:
        """(count, first ``limit`` (id, status, why)) of one kind of stuck run
        (:data:`STUCK_KINDS`; see :func:`ledgerq.queue.reads.queue_stats`)."""


class ReadsTx(SharedTx, Protocol):
    """What the read models (:mod:`ledgerq.queue.reads`) call: pages, counts, the log's
    tail, workers."""

    def read_facts_after(self, entity_type: str, after_id: str, limit: int) -> list[Row]:
        """Up to ``limit`` facts of an entity type whose id sorts after ``after_id``, in id
        order (ids are time-ordered, so: in the order they were appended), JSON as text."""

    def count_facts(self) -> int:
        """Facts in the log."""

    def list_workers(self) -> list[Row]:
        """worker_id, hostname, pid, last_heartbeat_at of every worker, by id."""

    def list_worker_rows(self) -> list[Row]:
        """Every worker's whole row, by id (columns a newer schema added appear only
        where the database has them: a read-only open never upgrades it)."""

    def count_facts_by_reason(self) -> list[tuple[str, str, int]]:
        """(entity_type, reason_code, facts) of every pair in the log, sorted."""

    def read_wait_histogram(self, entity_type: str, reason_code: str,
                            bounds: Sequence[float]) -> tuple[list[int], int, float]:
        """How long entities waited before each fact with ``reason_code``: the seconds from
        the entity's previous fact to it. (facts at or below each bound, facts, seconds)."""

    def list_ids_matching(self, policy: EntityPolicy, piece: str, *, suffix: bool,
                          limit: int) -> list[str]:
        """Ids starting (or, ``suffix``, ending) with ``piece``, in id order."""

    def list_queued_kinds(self, policy: EntityPolicy) -> list[str]:
        """The action kinds of queued rows, each once, sorted."""

    def find_oldest_queued_at(self, policy: EntityPolicy) -> float | None:
        """The earliest queued_at among queued rows (whatever queue and priority)."""

    def count_running_by_worker(self, policy: EntityPolicy) -> dict[str, int]:
        """Running rows per leasing worker."""
