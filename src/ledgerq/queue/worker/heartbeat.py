"""A worker's row in ``workers``: what it serves and when it was last alive.

Claims read it back (a worker whose heartbeat is stale claims nothing), and operators
read it to see which workers serve which capabilities and targets.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING

from ledgerq.codec import dumps

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.worker.config import WorkerConfig
    from ledgerq.queue.worker.store import WorkerTx

async def beat(db: Database[WorkerTx], config: WorkerConfig, now: float | None = None) -> None:
    """Upsert this worker's row with the capabilities and targets it advertises."""
    ts = time.time() if now is None else now
    caps = dumps(list(config.advertised_capabilities))
    targets = dumps(list(config.execution_targets))
    queues = dumps(list(config.queues))
    kinds = dumps(list(config.executors.served_kinds))
    host = socket.gethostname()

    def unit(tx: WorkerTx) -> None:
        tx.upsert_worker(config.worker_id, caps, targets, ts, host, os.getpid(), queues,
                         kinds)

    await db.write(unit)
