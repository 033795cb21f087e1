"""Workers that stopped beating leave ``/metrics`` at once and the ``workers`` table after
a retention, so neither grows with every worker process that ever ran."""

from __future__ import annotations

import time

import pytest

from ledgerq import StateDB
from ledgerq.queue import register_heartbeat
from ledgerq.queue.maintenance.departed import (
    WORKER_RETENTION_SECONDS,
    forget_departed_workers,
)
from ledgerq.queue.reads import worker_statuses
from ledgerq.queue.worker.config import DEFAULT_HEARTBEAT_TTL_SECONDS


async def test_a_worker_silent_past_the_retention_is_forgotten(db: StateDB) -> None:
    now = time.time()
    await register_heartbeat(db, worker_id="gone", now=now - WORKER_RETENTION_SECONDS - 1)
    await register_heartbeat(db, worker_id="dead-today", now=now - 3600)
    await register_heartbeat(db, worker_id="alive", now=now)
    assert await forget_departed_workers(db, now=now) == ["gone"]
    assert sorted(w.worker_id for w in await worker_statuses(db)) == ["alive", "dead-today"]
    assert await forget_departed_workers(db, now=now) == []


async def test_a_dead_worker_leaves_the_metrics_at_once(db: StateDB) -> None:
    pytest.importorskip("prometheus_client")
    from ledgerq.web.metrics import render, take_snapshot

    now = time.time()
    await register_heartbeat(db, worker_id="dead-w", now=now - DEFAULT_HEARTBEAT_TTL_SECONDS - 5)
    await register_heartbeat(db, worker_id="live-w", now=now)
    body = render(await take_snapshot(db)).decode()
    assert 'worker_id="live-w"' in body and 'worker_id="dead-w"' not in body
    assert "ledgerq_workers 1.0" in body
