"""Leases nobody renews any more: their runs go back to the queue, or fail after a few.

A lease lapses when its worker died or lost the database for longer than the TTL; the
run may have done some of its work, so it gets another worker a bounded number of times.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.maintenance.promotion import settle_dependents
from ledgerq.queue.maintenance.stuck import StuckRows, Swept, isolated, record, tracked, unskipped
from ledgerq.queue.moves import expired_columns
from ledgerq.queue.runs import lease_of, no_lease, perform, run_policy

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.maintenance.store import MaintenanceTx

MAX_LEASE_ATTEMPTS = 3


def _reap(tx: MaintenanceTx, policy: EntityPolicy, now: float,
          skip: frozenset[str] = frozenset()) -> Swept:
    swept = Swept({"requeued": 0, "failed": 0})
    for row in tx.list_expired_leases(policy, now, columns=expired_columns(policy)):
        if row["id"] in skip:
            continue
        counted, err = isolated(tx, _reap_one, tx, policy, row, now)
        if err is not None:
            swept.failures[row["id"]] = err
            continue
        swept.tried.append(row["id"])
        if counted:
            swept.counts[counted] += 1
    return swept


def _reap_one(tx: MaintenanceTx, policy: EntityPolicy, row: dict[str, Any], now: float) -> str:
    """Requeue or fail one expired lease; returns the count it adds to ("" if none).

    A row another transaction holds is left for a later pass (``skip_locked``): its
    holder may be the lease's own worker, cut off mid-write (a partition), whose locks
    the server keeps until it ends that session; a reaper waiting for them would stall
    every worker's passes meanwhile, while the other expired rows wait behind it."""
    guard = lease_of(policy, row)
    if row["lease_attempts"] < MAX_LEASE_ATTEMPTS:
        res = perform(tx, policy, row["id"], moves.LEASE_EXPIRED,
                      summary=f"lease of {row['leased_by']} expired", guard=guard,
                      patch=no_lease(policy), now=now, skip_locked=True,
                      metadata={"expired_worker": row["leased_by"]})
        return "requeued" if res.applied else ""
    detail = (f"lease expired {row['lease_attempts']} times "
              f"(last holder {row['leased_by']})")
    res = perform(tx, policy, row["id"], moves.LEASES_EXHAUSTED, summary=detail, guard=guard,
                  patch={"ended_at": now, "error_detail": detail}, now=now, skip_locked=True,
                  metadata={"expired_worker": row["leased_by"]})
    if not res.applied:
        return ""
    settle_dependents(tx, policy, [row["id"]], now)
    return "failed"


async def reap_expired_leases(db: Database[MaintenanceTx], *, now: float | None = None,
                              stuck: StuckRows | None = None) -> dict[str, int]:
    """Return expired leases to the queue, or fail rows whose leases expired 3 times.

    A row whose move raises is skipped and reported through ``stuck`` (default: the
    process-wide tracker); the other expired rows are reaped all the same.
    """
    policy = run_policy(db)
    ts = time.time() if now is None else now
    tracker = tracked(stuck)
    skip = tracker.skipping()
    columns = expired_columns(policy)
    expired = await db.read(lambda tx: [r["id"] for r in tx.list_expired_leases(
        policy, ts, limit=len(skip) + 1, columns=columns)])
    if not unskipped(expired, skip):
        return {"requeued": 0, "failed": 0}  # nothing expired: skip the write lock
    return record(tracker, "reaper", await db.write(lambda tx: _reap(tx, policy, ts, skip)))
