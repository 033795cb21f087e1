"""What the scheduler calls (:class:`ledgerq.queue.scheduling.store.SchedulingTx`)."""

from __future__ import annotations

from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import Row
from ledgerq.store.sqltx.base import SqlBase


class SchedulingOps(SqlBase):
    """A schedule's fires: the latest, the one of a slot, one still running."""

    def read_latest_fire(self, policy: EntityPolicy, schedule_id: str) -> Row | None:
        rows = self.dicts(self.execute(self.q("read_latest_fire", table=self.table(policy)),
                                       (schedule_id,)))
        return rows[0] if rows else None

    def find_run_for_slot(self, policy: EntityPolicy, schedule_id: str,
                          slot_at: float) -> str | None:
        row = self.execute(self.q("find_run_for_slot", table=self.table(policy)),
                           (schedule_id, slot_at)).fetchone()
        return None if row is None else str(row[0])

    def find_fire_in_progress(self, policy: EntityPolicy, schedule_id: str) -> str | None:
        ended: list[str | None] = [*sorted(policy.terminal)] or [None]
        sql = self.q("find_fire_in_progress", table=self.table(policy),
                     marks=self.marks(len(ended)))
        row = self.execute(sql, (schedule_id, *ended)).fetchone()
        return None if row is None else str(row[0])
