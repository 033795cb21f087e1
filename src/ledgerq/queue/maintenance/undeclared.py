"""Runs in states this process's specs do not declare: left alone, and said so.

During a rolling upgrade a newer release may have added a state (and migrated the
database to it) while this worker still runs the older specs. Claims, the reaper and
promotion only ever read the states they act on, so such rows are skipped by
construction; this makes the skip visible, once per change, instead of silent.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ledgerq.queue.runs import run_policy

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.store import SharedTx

log = logging.getLogger("ledgerq.worker")

#: How often a worker looks (the look scans the run table, so rarely); the first look is
#: at start.
UNDECLARED_EVERY = 60.0
#: Ids a report names.
SAMPLE = 5


class UndeclaredReport:
    """Counts the runs in undeclared states and logs when the count changes."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self.count = 0

    async def look(self, db: Database[SharedTx], now: float) -> int:
        policy = run_policy(db)
        n, sample = await db.read(
            lambda tx: tx.find_stuck_runs(policy, "undeclared", now, 0.0, SAMPLE))
        if n and n != self.count:
            states = sorted({status for _, status, _ in sample})
            log.warning(
                "worker %s: %d run(s) are in state(s) %s, not declared by the loaded specs "
                "(a newer release's?); leaving them alone: %s%s", self.worker_id, n,
                ", ".join(states), ", ".join(i for i, _, _ in sample),
                ", ..." if n > len(sample) else "")
        elif self.count and not n:
            log.warning("worker %s: no run is in an undeclared state any more",
                        self.worker_id)
        self.count = n
        return n
