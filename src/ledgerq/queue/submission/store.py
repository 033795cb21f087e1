"""The store operations submission calls (beside the engine's and the queue's shared ones)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from ledgerq.lifecycle.store import Row
from ledgerq.queue.store import SharedTx

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy


class SubmissionTx(SharedTx, Protocol):
    """What submit, cancel and rerun call."""

    def find_run_by_idempotency_key(self, policy: EntityPolicy, key: str) -> Row | None:
        """``id`` and ``application_digest`` of the run submitted under ``key``."""

    def read_task_kinds(self, names: Sequence[str] | None = None) -> list[Row]:
        """``name``, ``parameters`` (JSON Schema text), ``returns``, ``queue`` and
        ``recorded_at`` of the recorded task kinds among ``names`` (None: all), by name."""

    def record_task_kinds(self, kinds: Sequence[tuple[str, str, str | None, str | None, float,
                                                      str | None]]
                          ) -> None:
        """Insert or replace each ``(name, parameters, returns, queue, recorded_at, defaults)``."""

    def notify_claimable(self) -> None:
        """Tell workers of other processes and hosts that a row may have become claimable
        without entering the claim's source state (a cancel freed its concurrency key);
        delivered at commit; a no-op where the dialect has no such channel. A row that
        enters that state tells them by itself (PostgreSQL: a trigger)."""
