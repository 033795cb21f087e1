"""What a worker calls (:class:`ledgerq.queue.worker.store.WorkerTx`)."""

from __future__ import annotations

from collections.abc import Sequence

from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import Row
from ledgerq.store.sqltx.base import PRIORITY_COLUMN, QUEUE_COLUMN, SLOT_COLUMN, SqlBase

#: Which action kinds a claim takes: (names, only): only those names, or all but them
#: (the queue's ``Kinds``).
KindFilter = tuple[tuple[str, ...], bool]


class WorkerOps(SqlBase):
    """Heartbeats, the claim scan, concurrency keys, leases, stop requests."""

    def upsert_worker(self, worker_id: str, capabilities: str, targets: str, now: float,
                      hostname: str, pid: int, queues: str, kinds: str | None = None) -> None:
        self.execute(self.q("upsert_worker"),
                     (worker_id, capabilities, targets, now, hostname, pid, now, queues, kinds))

    def read_worker_heartbeat(self, worker_id: str) -> float | None:
        row = self.execute(self.q("read_worker_heartbeat"), (worker_id,)).fetchone()
        return None if row is None else float(row[0])

    def request_worker_stop(self, worker_id: str, now: float) -> bool:
        return self.execute(self.q("request_worker_stop"), (now, worker_id)).fetchone() \
            is not None

    def read_worker_stop_request(self, worker_id: str) -> float | None:
        row = self.execute(self.q("read_worker_stop_request"), (worker_id,)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def read_claim_page(self, policy: EntityPolicy, kinds: KindFilter, queue: str,
                        after: tuple[int, float, str] | None, limit: int, *,
                        columns: tuple[str, ...], default_queue: str) -> list[Row]:
        if QUEUE_COLUMN not in policy.columns or PRIORITY_COLUMN not in policy.columns:
            # Specs that predate queues: every run is priority 0 in the default queue.
            if queue != default_queue:
                return []
            rows = self._claim_rows(policy, "claim_unqueued", kinds, columns,
                                    (float("-inf"), "") if after is None else after[1:], limit)
            return [{**r, PRIORITY_COLUMN: 0, QUEUE_COLUMN: default_queue} for r in rows]
        # Two index ranges, each read in order: the rest of the cursor's priority level,
        # then every level below it (from the top when there is no cursor yet).
        rows = []
        if after is not None:
            rows = self._claim_rows(policy, "claim_level", kinds, columns,
                                    (queue, *after), limit)
            if len(rows) >= limit:
                return rows
        below = () if after is None else (after[0],)
        return rows + self._claim_rows(policy, "claim_below", kinds, columns,
                                       (queue, *below), limit - len(rows), bounded=bool(below))

    def _claim_rows(self, policy: EntityPolicy, name: str, kinds: KindFilter,
                    columns: tuple[str, ...], keys: Sequence[object], limit: int, *,
                    bounded: bool = False) -> list[Row]:
        names, only = kinds
        if only and not names:
            return []
        # (The claimable state's name too: a text rendered for other names is not this.)
        key = (name, policy.table, len(names), only, columns, bounded,
               self.states(policy)["queued"])
        sql = self._texts.get(key)
        if sql is None:
            kind_filter = (self.q("kinds_only" if only else "kinds_excluded",
                                  marks=self.marks(len(names)))
                           if names else "")
            # Fires of ledgerq's own scheduler (a slot recorded) are queue rows; rows an
            # external scheduler recorded are never claimed (the ADR-0071 queue's rule). Specs
            # without the slot column predate the scheduler: every scheduled row is external.
            scope = self.q("claimable_scheduled" if SLOT_COLUMN in policy.columns
                           else "claimable_unscheduled")
            sql = self._texts[key] = self.of(
                name, policy,
                columns=", ".join(quote(c) for c in columns if c in policy.columns),
                hint=self.hint(policy, "queued", QUEUE_COLUMN if name != "claim_unqueued"
                               else "queued_at"),
                kinds=kind_filter, scope=scope,
                bound=self.q("priority_below") if bounded else "")
        return self.dicts(self.execute(sql, (*keys, *names, limit)))

    def list_running_keys(self, policy: EntityPolicy) -> set[str]:
        sql = self.of("list_running_keys", policy,
                      hint=self.hint(policy, "running", "lease_expires_at"))
        return {r[0] for r in self.execute(sql).fetchall()}

    def is_key_running(self, policy: EntityPolicy, key: str) -> bool:
        sql = self.of("is_key_running", policy,
                      hint=self.hint(policy, "running", "concurrency_key"))
        return self.execute(sql, (key,)).fetchone() is not None

    def read_leases(self, policy: EntityPolicy, ids: Sequence[str], *,
                    columns: tuple[str, ...]) -> list[Row]:
        return self._chunked_rows("read_leases", policy, ids,
                                  columns=", ".join(quote(c) for c in columns))
