"""What the read models call (:class:`ledgerq.queue.store.ReadsTx`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import Row
from ledgerq.store.sqltx.base import PRIORITY_COLUMN, QUEUE_COLUMN, SqlBase


class ReadOps(SqlBase):
    """Pages, counts, the log's tail, workers, the oldest queued run."""

    def read_facts_after(self, entity_type: str, after_id: str, limit: int) -> list[Row]:
        return self.dicts(self.execute(self.q("read_facts_after"),
                                       (after_id, entity_type, limit)))

    def count_facts(self) -> int:
        return int(self.execute(self.q("count_facts")).fetchone()[0])

    def list_workers(self) -> list[Row]:
        return self.dicts(self.execute(self.q("list_workers")))

    def list_worker_rows(self) -> list[Row]:
        return self.dicts(self.execute(self.q("list_worker_rows")))

    def read_page_before(self, policy: EntityPolicy, filters: dict[str, list[Any]],
                         columns: tuple[str, ...], before: tuple[float, str] | None,
                         limit: int) -> list[Row]:
        terms, params = self._in_lists(filters)
        if before is not None:
            terms.append(self.q("and_before"))
            params += list(before)
        where = self.q("where", terms=" ".join(terms)) if terms else ""
        return self.dicts(self.execute(
            self.q("read_page_before", table=self.table(policy), where=where,
                   columns=", ".join(quote(c) for c in columns)), [*params, limit]))

    def count_facts_by_reason(self) -> list[tuple[str, str, int]]:
        return [(r[0], r[1], int(r[2]))
                for r in self.execute(self.q("count_facts_by_reason")).fetchall()]

    def read_wait_histogram(self, entity_type: str, reason_code: str,
                            bounds: Sequence[float]) -> tuple[list[int], int, float]:
        buckets = " ".join(self.q("wait_bucket") for _ in bounds)
        row = self.execute(self.q("read_wait_histogram", buckets=buckets),
                           [*bounds, entity_type, reason_code]).fetchone()
        return [int(n or 0) for n in row[2:]], int(row[0]), float(row[1] or 0.0)

    def list_ids_matching(self, policy: EntityPolicy, piece: str, *, suffix: bool,
                          limit: int) -> list[str]:
        pattern = f"%{piece}" if suffix else f"{piece}%"
        sql = self.q("ids_like", table=self.table(policy))
        return [r[0] for r in self.execute(sql, (pattern, limit)).fetchall()]

    def count_statuses(self, policy: EntityPolicy) -> dict[str, int]:
        rows = self.execute(self.q("count_statuses", table=self.table(policy))).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def list_queued_kinds(self, policy: EntityPolicy) -> list[str]:
        rows = self.execute(self.of("list_queued_kinds", policy)).fetchall()
        return sorted(r[0] for r in rows)

    def find_oldest_queued_at(self, policy: EntityPolicy) -> float | None:
        if QUEUE_COLUMN not in policy.columns or PRIORITY_COLUMN not in policy.columns:
            sql = self.of("find_oldest_queued_at", policy,
                          hint=self.hint(policy, "queued", "queued_at"))
            value = self.execute(sql).fetchone()[0]
            return None if value is None else float(value)
        # No (queued_at) index: every submit and claim would maintain it for this query
        # alone. The claim order's index answers it level by level instead.
        hint = self.hint(policy, "queued", QUEUE_COLUMN)

        def one(name: str, *params: Any) -> Any:
            return self.execute(self.of(name, policy, hint=hint), params).fetchone()

        oldest: float | None = None
        level = one("queued_level_first")
        while level is not None:
            queue, priority = level[0], level[1]
            at = one("queued_level_oldest", queue, priority)
            if at is not None and (oldest is None or at[0] < oldest):
                oldest = float(at[0])
            below = one("queued_level_below", queue, priority)
            level = (queue, below[0]) if below is not None else \
                one("queued_level_next_queue", queue)
        return oldest

    def count_running_by_worker(self, policy: EntityPolicy) -> dict[str, int]:
        sql = self.of("count_running_by_worker", policy,
                      hint=self.hint(policy, "running", "lease_expires_at"))
        return {r[0]: int(r[1]) for r in self.execute(sql).fetchall()}
