"""What submission calls (:class:`ledgerq.queue.submission.store.SubmissionTx`)."""

from __future__ import annotations

from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import Row
from ledgerq.store.sqltx.base import SqlBase


class SubmissionOps(SqlBase):
    """Idempotency keys and the wake-up a cancel sends."""

    def find_run_by_idempotency_key(self, policy: EntityPolicy, key: str) -> Row | None:
        rows = self.dicts(self.execute(
            self.q("find_run_by_idempotency_key", table=self.table(policy)), (key,)))
        return rows[0] if rows else None

    def notify_claimable(self) -> None:
        return None
