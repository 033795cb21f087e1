"""How long this process's runs took, by queue, task and outcome: a Prometheus histogram.

Unlike the other metrics (read from the database at scrape time, so every process
reports the same), a run's duration is observed where it ran: each worker process keeps
its own histogram and serves it with its ``/metrics`` (``Worker(metrics_port=)``,
``ledgerq worker --metrics-port``); Prometheus sums the workers' series. Measured from
the claim to the write of the run's end.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Histogram

#: Seconds: from a no-op task to hour-long ones.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0, 300.0, 900.0, 3600.0)

#: The process's own metrics (a registry of its own, not the global one).
REGISTRY = CollectorRegistry(auto_describe=False)

RUN_SECONDS = Histogram("ledgerq_run_duration_seconds",
                        "Seconds from a run's claim to its end, in this worker process.",
                        labelnames=("queue", "task", "outcome"), buckets=DURATION_BUCKETS,
                        registry=REGISTRY)


_children: dict[tuple[str, str, str], Any] = {}


def observe(queue: str, task: str, outcome: str, seconds: float) -> None:
    key = (queue, task, outcome)
    child = _children.get(key)
    if child is None:  # prometheus_client's own lookup checks and locks on every call
        child = _children[key] = RUN_SECONDS.labels(queue, task, outcome)
    child.observe(max(0.0, seconds))


__all__ = ["REGISTRY", "RUN_SECONDS", "observe"]
