"""Every store operation over a DB-API connection, once, in one module per owner.

Both dialects run the same Python for each operation: which statement (by name from
the dialect's ``*.sql``), which parameters, what comes back. Only the text differs,
plus the few operations a dialect overrides (savepoints, deferred checks, row locks,
streaming). No SQL text lives here: every statement and every fragment (an assignment,
a guard term) is a named template of the dialect; these modules join lists of quoted
identifiers and fragments.

The modules follow the protocols that declare the operations: :mod:`.events` the
engine's (:class:`ledgerq.lifecycle.store.EventStore`), :mod:`.shared` what more than one
wing of the queue calls, then one module per wing (:mod:`.submission`, :mod:`.workers`,
:mod:`.maintenance`, :mod:`.scheduling`) and the read models' (:mod:`.reads`).
:class:`SqlTx` is all of them: a plain class with each method once, so a call costs one
attribute lookup as on any class. The store never imports the queue; the queue's
protocols match :class:`SqlTx` by structure.
"""

from __future__ import annotations

from typing import Any

from ledgerq.store.sqltx.events import EventOps, Swap
from ledgerq.store.sqltx.maintenance import MaintenanceOps
from ledgerq.store.sqltx.reads import ReadOps
from ledgerq.store.sqltx.scheduling import SchedulingOps
from ledgerq.store.sqltx.shared import SharedOps
from ledgerq.store.sqltx.submission import SubmissionOps
from ledgerq.store.sqltx.workers import WorkerOps

__all__ = ["SqlTx", "Swap"]


class SqlTx(EventOps, SharedOps, SubmissionOps, WorkerOps, MaintenanceOps, SchedulingOps,
            ReadOps):
    """One transaction on a DB-API connection, every operation; each dialect subclasses
    it to name its queries and override what it does better."""

    # Here, not in SqlBase: a dialect's ``super().__init__`` then finds it at once instead
    # of walking the mixins (a PostgreSQL unit makes one of these).
    def __init__(self, conn: Any) -> None:
        self.conn = conn

