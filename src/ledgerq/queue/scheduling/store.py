"""The store operations the scheduler calls (beside the engine's and the queue's shared ones)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ledgerq.lifecycle.store import Row
from ledgerq.queue.store import SharedTx

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy


class SchedulingTx(SharedTx, Protocol):
    """What the scheduler's fires call."""

    def read_latest_fire(self, policy: EntityPolicy, schedule_id: str) -> Row | None:
        """``id``, ``status``, ``slot_at``, ``ended_at``, ``exit_code`` of the schedule's run
        with the latest slot (runs without a slot are not fires of ledgerq's scheduler)."""

    def find_run_for_slot(self, policy: EntityPolicy, schedule_id: str,
                          slot_at: float) -> str | None:
        """The id of the schedule's run for ``slot_at``, if that slot has fired."""

    def find_fire_in_progress(self, policy: EntityPolicy, schedule_id: str) -> str | None:
        """The id of one fire of the schedule that is in no terminal state (the spec's)."""
