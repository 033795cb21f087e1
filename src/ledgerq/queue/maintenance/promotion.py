"""Runs waiting on time or on other runs become claimable: due retries and settled dependencies.

Settling is done in two places: right after a run ends (its dependents, inside the
ending write) and by a sweep that catches whatever that missed, row by row.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.dependencies import CASCADE_CHUNK, resolve_dependents
from ledgerq.queue.maintenance.stuck import StuckRows, Swept, isolated, record, tracked, unskipped
from ledgerq.queue.runs import perform, run_policy

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.maintenance.store import MaintenanceTx
    from ledgerq.queue.store import SharedTx

log = logging.getLogger("ledgerq.worker")

#: Waiting rows one transaction of the dependency sweep settles (their cascades
#: included: see :data:`~ledgerq.queue.dependencies.CASCADE_CHUNK`); a larger backlog is
#: settled in more transactions, with other writers in between.
SWEEP_CHUNK = CASCADE_CHUNK


def settle_dependents(tx: SharedTx, policy: EntityPolicy, run_ids: list[str],
                      now: float) -> None:
    """Release or cancel the dependents of runs that just ended, never failing the end.

    A dependent that cannot be moved must not undo its dependency's terminal write
    (the run would stay running until its lease expired and then run again): its part
    is rolled back alone, and the dependency sweep retries it row by row.
    """
    # Most runs have no dependents: look before opening a savepoint (the look is a read;
    # what can fail is moving them).
    if not tx.list_dependents(policy, run_ids):
        return
    _, err = isolated(tx, functools.partial(resolve_dependents, now=now), tx, policy, run_ids)
    if err is not None:
        log.warning("dependents of %s not settled (%s); the dependency sweep retries them",
                    ", ".join(run_ids), err)


def _retry_one(tx: MaintenanceTx, policy: EntityPolicy, row: dict[str, Any], now: float) -> bool:
    return perform(tx, policy, row["id"], moves.RETRY_DUE,
                   guard={"retry_due_at": row["retry_due_at"]},
                   patch={"lease_attempts": 0, "retry_due_at": None, "queued_at": now},
                   now=now).applied


def _start_one(tx: MaintenanceTx, policy: EntityPolicy, row: dict[str, Any], now: float) -> bool:
    return perform(tx, policy, row["id"], moves.START_DUE, patch={"queued_at": now},
                   now=now).applied


def _promote(tx: MaintenanceTx, policy: EntityPolicy, now: float,
             skip: frozenset[str] = frozenset(), *, retries: bool = True,
             dependencies: bool = True, starts: bool = True) -> Swept:
    swept = Swept({"retried": 0, "released": 0, "cancelled": 0, "started": 0})
    # Each kind a chunk per transaction (skipped rows aside), like the dependency sweep:
    # ten thousand delayed runs falling due at once are not one long transaction.
    limit = len(skip) + SWEEP_CHUNK
    if starts:
        due = tx.list_due_starts(policy, now, limit=limit)
        swept.more = len(due) == limit
        for row in due:
            if row["id"] in skip:
                continue
            applied, err = isolated(tx, _start_one, tx, policy, row, now)
            if err is not None:
                swept.failures[row["id"]] = err
                continue
            swept.tried.append(row["id"])
            swept.counts["started"] += int(bool(applied))
    if retries:
        due = tx.list_due_retries(policy, now, limit=limit)
        swept.more = swept.more or len(due) == limit
        for row in due:
            if row["id"] in skip:
                continue
            applied, err = isolated(tx, _retry_one, tx, policy, row, now)
            if err is not None:
                swept.failures[row["id"]] = err
                continue
            swept.tried.append(row["id"])
            swept.counts["retried"] += int(bool(applied))
    if dependencies:
        listed = tx.list_settled_waiting(policy, limit=limit)
        settled = [r for r in listed if r not in skip][:SWEEP_CHUNK]
        _sweep(tx, policy, settled, now, swept)
        # More to settle: the rest of a backlog, or of a cascade this chunk cut short.
        swept.more = len(settled) == SWEEP_CHUNK or swept.more
    return swept


def _sweep(tx: MaintenanceTx, policy: EntityPolicy, ids: list[str], now: float,
           swept: Swept) -> None:
    """Settle waiting rows together; when that raises, row by row, so one row fails alone.

    A row settles with its own cascade (cancelling a run cancels its dependents), so a
    row whose cascade meets an unmovable dependent is the one reported.
    """
    def settle(part: list[str]) -> None:
        got = resolve_dependents(tx, policy, part, waiting=True, now=now)
        swept.counts["released"] += got.released
        swept.counts["cancelled"] += got.cancelled
        swept.more = swept.more or bool(got.left)

    if isolated(tx, settle, ids)[1] is None:
        swept.tried += ids
        return
    for rid in ids:
        _, err = isolated(tx, settle, [rid])
        if err is None:
            swept.tried.append(rid)
        else:
            swept.failures[rid] = err


def _due_ids(tx: MaintenanceTx, policy: EntityPolicy, now: float, limit: int, retries: bool,
             dependencies: bool, starts: bool) -> list[str]:
    """Up to ``limit`` ids of each kind a promotion pass would move (a cheap read first)."""
    ids = [r["id"] for r in tx.list_due_retries(policy, now, limit=limit)] if retries else []
    ids += [r["id"] for r in tx.list_due_starts(policy, now, limit=limit)] if starts else []
    return ids + (tx.list_settled_waiting(policy, limit=limit) if dependencies else [])


async def promote_due(db: Database[MaintenanceTx], *, now: float | None = None,
                      stuck: StuckRows | None = None) -> dict[str, int]:
    """Queue delayed runs whose start time came and due retries, and settle waiting runs
    whose dependencies ended.

    Specs that do not declare ``retry_wait`` (or ``waiting_dependency``) are an older
    version of the queue's: their rows in that state are left alone (the queue leaves out
    the moves of a feature whose state the spec lacks; docs/specs.md, "What the queue
    needs of ``schedule_run``"). A row whose move raises is skipped and reported
    through ``stuck``.
    """
    policy = run_policy(db)
    ts = time.time() if now is None else now
    tracker = tracked(stuck)
    retries = moves.RETRY_DUE.offered_by(policy)
    dependencies = moves.DEPENDENCIES_MET.offered_by(policy)
    starts = moves.START_DUE.offered_by(policy)
    for feature, ok in ((moves.RETRY_DUE, retries), (moves.DEPENDENCIES_MET, dependencies),
                        (moves.START_DUE, starts)):
        if not ok:
            tracker.note_once(f"undeclared:{feature.feature}",
                              "the loaded specs do not declare %s: its rows are left alone "
                              "(ledgerq stats counts them as stuck)", feature.feature)
    none = {"retried": 0, "released": 0, "cancelled": 0, "started": 0}
    if not (retries or dependencies or starts):
        return none
    skip = tracker.skipping()
    due = await db.read(lambda tx: _due_ids(tx, policy, ts, len(skip) + 1, retries,
                                            dependencies, starts))
    if not unskipped(due, skip):
        return none
    swept = await db.write(lambda tx: _promote(
        tx, policy, ts, skip, retries=retries, dependencies=dependencies, starts=starts))
    counts = record(tracker, "promotion", swept)
    # A backlog (a cascade through a long chain, a run with thousands of dependents,
    # thousands of delayed runs falling due at once) goes on in transactions of a chunk
    # each, while they move rows: never one long hold of the write lock or of the loop.
    while swept.more and any(swept.counts.values()):
        swept = await db.write(functools.partial(
            _promote, policy=policy, now=ts, skip=tracker.skipping(), retries=retries,
            starts=starts, dependencies=dependencies))
        for key, n in record(tracker, "promotion", swept).items():
            counts[key] += n
    return counts
