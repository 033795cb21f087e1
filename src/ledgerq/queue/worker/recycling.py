"""When a worker stops by itself: after N runs, after a running time, or when asked.

Recycling (``max_tasks``, ``max_runtime``) bounds what a long-lived process accumulates
(memory, file handles, a stale virtualenv); a stop request (``ledgerq worker stop ID``)
lets an operator take a host out of service without killing anything. All three end the
same way, a drain: the worker stops claiming, lets every run it holds finish (renewing
their leases, with no grace period cutting them short: their own timeouts bound them),
and exits once idle. Nothing is requeued, so a drain costs no run its progress.

A stop request travels through the database, so it reaches a worker on any host: it is
``workers.stop_requested_at``, set by :func:`request_worker_stop` and read by the worker
with its maintenance passes. A request made before this worker started is for an earlier
process with the same id and is ignored.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ledgerq.errors import InvalidInput, NotFound

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.worker.store import WorkerTx

log = logging.getLogger("ledgerq.runtime")


async def request_worker_stop(db: Database[WorkerTx], worker_id: str, *,
                              now: float | None = None) -> None:
    """Ask ``worker_id`` to drain and exit (it notices within its maintenance interval).

    NotFound when no worker has that id (it never heartbeat here)."""
    ts = time.time() if now is None else now
    if not await db.write(lambda tx: tx.request_worker_stop(worker_id, ts)):
        raise NotFound(f"no worker {worker_id}")


@dataclass
class Recycling:
    """One worker's limits, and why it is draining once one is reached."""

    max_tasks: int | None = None
    max_runtime: float | None = None
    #: When this worker process started (epoch seconds; a stop request before it is stale).
    started: float = field(default_factory=time.time)
    claimed: int = 0
    #: Why the worker drains; None while it serves.
    why: str | None = None

    def __post_init__(self) -> None:
        if self.max_tasks is not None and self.max_tasks < 1:
            raise InvalidInput(f"max_tasks must be >= 1, not {self.max_tasks}")
        if self.max_runtime is not None and not self.max_runtime > 0:
            raise InvalidInput(f"max_runtime must be positive, not {self.max_runtime}")

    @property
    def draining(self) -> bool:
        return self.why is not None

    def drain(self, why: str, worker_id: str) -> None:
        if self.why is None:
            self.why = why
            log.warning("worker %s: draining (%s): no more claims; exits when idle",
                        worker_id, why)

    def allowance(self, limit: int) -> int:
        """How many rows the next claim pass may take (0 once draining)."""
        if self.draining:
            return 0
        if self.max_tasks is not None:
            return max(0, min(limit, self.max_tasks - self.claimed))
        return limit

    def note_claimed(self, n: int, worker_id: str) -> None:
        self.claimed += n
        if self.max_tasks is not None and self.claimed >= self.max_tasks:
            self.drain(f"max_tasks {self.max_tasks} reached", worker_id)

    async def check(self, db: Database[WorkerTx], worker_id: str, now: float) -> None:
        """One maintenance look: the running time, and a stop request in the database."""
        if self.draining:
            return
        if self.max_runtime is not None and now - self.started >= self.max_runtime:
            self.drain(f"max_runtime {self.max_runtime:g}s reached", worker_id)
            return
        asked = await db.read(lambda tx: tx.read_worker_stop_request(worker_id))
        if asked is not None and asked >= self.started:
            self.drain("stop requested", worker_id)
