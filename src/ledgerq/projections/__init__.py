"""Projections: how facts fold into rows; history, verify and rebuild; read models."""

from ledgerq.projections.log import Drift, RebuildReport, VerifyReport, history, rebuild, verify
from ledgerq.projections.read_models import (
    QueueStats,
    RunPage,
    get_run,
    list_runs,
    queue_stats,
    resolve_run_id,
    run_history,
    wait_for_runs,
)

__all__ = [
    "Drift",
    "QueueStats",
    "RebuildReport",
    "RunPage",
    "VerifyReport",
    "get_run",
    "history",
    "list_runs",
    "queue_stats",
    "rebuild",
    "resolve_run_id",
    "run_history",
    "verify",
    "wait_for_runs",
]
