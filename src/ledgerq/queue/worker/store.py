"""The store operations a worker calls (beside the engine's and the queue's shared ones)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ledgerq.lifecycle.store import Row
from ledgerq.queue.maintenance.store import MaintenanceTx
from ledgerq.queue.scheduling.store import SchedulingTx
from ledgerq.queue.store import SharedTx

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy


class Kinds(NamedTuple):
    """Which action kinds a claim takes: only ``names`` (``only``), or all but them."""

    names: tuple[str, ...]
    only: bool


class WorkerTx(SharedTx, Protocol):
    """What heartbeats, claims, lease checks, outcomes and recycling call."""

    def upsert_worker(self, worker_id: str, capabilities: str, targets: str, now: float,
                      hostname: str, pid: int, queues: str, kinds: str | None = None) -> None:
        """Insert or refresh a worker's row (its heartbeat); ``queues`` is the JSON list
        of queues it serves (a row an older release wrote has NULL: every queue), and
        ``kinds`` the JSON list of action kinds it claims (NULL: not said, every kind)."""

    def read_worker_heartbeat(self, worker_id: str) -> float | None:
        """The worker's last heartbeat, or None when it has no row."""

    def request_worker_stop(self, worker_id: str, now: float) -> bool:
        """Record that ``worker_id`` is asked to drain and exit; False when no such row."""

    def read_worker_stop_request(self, worker_id: str) -> float | None:
        """When the worker was last asked to stop, or None."""

    def read_claim_page(self, policy: EntityPolicy, kinds: Kinds, queue: str,
                        after: tuple[int, float, str] | None, limit: int, *,
                        columns: tuple[str, ...], default_queue: str) -> list[Row]:
        """One keyset page of queue ``queue``'s queued, unscheduled rows after ``after``
        (None: from the start) whose action kind ``kinds`` takes, in claim order:
        priority descending, then (queued_at, id);
        each row's ``columns`` (:data:`~ledgerq.queue.moves.CANDIDATE_COLUMNS`) that the
        spec declares. Rows without a ``queued_at`` are never claimed. Specs that predate
        queues and priorities: every run is priority 0 in ``default_queue``."""

    def list_running_keys(self, policy: EntityPolicy) -> set[str]:
        """Concurrency keys of running rows."""

    def is_key_running(self, policy: EntityPolicy, key: str) -> bool:
        """Whether a row with concurrency key ``key`` is running."""

    def read_leases(self, policy: EntityPolicy, ids: Sequence[str], *,
                    columns: tuple[str, ...]) -> list[Row]:
        """``columns`` (:func:`~ledgerq.queue.moves.lease_columns`) of the given runs."""


class ServiceTx(WorkerTx, MaintenanceTx, SchedulingTx, Protocol):
    """What a :class:`~ledgerq.queue.worker.service.Worker` runs on its handle: its own
    operations, the maintenance it does between passes and the schedules it fires."""
