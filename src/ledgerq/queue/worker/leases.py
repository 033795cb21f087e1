"""Lease checks of many executing runs, read together.

Every executing run checks, once per check interval, that its row still carries its
lease (a reap, a cancel or a reclaim ends it; see ``supervision._supervise_once``). Checked
one by one, a worker with hundreds of long runs sends hundreds of reads per interval
through the read connection's thread. Instead, runs check on the interval's common
boundaries (:func:`until_next_check`), so their checks fall due in the same turn of the
event loop, and :class:`LeaseReads` answers every run that asks in one turn with one
query. Renewals stay one guarded move per run; concurrent ones already share a commit.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ledgerq.queue.moves import lease_columns
from ledgerq.queue.runs import run_policy

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.worker.store import WorkerTx



def until_next_check(interval: float) -> float:
    """Seconds to the next multiple of ``interval`` on the event loop's clock.

    Runs that wait for the same boundary wake in the same turn of the loop, whenever
    each of them started, and so share one read.
    """
    now = asyncio.get_running_loop().time()
    return interval - now % interval


class LeaseReads:
    """Coalesces the lease checks asked for in one turn of the event loop into one query."""

    def __init__(self) -> None:
        self._waiting: dict[Database[WorkerTx],
                            dict[str, list[asyncio.Future[dict[str, Any] | None]]]] = {}
        self._flushes: set[asyncio.Task[None]] = set()

    async def lease_row(self, db: Database[WorkerTx], run_id: str) -> dict[str, Any] | None:
        """The run's lease columns (the spec's lease group) and status as committed now;
        None if the row is gone."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any] | None] = loop.create_future()
        waiting = self._waiting.get(db)
        if waiting is None:
            waiting = self._waiting[db] = {}
            # call_soon runs after every callback already due in this turn, so every run
            # whose check fell due with this one has asked by the time the query starts.
            loop.call_soon(self._flush_soon, db)
        waiting.setdefault(run_id, []).append(fut)
        return await fut

    def _flush_soon(self, db: Database[WorkerTx]) -> None:
        task = asyncio.ensure_future(self._flush(db, self._waiting.pop(db)))
        self._flushes.add(task)  # keep a reference until it is done
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, db: Database[WorkerTx],
                     waiting: dict[str, list[asyncio.Future[dict[str, Any] | None]]]) -> None:
        ids = list(waiting)
        rows: dict[str, dict[str, Any]] = {}
        try:
            policy = run_policy(db)
            columns = lease_columns(policy)
            found = await db.read(lambda tx: tx.read_leases(policy, ids, columns=columns))
            rows.update((r["id"], r) for r in found)
        except Exception as exc:  # each run treats it as a failed check and tries again
            for futures in waiting.values():
                for fut in futures:
                    if not fut.done():
                        fut.set_exception(exc)
            return
        for rid, futures in waiting.items():
            for fut in futures:
                if not fut.done():  # a run stopped while it waited cancels its future
                    fut.set_result(rows.get(rid))
