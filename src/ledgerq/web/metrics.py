"""Prometheus metrics: one snapshot of the database, rendered by ``prometheus_client``.

Everything is read from the database at scrape time (or, in a worker process, at its
refresh interval), not counted in this process: the transition counters come from the
log (a count per reason code over ``status_transitions``), so they survive restarts and
agree across every server and worker scraping the same database. A process-local counter
would reset with the process and count only what that process saw.

Names are prefixed ``ledgerq_``:

* ``ledgerq_runs{status}`` gauge: runs per status (every declared state, zeros included).
* ``ledgerq_oldest_queued_age_seconds`` gauge.
* ``ledgerq_transitions_total{entity,reason_code}`` counter: facts per reason code.
* ``ledgerq_lease_renewals_total`` / ``ledgerq_lease_expiries_total`` counters: the facts
  of those moves (an expiry is a requeue by the reaper or a run failed for exhausting its
  leases).
* ``ledgerq_claim_wait_seconds`` histogram: for every claim, the time from the fact that
  queued the run (its submission, a requeue, a retry falling due) to the claim.
* ``ledgerq_workers`` gauge; ``ledgerq_worker_heartbeat_age_seconds{worker_id}`` and
  ``ledgerq_worker_last_heartbeat_timestamp_seconds{worker_id}`` gauges;
  ``ledgerq_worker_running{worker_id}`` gauge: workers alive only (a heartbeat within
  the default heartbeat TTL), so a worker that died leaves the metrics at once.
* ``ledgerq_stuck_runs`` gauge (see ``ledgerq stats``).
* ``ledgerq_run_duration_seconds{queue,task,outcome}`` histogram, served by a worker's
  exporter only: the runs that process executed, from claim to end (observed where they
  ran; see ``ledgerq.queue.worker.durations``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from ledgerq.queue import moves
from ledgerq.queue.reads import (
    QueueStats,
    WaitHistogram,
    claim_wait_histogram,
    fact_counts,
    queue_stats,
)
from ledgerq.queue.worker.config import DEFAULT_HEARTBEAT_TTL_SECONDS

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ledgerq.store.db import StateDB

log = logging.getLogger(__name__)

#: Claim wait buckets (seconds): sub-second claims by a busy worker up to hour-long queues.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0, 900.0, 3600.0)
RENEWAL_CODES = (moves.RENEWED.code,)
EXPIRY_CODES = (moves.LEASE_EXPIRED.code, moves.LEASES_EXHAUSTED.code)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Snapshot:
    """What one scrape reports, read in three snapshots of the database."""

    stats: QueueStats
    facts: list[tuple[str, str, int]]
    waits: WaitHistogram


async def take_snapshot(db: StateDB) -> Snapshot:
    return Snapshot(await queue_stats(db), await fact_counts(db),
                    await claim_wait_histogram(db, WAIT_BUCKETS))


class SnapshotCollector(Collector):
    """Yields the metric families of the latest snapshot it was given."""

    def __init__(self, snapshot: Snapshot | None = None) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        if snap is None:
            return
        runs = GaugeMetricFamily("ledgerq_runs", "Runs per status.", labels=["status"])
        for status, n in snap.stats.counts.items():
            runs.add_metric([status], n)
        yield runs
        yield GaugeMetricFamily("ledgerq_oldest_queued_age_seconds",
                                "Age of the oldest queued run (0 when none is queued).",
                                value=snap.stats.oldest_queued_age_seconds or 0.0)
        yield GaugeMetricFamily("ledgerq_stuck_runs", "Runs no pass will move as things "
                                "stand (see ledgerq stats).", value=snap.stats.stuck)
        transitions = CounterMetricFamily("ledgerq_transitions", "Facts in the log per "
                                          "reason code.", labels=["entity", "reason_code"])
        renewals = expiries = 0
        for entity, code, n in snap.facts:
            transitions.add_metric([entity, code], n)
            if entity == moves.ENTITY:
                renewals += n if code in RENEWAL_CODES else 0
                expiries += n if code in EXPIRY_CODES else 0
        yield transitions
        yield CounterMetricFamily("ledgerq_lease_renewals", "Lease renewals (facts).",
                                  value=renewals)
        yield CounterMetricFamily("ledgerq_lease_expiries", "Leases that expired and were "
                                  "reaped (requeued or failed).", value=expiries)
        w = snap.waits
        buckets = [(repr(b), n) for b, n in zip(w.bounds, w.cumulative, strict=True)]
        buckets.append(("+Inf", w.count))
        yield HistogramMetricFamily("ledgerq_claim_wait_seconds", "Time from entering "
                                    "queued (submission, requeue, retry due) to the claim.",
                                    buckets=buckets, sum_value=w.sum)
        # A worker presumed dead leaves the metrics at once (its row stays in `ledgerq
        # workers` for a day): series of every worker that ever ran would grow forever.
        workers = [w for w in snap.stats.workers
                   if w.heartbeat_age_seconds <= DEFAULT_HEARTBEAT_TTL_SECONDS]
        yield GaugeMetricFamily("ledgerq_workers", "Workers alive: a heartbeat at most "
                                f"{DEFAULT_HEARTBEAT_TTL_SECONDS:g} s old.", value=len(workers))
        age = GaugeMetricFamily("ledgerq_worker_heartbeat_age_seconds",
                                "Seconds since the worker's last heartbeat.",
                                labels=["worker_id"])
        last = GaugeMetricFamily("ledgerq_worker_last_heartbeat_timestamp_seconds",
                                 "The worker's last heartbeat (epoch seconds).",
                                 labels=["worker_id"])
        running = GaugeMetricFamily("ledgerq_worker_running", "Runs the worker leases.",
                                    labels=["worker_id"])
        for info in workers:
            age.add_metric([info.worker_id], info.heartbeat_age_seconds)
            last.add_metric([info.worker_id], info.last_heartbeat_at)
            running.add_metric([info.worker_id], info.running)
        yield age
        yield last
        yield running


class _Joined(Collector):
    """Another registry's metrics, served beside the snapshot's."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        yield from self.registry.collect()


def render(snapshot: Snapshot) -> bytes:
    """The Prometheus text exposition of one snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return generate_latest(registry)


async def exporter(db: StateDB, port: int, *, host: str = "127.0.0.1",
                   interval: float = 5.0, bound: asyncio.Event | None = None) -> None:
    """Serve ``/metrics`` of ``db`` on ``port`` for a worker process, until cancelled.

    prometheus_client's server runs in a thread and cannot await the database, so this
    task refreshes the snapshot every ``interval`` seconds and the thread serves the
    latest one. A failed refresh keeps the last snapshot (and is logged). ``bound`` is
    set once the port is served; a port that cannot be bound ends the task with its
    OSError before that.
    """
    from prometheus_client import start_http_server

    from ledgerq.queue.worker import durations

    collector = SnapshotCollector(await take_snapshot(db))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    # The runs this process executed: their durations are observed here, not read.
    registry.register(_Joined(durations.REGISTRY))
    server, thread = start_http_server(port, addr=host, registry=registry)
    if bound is not None:
        bound.set()
    delay = min(interval, 0.5)  # soon after start: the worker has registered by then
    try:
        while True:
            await asyncio.sleep(delay)
            delay = interval
            try:
                collector.snapshot = await take_snapshot(db)
            except Exception as exc:
                log.warning("metrics refresh failed: %s", exc)
    finally:
        with contextlib.suppress(Exception):
            server.shutdown()
            server.server_close()
        thread.join(timeout=5)
