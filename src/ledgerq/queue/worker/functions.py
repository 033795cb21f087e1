"""Worker functions: heartbeat, reap, claim and execute under leases.

The ADR-0071 queue's function API, with its signatures and defaults; each call
builds one :class:`~ledgerq.queue.worker.config.WorkerConfig` and hands it to the modules
that do the work (heartbeat, reaper, promotion, claim, supervision, outcomes). The
names tests and callers import from here are re-exported from those modules.

Every status change is a guarded move through the transition engine, so every move
is one fact. Claims, renewals and terminal writes of concurrent runs share commits
through StateDB's group commit; each is still its own guarded transition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledgerq.queue.maintenance.promotion import SWEEP_CHUNK, promote_due
from ledgerq.queue.maintenance.reaper import MAX_LEASE_ATTEMPTS, reap_expired_leases
from ledgerq.queue.maintenance.stuck import PROCESS_STUCK, STUCK_RETRY_SECONDS, StuckRow, StuckRows
from ledgerq.queue.worker.claim import PAGE_SIZE, SCAN_CAP, ClaimPass, claim_pass, claim_runs
from ledgerq.queue.worker.config import (
    DEFAULT_CLAIM_LIMIT,
    DEFAULT_HEARTBEAT_TTL_SECONDS,
    DEFAULT_LEASE_TTL_SECONDS,
    LEASE_CHECK_SECONDS,
    Authorize,
    RunContext,
    WorkerConfig,
    check_interval_for,
)
from ledgerq.queue.worker.executors import Executors
from ledgerq.queue.worker.heartbeat import beat
from ledgerq.queue.worker.keeper import RENEW_FRACTION
from ledgerq.queue.worker.launcher import ExecuteFn
from ledgerq.queue.worker.outcomes import DETAIL_LIMIT, Outcome
from ledgerq.queue.worker.supervision import (
    TIMEOUT_EXIT_CODE,
    LeaseLost,
    begin_runs,
    execute_claimed,
    write_ended,
)

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.worker.store import ServiceTx

__all__ = [
    "DEFAULT_CLAIM_LIMIT",
    "DEFAULT_HEARTBEAT_TTL_SECONDS",
    "DEFAULT_LEASE_TTL_SECONDS",
    "DETAIL_LIMIT",
    "LEASE_CHECK_SECONDS",
    "MAX_LEASE_ATTEMPTS",
    "PAGE_SIZE",
    "PROCESS_STUCK",
    "RENEW_FRACTION",
    "SCAN_CAP",
    "STUCK_RETRY_SECONDS",
    "SWEEP_CHUNK",
    "TIMEOUT_EXIT_CODE",
    "Authorize",
    "ClaimPass",
    "Executors",
    "LeaseLost",
    "Outcome",
    "RunContext",
    "StuckRow",
    "StuckRows",
    "WorkerConfig",
    "check_interval_for",
    "claim_and_execute",
    "claim_runs",
    "execute_claimed",
    "promote_due",
    "reap_expired_leases",
    "register_heartbeat",
    "worker_tick",
]

log = logging.getLogger("ledgerq.worker")

async def register_heartbeat(db: Database[ServiceTx], *, worker_id: str,
                             advertised_capabilities: list[str] | None = None,
                             execution_targets: list[str] | None = None,
                             now: float | None = None) -> None:
    """Upsert this worker's row: what it serves and when it was last alive."""
    # Given none, the heartbeat advertises no target (a claim then serves host), as in
    # the ADR-0071 queue.
    await beat(db, WorkerConfig.build(worker_id=worker_id,
                                      advertised_capabilities=advertised_capabilities,
                                      execution_targets=execution_targets or []), now=now)


def _fixed_clock(now: float | None) -> Callable[[], float]:
    if now is None:
        return time.time
    start = time.monotonic()
    return lambda: now + (time.monotonic() - start)


