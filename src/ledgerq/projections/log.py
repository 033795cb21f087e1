"""Reading, checking and replaying the fact log against the projection tables."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledgerq.lifecycle.engine import fold
from ledgerq.lifecycle.registry import EntityPolicy

if TYPE_CHECKING:
    from ledgerq.store.db import StateDB


async def history(db: StateDB, entity_type: str, entity_id: str) -> list[dict[str, Any]]:
    """Every fact of one entity, oldest first, keyed by the log's column names."""
    db.registry.entity(entity_type)
    return await db.fetch_all(
        "SELECT * FROM status_transitions WHERE entity_type = ? AND entity_id = ? "
        "ORDER BY entity_version",
        (entity_type, entity_id),
    )


@dataclass(frozen=True)
class Drift:
    """One disagreement between a projection row and the fold of its facts."""

    entity_type: str
    entity_id: str
    problem: str
    column: str | None = None
    expected: Any = None
    actual: Any = None

    def __str__(self) -> str:
        where = f"{self.entity_type} {self.entity_id}"
        if self.column is None:
            return f"{where}: {self.problem}"
        return (f"{where}: {self.problem} {self.column}: log says {self.expected!r}, "
                f"row has {self.actual!r}")


@dataclass
class VerifyReport:
    ok: bool
    drift: list[Drift] = field(default_factory=list)
    rows: int = 0
    facts: int = 0


def _facts_by_entity(conn: sqlite3.Connection, policy: EntityPolicy
                     ) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for f in conn.execute(
        "SELECT entity_id, status, entity_version, patch FROM status_transitions "
        "WHERE entity_type = ? ORDER BY entity_id, entity_version", (policy.name,)
    ):
        grouped.setdefault(f["entity_id"], []).append(dict(f))
    return grouped


def _verify(conn: sqlite3.Connection, policies: list[EntityPolicy]) -> VerifyReport:
    report = VerifyReport(ok=True)
    for policy in policies:
        facts = _facts_by_entity(conn, policy)
        report.facts += sum(len(v) for v in facts.values())
        seen: set[str] = set()
        for row in conn.execute(f"SELECT * FROM {policy.table}"):
            report.rows += 1
            rid = row["id"]
            seen.add(rid)
            own = facts.get(rid)
            if not own:
                report.drift.append(Drift(policy.name, rid, "projection row has no facts"))
                continue
            for i, f in enumerate(own, start=1):
                if f["entity_version"] != i:
                    report.drift.append(Drift(policy.name, rid, "fact versions have a gap",
                                              "entity_version", i, f["entity_version"]))
                    break
            expected = fold(own, policy)
            for col in row.keys():  # noqa: SIM118 (sqlite3.Row iterates values)
                if expected.get(col) != row[col]:
                    report.drift.append(Drift(policy.name, rid, "column differs", col,
                                              expected.get(col), row[col]))
        for rid in facts.keys() - seen:
            report.drift.append(Drift(policy.name, rid, "facts exist but the row is missing"))
    report.ok = not report.drift
    return report


async def verify(db: StateDB) -> VerifyReport:
    """Fold every entity's facts and compare with its projection row, in one snapshot."""
    policies = db.registry.policies()
    return await db.read(lambda conn: _verify(conn, policies))


@dataclass
class RebuildReport:
    rows: int
    facts: int
    tables: dict[str, int]


def _rebuild(conn: sqlite3.Connection, policies: list[EntityPolicy]) -> RebuildReport:
    # Other tables (workers, chained runs) reference projection rows; they are all
    # re-inserted before COMMIT, so checking foreign keys at commit time is exact.
    conn.execute("PRAGMA defer_foreign_keys = ON")
    tables: dict[str, int] = {}
    facts_total = 0
    for policy in policies:
        facts = _facts_by_entity(conn, policy)
        facts_total += sum(len(v) for v in facts.values())
        conn.execute(f"DELETE FROM {policy.table}")
        cols = list(policy.columns)
        sql = (f"INSERT INTO {policy.table} ({', '.join(cols)}) "
               f"VALUES ({', '.join('?' * len(cols))})")
        conn.executemany(sql, ([fold(own, policy)[c] for c in cols] for own in facts.values()))
        tables[policy.table] = len(facts)
    return RebuildReport(rows=sum(tables.values()), facts=facts_total, tables=tables)


async def rebuild(db: StateDB) -> RebuildReport:
    """Recreate every projection row from the log alone, in one transaction."""
    policies = db.registry.policies()
    return await db.write(lambda conn: _rebuild(conn, policies))
