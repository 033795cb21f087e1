"""Projections: how facts fold into rows; history, verify and rebuild."""

from ledgerq.projections.log import Drift, RebuildReport, VerifyReport, history, rebuild, verify

__all__ = ["Drift", "RebuildReport", "VerifyReport", "history", "rebuild", "verify"]
