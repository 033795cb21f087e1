"""Every store operation over a DB-API connection, once, in one module per owner.

Both dialects run the same Python for each operation: which statement (by name from
the dialect's ``*.sql``), which parameters, what comes back. Only the text differs,
plus the few operations a dialect overrides (savepoints, deferred checks, row locks,
streaming). No SQL text lives here: every statement and every fragment (an assignment,
a guard term) is a named template of the dialect; these modules join lists of quoted
identifiers and fragments.

The modules follow the protocols that declare the operations: :mod:`.events` the
engine's (:class:`ledgerq.operations.EventStore`), :mod:`.shared` what more than one
wing of the queue calls, then one module per wing (:mod:`.submission`, :mod:`.workers`,
:mod:`.maintenance`, :mod:`.scheduling`) and the read models' (:mod:`.reads`).
:class:`SqlTx` is all of them: a plain class with each method once, so a call costs one
attribute lookup as on any class. The store never imports the queue; the queue's
protocols match :class:`SqlTx` by structure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.operations import Row
from ledgerq.store.sqltx.events import EventOps, Swap
from ledgerq.store.sqltx.maintenance import MaintenanceOps
from ledgerq.store.sqltx.reads import ReadOps
from ledgerq.store.sqltx.scheduling import SchedulingOps
from ledgerq.store.sqltx.shared import SharedOps
from ledgerq.store.sqltx.submission import SubmissionOps
from ledgerq.store.sqltx.workers import WorkerOps

__all__ = ["SqlTx", "Swap"]

#: Transitional (see :meth:`SqlTx.claim_page`): the queue's candidate columns.
_CANDIDATE_COLUMNS = ("id", "queued_at", "required_capabilities", "execution_target",
                      "concurrency_key", "lease_attempts", "priority", "queue")


class SqlTx(EventOps, SharedOps, SubmissionOps, WorkerOps, MaintenanceOps, SchedulingOps,
            ReadOps):
    """One transaction on a DB-API connection, every operation; each dialect subclasses
    it to name its queries and override what it does better."""

    # Here, not in SqlBase: a dialect's ``super().__init__`` then finds it at once instead
    # of walking the mixins (a PostgreSQL unit makes one of these).
    def __init__(self, conn: Any) -> None:
        self.conn = conn

    # ------------------------------------------------------------ transitional
    # The names ledgerq.queue.worker.claim still calls, until it calls WorkerTx's (and
    # passes the candidate columns and the default queue itself): then delete these.

    def claim_page(self, policy: EntityPolicy, excluded_kinds: Sequence[str], queue: str,
                   after: tuple[int, float, str] | None, limit: int) -> list[Row]:
        return self.read_claim_page(policy, excluded_kinds, queue, after, limit,
                                    columns=_CANDIDATE_COLUMNS, default_queue="default")

    def worker_heartbeat(self, worker_id: str) -> float | None:
        return self.read_worker_heartbeat(worker_id)

    def running_keys(self, policy: EntityPolicy) -> set[str]:
        return self.list_running_keys(policy)

    def key_running(self, policy: EntityPolicy, key: str) -> bool:
        return self.is_key_running(policy, key)

    def database_failure(self, exc: BaseException) -> bool:
        return self.is_database_failure(exc)
