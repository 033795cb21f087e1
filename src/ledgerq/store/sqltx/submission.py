"""What submission calls (:class:`ledgerq.queue.submission.store.SubmissionTx`)."""

from __future__ import annotations

from collections.abc import Sequence

from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import Row
from ledgerq.store.sqltx.base import SqlBase


class SubmissionOps(SqlBase):
    """Idempotency keys and the wake-up a cancel sends."""

    def find_run_by_idempotency_key(self, policy: EntityPolicy, key: str) -> Row | None:
        rows = self.dicts(self.execute(
            self.q("find_run_by_idempotency_key", table=self.table(policy)), (key,)))
        return rows[0] if rows else None

    def read_task_kinds(self, names: Sequence[str] | None = None) -> list[Row]:
        if names is None:
            return self.dicts(self.execute(self.q("read_all_task_kinds")))
        if not names:
            return []
        return self.dicts(self.execute(
            self.q("read_task_kinds", marks=self.marks(len(names))), tuple(names)))

    def record_task_kinds(self, kinds: Sequence[tuple[str, str, str | None, str | None, float,
                                                      str | None]]
                          ) -> None:
        for row in kinds:
            self.execute(self.q("record_task_kind"), row)

    def notify_claimable(self) -> None:
        return None
