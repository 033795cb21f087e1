"""Workers that stopped beating: forgotten after a retention.

Every worker process has a row in ``workers`` (a random id by default), which ``ledgerq
workers``, ``stats`` and ``/metrics`` read. A process that exits or dies leaves its row
behind; without a retention the table, and every listing of it, grows with every worker
that ever ran. A worker row holds no history (what a worker did is in the facts, under
its id), so a row silent for :data:`WORKER_RETENTION_SECONDS` is deleted by the next
worker's maintenance pass. ``/metrics`` drops a worker as soon as it is presumed dead
(see :mod:`ledgerq.web.metrics`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.maintenance.store import MaintenanceTx

log = logging.getLogger("ledgerq.worker")

#: A worker row whose last heartbeat is older than this is deleted: a day, long enough
#: to see in ``ledgerq workers`` which workers went away and when.
WORKER_RETENTION_SECONDS = 86400.0
#: How often a worker looks.
DEPARTED_EVERY = 60.0


async def forget_departed_workers(db: Database[MaintenanceTx], *, now: float,
                                  retention: float = WORKER_RETENTION_SECONDS) -> list[str]:
    """Delete the rows of workers silent for ``retention`` seconds; their ids."""
    before = now - retention
    if not await db.read(lambda tx: tx.list_departed_workers(before, 1)):
        return []  # the usual case: no write lock taken
    gone = await db.write(lambda tx: tx.delete_departed_workers(before))
    if gone:
        log.info("forgot %d worker(s) silent since before %.0f: %s", len(gone), before,
                 ", ".join(gone[:10]) + (", ..." if len(gone) > 10 else ""))
    return gone