async def _claim_and_execute(db: Database[ServiceTx], config: WorkerConfig, now: float | None,
                             stuck: StuckRows | None) -> int:
    claimed = await claim_pass(db, config, now=now, stuck=stuck)
    ctx = RunContext.from_config(config, clock=_fixed_clock(now))
    begun = begin_runs(db, claimed.claimed, ctx)
    going: list[Any] = []
    written: list[Any]
    if not begun.going:  # every run ended in its first step: nothing to gather
        written = await write_ended(db, begun.ended, ctx)
    else:
        # One gather: a cancel of this call reaches the runs still going too.
        ended, *going = await asyncio.gather(
            write_ended(db, begun.ended, ctx), *(coro for _, coro in begun.going),
            return_exceptions=True)
        written = [ended] * len(begun.ended) if isinstance(ended, BaseException) else ended
    for run, got in [*begun.settled(written),
                     *zip([run for run, _ in begun.going], going, strict=True)]:
        if isinstance(got, BaseException):  # the others still ran to their end
            log.error("run %s: supervisor failed: %r", run["id"], got)
    return len(claimed.claimed)


async def claim_and_execute(db: Database[ServiceTx], *, worker_id: str,
                            execute: ExecuteFn | None = None,
                            now: float | None = None,
                            lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
                            limit: int = DEFAULT_CLAIM_LIMIT,
                            advertised_capabilities: list[str] | None = None,
                            execution_targets: list[str] | None = None,
                            heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
                            adapters: Mapping[str, ExecuteFn] | None = None,
                            authorize: Authorize | None = None,
                            lock_dir: str | Path | None = None,
                            stuck: StuckRows | None = None,
                            queues: Iterable[str] | None = None) -> int:
    """One claim pass, then run every claimed row concurrently to its end; returns claims.

    Beyond the ADR-0071 queue: claimed rows run concurrently (not one after another), leases
    are renewed while they run, and terminal writes record ended_at/exit_code/error_detail.
    Leases are checked every :func:`check_interval_for` ``lease_ttl`` seconds.
    """
    config = WorkerConfig.build(
        worker_id=worker_id, lease_ttl=lease_ttl, heartbeat_ttl=heartbeat_ttl,
        claim_limit=limit, advertised_capabilities=advertised_capabilities,
        execution_targets=execution_targets, execute=execute, adapters=adapters,
        authorize=authorize, lock_dir=lock_dir, queues=queues)
    return await _claim_and_execute(db, config, now, stuck)


async def worker_tick(db: Database[ServiceTx], *, worker_id: str, execute: ExecuteFn | None = None,
                      now: float | None = None, lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
                      limit: int = DEFAULT_CLAIM_LIMIT,
                      advertised_capabilities: list[str] | None = None,
                      execution_targets: list[str] | None = None,
                      heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
                      adapters: Mapping[str, ExecuteFn] | None = None,
                      authorize: Authorize | None = None,
                      lock_dir: str | Path | None = None,
                      stuck: StuckRows | None = None,
                      queues: Iterable[str] | None = None) -> dict[str, int]:
    """Heartbeat, reap, then claim and execute: the ADR-0071 queue's tick, in that order.

    Rows a pass cannot move are skipped and reported through ``stuck`` (default: the
    process-wide tracker), so they never stop the tick's other rows.
    """
    config = WorkerConfig.build(
        worker_id=worker_id, lease_ttl=lease_ttl, heartbeat_ttl=heartbeat_ttl,
        claim_limit=limit, advertised_capabilities=advertised_capabilities,
        execution_targets=execution_targets, execute=execute, adapters=adapters,
        authorize=authorize, lock_dir=lock_dir, queues=queues)
    await beat(db, config, now=now)
    reaped = await reap_expired_leases(db, now=now, stuck=stuck)
    await promote_due(db, now=now, stuck=stuck)
    claimed = await _claim_and_execute(db, config, now, stuck)
    return {"requeued": reaped["requeued"], "failed": reaped["failed"], "claimed": claimed}
