"""Projections: how facts fold into rows; history, verify and rebuild.

The queue's read models (runs listed, one run with its history, queue statistics,
waiting for runs to end) are the queue's own: ``ledgerq.queue``.
"""

from ledgerq.projections.log import Drift, RebuildReport, VerifyReport, history, rebuild, verify

__all__ = ["Drift", "RebuildReport", "VerifyReport", "history", "rebuild", "verify"]
