"""What more than one wing of the queue calls (:class:`ledgerq.queue.store.SharedTx`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import Row
from ledgerq.store.sqltx.base import SqlBase


class SharedOps(SqlBase):
    """Runs and schedules read by id, dependency lookups, a page of rows, stuck runs."""

    def read_entity(self, policy: EntityPolicy, entity_id: str) -> Row | None:
        rows = self.dicts(self.execute(self.q("read_entity", table=self.table(policy)),
                                       (entity_id,)))
        return rows[0] if rows else None

    def read_statuses(self, policy: EntityPolicy, ids: Sequence[str]) -> dict[str, str]:
        return {r["id"]: r["status"] for r in self._chunked_rows("read_statuses", policy, ids)}

    def list_waiting_runs(self, policy: EntityPolicy, ids: Sequence[str]
                          ) -> list[tuple[str, Any]]:
        return [(r["id"], r["depends_on"])
                for r in self._chunked_rows("list_waiting_runs", policy, ids)]

    def list_dependents(self, policy: EntityPolicy, run_ids: Sequence[str]
                        ) -> list[tuple[str, Any]]:
        rows = self._chunked_rows("list_dependents", policy, run_ids,
                                  hint=self.hint(policy, "waiting_dependency", "created_at"))
        # A dependent of runs in two chunks is found twice.
        return list({r["id"]: (r["id"], r["depends_on"]) for r in rows}.values())

    def list_all_waiting(self, policy: EntityPolicy) -> list[tuple[str, Any]]:
        sql = self.of("list_all_waiting", policy,
                      hint=self.hint(policy, "waiting_dependency", "created_at"))
        return [(r[0], r[1]) for r in self.execute(sql, ()).fetchall()]

    def ensure_schedule(self, schedule_id: str, name: str | None, created_at: float) -> None:
        self.execute(self.q("ensure_schedule"), (schedule_id, name, created_at))

    def read_page(self, policy: EntityPolicy, filters: dict[str, list[Any]],
                  columns: tuple[str, ...], limit: int, offset: int, *,
                  since: tuple[str, float] | None = None) -> tuple[int, list[Row]]:
        terms, params = self._in_lists(filters)
        if since is not None:
            terms.append(self.q("and_at_least", column=quote(since[0])))
            params.append(since[1])
        where = self.q("where", terms=" ".join(terms)) if terms else ""
        table = self.table(policy)
        total = self.execute(self.q("count_rows", table=table, where=where), params).fetchone()[0]
        rows = self.dicts(self.execute(
            self.q("read_page", table=table, where=where,
                   columns=", ".join(quote(c) for c in columns)), [*params, limit, offset]))
        return int(total), rows

    def find_stuck_runs(self, policy: EntityPolicy, kind: str, now: float, grace: float,
                        limit: int) -> tuple[int, list[tuple[str, str, str]]]:
        table = self.table(policy)
        params: list[Any]
        if kind == "undeclared":
            declared = sorted(policy.states)
            inner = self.q("stuck_undeclared", table=table, marks=self.marks(len(declared)))
            params = list(declared)
        elif kind == "lease":
            inner = self.of("stuck_lease", policy,
                            hint=self.hint(policy, "running", "lease_expires_at"))
            params = [now - grace, grace]
        elif kind == "retry":
            inner = self.of("stuck_retry", policy,
                            hint=self.hint(policy, "retry_wait", "retry_due_at"))
            params = [now - grace, grace]
        elif kind == "held":
            inner = self.of("stuck_held", policy)
            params = []
        elif kind == "waiting":
            inner = self.of("stuck_waiting", policy,
                            hint=self.hint(policy, "waiting_dependency", "created_at"))
            params = []
        else:
            raise ValueError(f"unknown kind of stuck run {kind!r}")
        count = int(self.execute(self.q("count_of", inner=inner), params).fetchone()[0])
        sample = [(r[0], r[1], r[2]) for r in self.execute(
            self.q("limited", inner=inner), [*params, limit]).fetchall()] if count else []
        return count, sample
