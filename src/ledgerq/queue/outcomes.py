"""How a run's end is written: one guarded move off ``running``, on the lease it ran under.

A write that finds the lease gone writes nothing (whoever took the row owns it now);
the run then counts as ``cancelled`` or ``lost`` in the worker's outcomes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledgerq.codec import loads
from ledgerq.errors import DatabaseUnavailable
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.operations import Tx
from ledgerq.queue import moves
from ledgerq.queue.application import RetryPolicy
from ledgerq.queue.moves import Move
from ledgerq.queue.promotion import settle_dependents
from ledgerq.queue.runs import no_lease, perform, run_policy, worker_actor

if TYPE_CHECKING:
    from ledgerq.queue.supervision import RunContext
    from ledgerq.store.db import StateDB

log = logging.getLogger("ledgerq.worker")

#: Longest error_detail kept on a row.
DETAIL_LIMIT = 4096


@dataclass(frozen=True)
class Outcome:
    """How a run ended, as its write records it: one of the queue's moves off ``running``.

    Its target need not be terminal: a run given back on shutdown goes to ``queued``.
    """

    move: Move
    exit_code: int | None = None
    detail: str | None = None
    #: The task itself failed (it exited non-zero or raised), so its retry policy may
    #: send it to ``retry_wait`` instead; a refusal before it ran is never retried.
    retryable: bool = False
    #: The fact's summary; None: the detail.
    summary: str | None = None
    #: The output tails to record (``stdout_tail``/``stderr_tail``), written with the
    #: fact that ends the run or sends it to retry_wait; empty when nothing ran.
    output: Mapping[str, str | None] = field(default_factory=dict)

    @property
    def to_state(self) -> str:
        return self.move.target


def lost_outcome(row: dict[str, Any] | None, lease: dict[str, Any]) -> str:
    """What a run whose lease went away counts as in a worker's outcomes.

    A cancel of the run under our lease (a cancel keeps the lease columns, so the token
    tells) ends it where it stands: that is its real outcome. Anything else (reaped,
    reclaimed, deleted; or cancelled under a later lease) is ``lost``: whatever the row
    says now was not done to this run.
    """
    cancelled = moves.CANCELLED.target
    if row is not None and row["status"] == cancelled \
            and row["lease_token"] == lease["lease_token"]:
        return cancelled
    return "lost"


def output_patch(policy: EntityPolicy, outcome: Outcome) -> dict[str, str | None]:
    """The output columns of ``outcome`` the loaded specs let a move patch: specs of a
    release before the output columns (a rolling upgrade) record none."""
    return {c: v for c, v in outcome.output.items() if c in policy.patch_columns}


def _finish(tx: Tx, policy: EntityPolicy, run: dict[str, Any], outcome: Outcome,
            guard: dict[str, Any], patch: dict[str, Any], now: float,
            worker_id: str) -> bool:
    summary = outcome.summary if outcome.summary is not None else outcome.detail or ""
    res = perform(tx, policy, run["id"], outcome.move, actor=worker_actor(worker_id),
                  summary=summary, guard=guard, patch=patch, now=now)
    if res.applied and outcome.to_state in policy.terminal:
        settle_dependents(tx, policy, [run["id"]], now)
    return res.applied


async def record_outcome(db: StateDB, policy: EntityPolicy, run: dict[str, Any],
                         lease: dict[str, Any], ctx: RunContext, outcome: Outcome) -> str:
    """Write ``outcome`` guarded on ``lease``; returns the state written, or how the run
    counts when the lease was gone (see :func:`lost_outcome`)."""
    if outcome.retryable:
        return await _fail(db, policy, run, lease, ctx, outcome)
    return await _end(db, policy, run, lease, ctx, outcome)


async def _fail(db: StateDB, policy: EntityPolicy, run: dict[str, Any], lease: dict[str, Any],
                ctx: RunContext, outcome: Outcome) -> str:
    """A failed run goes to retry_wait while its retry policy has attempts left (and the
    loaded specs have retries at all: older ones fail it plainly)."""
    raw = run.get("retry_policy")
    detail = outcome.detail or ""
    try:
        policy_ = RetryPolicy.from_dict(loads(raw)) if raw else None
    except Exception as exc:  # a hand-edited row: fail it plainly rather than strand it
        policy_ = None
        detail = f"{detail} (retry_policy unreadable: {exc})"
        outcome = dataclasses.replace(outcome, detail=detail)
    runs_done = int(run.get("run_attempts") or 0) + 1
    if policy_ is not None and runs_done < policy_.max_attempts \
            and moves.BACKOFF.offered_by(policy):
        now = ctx.clock()
        due = now + policy_.delay(runs_done)
        patch = {**no_lease(policy), "retry_due_at": due,
                 "run_attempts": runs_done, "exit_code": outcome.exit_code,
                 "error_detail": detail[-DETAIL_LIMIT:], **output_patch(policy, outcome)}
        retry = Outcome(moves.BACKOFF, outcome.exit_code, detail,
                        summary=f"attempt {runs_done} of {policy_.max_attempts} failed")
        applied = await _write_outcome(db, lambda tx: _finish(
            tx, policy, run, retry, dict(lease), patch, now, ctx.worker_id))
        return retry.to_state if applied else await _conflicted(db, run, lease, retry.to_state)
    return await _end(db, policy, run, lease, ctx, outcome)


async def _write_outcome(db: StateDB, unit: Callable[[Tx], bool],
                         attempts: int = 3) -> bool:
    """Write a run's outcome, retrying a transient database error a few times.

    Giving up leaves the row running until its lease expires and the reaper requeues
    it, i.e. the task runs again: worth a short wait here. The write is guarded, so a
    retry after a commit that did land simply conflicts.
    """
    for attempt in range(attempts):
        try:
            # Terminal writes of concurrent runs share a commit (PostgreSQL's group
            # commit; SQLite groups every write): each is still its own guarded move.
            return await db.write_together(unit)
        except DatabaseUnavailable as exc:
            if attempt == attempts - 1:
                raise
            log.warning("outcome write failed (%s); retrying", exc)
            await asyncio.sleep(0.2 * 2 ** attempt)
    raise AssertionError("unreachable")


async def _end(db: StateDB, policy: EntityPolicy, run: dict[str, Any], lease: dict[str, Any],
               ctx: RunContext, outcome: Outcome) -> str:
    now = ctx.clock()
    detail = outcome.detail
    if outcome.to_state not in policy.terminal:
        # graceful shutdown: not a failed attempt, give it back
        patch: dict[str, Any] = {**no_lease(policy),
                                 "lease_attempts": max(0, int(run["lease_attempts"]) - 1)}
    else:
        patch = {"ended_at": now, "exit_code": outcome.exit_code,
                 "error_detail": detail[-DETAIL_LIMIT:] if detail else None,
                 "run_attempts": int(run.get("run_attempts") or 0) + 1,
                 **output_patch(policy, outcome)}
    applied = await _write_outcome(db, lambda tx: _finish(
        tx, policy, run, outcome, dict(lease), patch, now, ctx.worker_id))
    if not applied:
        return await _conflicted(db, run, lease, outcome.to_state)
    return outcome.to_state


async def _conflicted(db: StateDB, run: dict[str, Any], lease: dict[str, Any],
                      to_state: str) -> str:
    """The outcome of a run whose final write found the lease gone (see lost_outcome)."""
    log.info("run %s: write of %s conflicted (lease no longer ours)", run["id"], to_state)
    try:
        policy = run_policy(db)
        rows = await db.read(lambda tx: tx.lease_rows(policy, [run["id"]]))
        row = rows[0] if rows else None
    except Exception:  # only the count depends on it: lost is the safe answer
        return "lost"
    return lost_outcome(row, lease)
