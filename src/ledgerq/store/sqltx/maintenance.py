"""What maintenance calls (:class:`ledgerq.queue.maintenance.store.MaintenanceTx`): the
sweeps and the archive."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import SUCCEEDED, EntityPolicy
from ledgerq.lifecycle.store import Row
from ledgerq.store.sqltx.base import CHUNK, SqlBase

#: ledgerq's record of archives (schema version 4).
ARCHIVES_TABLE = "ledgerq_archives"


class MaintenanceOps(SqlBase):
    """Expired leases, due retries and starts, settled dependencies; the archive."""

    # ------------------------------------------------------------ the sweeps

    def list_expired_leases(self, policy: EntityPolicy, now: float,
                            limit: int | None = None, *, columns: tuple[str, ...]
                            ) -> list[Row]:
        sql = self.of("list_expired_leases", policy,
                      columns=", ".join(quote(c) for c in columns),
                      hint=self.hint(policy, "running", "lease_expires_at"))
        return self.dicts(self.execute(sql, (now, self._limit(limit))))

    def list_due_retries(self, policy: EntityPolicy, now: float,
                         limit: int | None = None) -> list[Row]:
        sql = self.of("list_due_retries", policy,
                      hint=self.hint(policy, "retry_wait", "retry_due_at"))
        return self.dicts(self.execute(sql, (now, self._limit(limit))))

    def list_due_starts(self, policy: EntityPolicy, now: float,
                        limit: int | None = None) -> list[Row]:
        sql = self.of("list_due_starts", policy,
                      hint=self.hint(policy, "delayed", "not_before"))
        return self.dicts(self.execute(sql, (now, self._limit(limit))))

    def list_settled_waiting(self, policy: EntityPolicy, limit: int | None = None) -> list[str]:
        # None stands in for an empty list (``IN ()`` is not SQL): it matches no status.
        met = policy.states_with_outcome(SUCCEEDED)
        bad: list[str | None] = [*sorted(policy.terminal - met)] or [None]
        good: list[str | None] = [*sorted(met)] or [None]
        sql = self.of("list_settled_waiting", policy,
                      hint=self.hint(policy, "waiting_dependency", "created_at"),
                      bad=self.marks(len(bad)), met=self.marks(len(good)))
        return [r[0] for r in self.execute(sql, (*bad, *good, self._limit(limit))).fetchall()]

    # ------------------------------------------------------------ the archive

    def lock_archives(self) -> None:
        return None

    def mark_ended(self, policy: EntityPolicy, states: Sequence[str], before: float,
                   limit: int | None = None) -> int:
        listed: list[str | None] = [*states] or [None]
        sql = self.q("mark_ended", table=self.table(policy), marks=self.marks(len(listed)))
        return int(self.execute(sql, (policy.name, *listed, before,
                                      self._limit(limit))).rowcount)

    def list_departed_workers(self, before: float, limit: int | None = None) -> list[str]:
        return [r[0] for r in self.execute(self.q("list_departed_workers"),
                                           (before, self._limit(limit))).fetchall()]

    def delete_departed_workers(self, before: float) -> list[str]:
        return [r[0] for r in self.execute(self.q("delete_departed_workers"),
                                           (before,)).fetchall()]

    def list_marked(self, entity_type: str) -> list[str]:
        return [r[0] for r in self.execute(self.q("list_marked"), (entity_type,)).fetchall()]

    def list_references(self, referrer: EntityPolicy, column: str) -> list[tuple[str, str]]:
        sql = self.q("list_references", table=self.table(referrer), column=quote(column))
        return [(r[0], r[1]) for r in self.execute(sql, ()).fetchall()]

    def list_depends_on(self, policy: EntityPolicy) -> list[tuple[str, Any]]:
        sql = self.q("list_depends_on", table=self.table(policy))
        return [(r[0], r[1]) for r in self.execute(sql, ()).fetchall()]

    def list_marked_keyed(self, policy: EntityPolicy, created_after: float) -> list[str]:
        sql = self.q("list_marked_keyed", table=self.table(policy))
        return [r[0] for r in self.execute(sql, (policy.name, created_after)).fetchall()]

    def list_leased_runs(self) -> list[str]:
        return [r[0] for r in self.execute(self.q("list_leased_runs"), ()).fetchall()]

    def unmark(self, entity_type: str, ids: Sequence[str]) -> int:
        off = 0
        for i in range(0, len(ids), CHUNK):
            part = list(ids[i:i + CHUNK])
            off += int(self.execute(self.q("unmark", marks=self.marks(len(part))),
                                    (entity_type, *part)).rowcount)
        return off

    def stream_marked_rows(self, policy: EntityPolicy) -> Iterator[Row]:
        names, rows = self.stream(self.q("stream_marked_rows", table=self.table(policy)),
                                  (policy.name,))
        return (dict(zip(names, r, strict=True)) for r in rows)

    def stream_marked_facts(self, entity_type: str) -> Iterator[Row]:
        names, rows = self.stream(self.q("stream_marked_facts"), (entity_type,))
        return (dict(zip(names, r, strict=True)) for r in rows)

    def delete_marked(self, policy: EntityPolicy) -> tuple[int, int]:
        facts = self.execute(self.q("delete_marked_facts"), (policy.name, policy.name)).rowcount
        rows = self.execute(self.q("delete_marked_rows", table=self.table(policy)),
                            (policy.name,)).rowcount
        return int(facts), int(rows)

    def clear_marks(self) -> None:
        self.execute(self.q("clear_marks"))

    def record_archive(self, row: dict[str, Any]) -> None:
        cols = tuple(row)
        self.execute(self.q("record_archive", columns=", ".join(quote(c) for c in cols),
                            marks=self.marks(len(cols))), list(row.values()))

    def list_archives(self) -> list[Row]:
        # A database of an older schema opened read-only was not upgraded: no table, and
        # so no archive either.
        if ARCHIVES_TABLE not in {r[0] for r in self.execute(self.q("tables")).fetchall()}:
            return []
        return self.dicts(self.execute(self.q("list_archives")))
