"""Reading, checking and replaying the fact log against the projection tables."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ledgerq.codec import loads
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.rows import floats_as_floats
from ledgerq.lifecycle.store import Database, EventStore, Row


async def history(db: Database[EventStore], entity_type: str, entity_id: str) -> list[dict[str,
                                                                                           Any]]:
    """Every fact of one entity, oldest first, keyed by the log's column names."""
    db.registry.entity(entity_type)
    return await db.read(lambda tx: tx.read_facts(entity_type, entity_id))


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
        if self.problem == GAP:
            return (f"{where}: {self.problem}: version {self.expected!r} is missing, the "
                    f"next fact is version {self.actual!r}")
        return (f"{where}: {self.problem} {self.column}: log says {self.expected!r}, "
                f"row has {self.actual!r}")


#: A Drift's problem when an entity's facts skip a version (1 then 3): a fact was lost, or
#: written around the engine. ``expected`` is the first missing version, ``actual`` the
#: version found in its place; only the first gap of an entity is reported.
GAP = "fact versions have a gap"


@dataclass
class VerifyReport:
    ok: bool
    drift: list[Drift] = field(default_factory=list)
    rows: int = 0
    facts: int = 0


#: Facts between two progress reports: often enough for a bar, rare enough to cost nothing.
PROGRESS_EVERY = 5000
Progress = Callable[[int], None]


def _fact_groups(tx: EventStore, policy: EntityPolicy, counter: list[int],
                 progress: Progress | None) -> Iterator[tuple[str, list[Any]]]:
    """One entity's facts at a time, in entity-id order, streamed from the log's unique
    (entity_type, entity_id, entity_version) index: no sort, no whole log in memory."""
    for entity_id, facts in itertools.groupby(tx.stream_facts(policy.name),
                                              key=operator.itemgetter(0)):
        group = list(facts)
        before = counter[0]
        counter[0] += len(group)
        if progress is not None and before // PROGRESS_EVERY != counter[0] // PROGRESS_EVERY:
            progress(counter[0])
        yield entity_id, group


def fold_rows(facts: list[Any], policy: EntityPolicy) -> dict[str, Any]:
    """:func:`fold` over raw (entity_id, status, entity_version, patch) tuples."""
    # A column no fact names holds its default: the creation fact names every column
    # set at insert (NULL included where a default exists), so only a column added by a
    # migration after the row was created goes unnamed, and the migration gave the row
    # its default.
    row: dict[str, Any] = {c: col.default for c, col in policy.columns.items()}
    for fact in facts:
        row.update(loads(fact[3]))
    floats_as_floats(row, policy.float_columns)
    last = facts[-1]
    row["status"] = last[1]
    row["version"] = last[2]
    return row


def _verify(tx: EventStore, policies: list[EntityPolicy],
            progress: Progress | None = None) -> VerifyReport:
    """A merge of two ordered streams: rows by id, and facts by (entity id, version)."""
    report = VerifyReport(ok=True)
    counter = [0]
    for policy in policies:
        rows = tx.stream_entities(policy)
        groups = _fact_groups(tx, policy, counter, progress)
        json_columns = set(policy.json_columns)
        row = next(rows, None)
        group = next(groups, None)
        while row is not None or group is not None:
            if group is None or (row is not None and row["id"] < group[0]):
                assert row is not None
                report.rows += 1
                report.drift.append(Drift(policy.name, row["id"], "projection row has no facts"))
                row = next(rows, None)
                continue
            entity_id, own = group
            if row is None or row["id"] > entity_id:
                report.drift.append(Drift(policy.name, entity_id,
                                          "facts exist but the row is missing"))
                group = next(groups, None)
                continue
            report.rows += 1
            report.drift += _compare(policy, json_columns, entity_id, row, own)
            row = next(rows, None)
            group = next(groups, None)
    report.facts = counter[0]
    report.ok = not report.drift
    if progress is not None:
        progress(counter[0])
    return report


def _compare(policy: EntityPolicy, json_columns: set[str], entity_id: str,
             row: dict[str, Any], own: list[Any]) -> list[Drift]:
    """How one row differs from the fold of its facts (version gaps first)."""
    drift = []
    for i, f in enumerate(own, start=1):
        if f[2] != i:
            drift.append(Drift(policy.name, entity_id, GAP, "entity_version", i, f[2]))
            break
    expected = fold_rows(own, policy)
    for col, actual in row.items():
        want = expected.get(col)
        if want != actual and not (col in json_columns and _same_json(want, actual)):
            drift.append(Drift(policy.name, entity_id, "column differs", col, want, actual))
    return drift


def _verify_rows(tx: EventStore, policy: EntityPolicy, ids: list[str]) -> VerifyReport:
    """:func:`_verify` over some rows of one entity: two reads, whatever their number."""
    return check_rows(policy, tx.read_entities(policy, ids),
                      tx.read_facts_of(policy.name, ids))


def check_rows(policy: EntityPolicy, projection: Iterable[Row],
               log: Iterable[Row]) -> VerifyReport:
    """Rows of one entity against the fold of their facts, both as the store reads them
    (``read_entities``, ``read_facts_of``): what :func:`verify` does for a few rows, for a
    caller that has read them already."""
    report = VerifyReport(ok=True)
    rows = {r["id"]: r for r in projection}
    facts: dict[str, list[Any]] = {}
    for f in log:
        facts.setdefault(f["entity_id"], []).append(
            (f["entity_id"], f["status"], f["entity_version"], f["patch"]))
    json_columns = set(policy.json_columns)
    for entity_id in sorted(set(rows) | set(facts)):
        row, own = rows.get(entity_id), facts.get(entity_id)
        report.facts += len(own or ())
        if own is None:
            report.drift.append(Drift(policy.name, entity_id, "projection row has no facts"))
        elif row is None:
            report.drift.append(Drift(policy.name, entity_id,
                                      "facts exist but the row is missing"))
        else:
            report.rows += 1
            report.drift += _compare(policy, json_columns, entity_id, row, own)
    report.ok = not report.drift
    return report


def _same_json(a: Any, b: Any) -> bool:
    """JSON columns compare by value: PostgreSQL's jsonb keeps its own key order and
    spacing, so the row's text and the fact's text of one value may differ."""
    try:
        return bool(loads(a) == loads(b))
    except Exception:
        return False


async def verify(db: Database[EventStore], *, progress: Progress | None = None,
                 entity: str | None = None, ids: Collection[str] | None = None
                 ) -> VerifyReport:
    """Fold every entity's facts and compare with its projection row, in one snapshot.

    The file's integrity is checked first (``PRAGMA quick_check``): on a damaged file the
    fold would compare garbage, so the report is the damage, and ``ok`` is False.
    ``progress`` is called with the facts folded so far, from the database's thread, each
    :data:`PROGRESS_EVERY` facts and once at the end with the total (a bar can finish).

    ``entity`` and ``ids`` check only those rows of that entity (no integrity pass): what
    a test that owns a few rows of a shared database asks after each step.
    """
    if ids is not None:
        if entity is None:
            raise ValueError("verify(ids=...) needs entity=")
        policy = db.registry.entity(entity)
        wanted = list(ids)
        return await db.read(lambda tx: _verify_rows(tx, policy, wanted))
    problems = await db.check_integrity()
    if problems:
        return VerifyReport(ok=False, drift=[
            Drift("database", db.path, f"damaged: {p}") for p in problems])
    policies = db.log_policies()
    if entity is not None:
        policies = [p for p in policies if p.name == entity]
    return await db.read(lambda tx: _verify(tx, policies, progress))


@dataclass
class RebuildReport:
    rows: int
    facts: int
    tables: dict[str, int]


def _rebuild(tx: EventStore, policies: list[EntityPolicy],
             progress: Progress | None = None) -> RebuildReport:
    # Other tables (workers, chained runs) reference projection rows; they are all
    # re-inserted before COMMIT, so checking foreign keys at commit time is exact. The
    # child side of each reference is indexed, so each deleted row costs one lookup.
    tx.defer_constraints()
    tables: dict[str, int] = {}
    counter = [0]
    for policy in policies:
        tx.delete_entities(policy)
        cols = list(policy.columns)
        rows = 0

        def folded(policy: EntityPolicy = policy, cols: list[str] = cols) -> Iterator[list[Any]]:
            nonlocal rows
            for _, own in _fact_groups(tx, policy, counter, progress):
                rows += 1
                row = fold_rows(own, policy)
                yield [row[c] for c in cols]

        tx.insert_entities(policy, tuple(cols), folded())
        tables[policy.table] = rows
    if progress is not None:
        progress(counter[0])
    return RebuildReport(rows=sum(tables.values()), facts=counter[0], tables=tables)


async def rebuild(db: Database[EventStore], *, progress: Progress | None = None) -> RebuildReport:
    """Recreate every projection row from the log alone, in one transaction.

    Linear in the log: facts stream in index order and fold entity by entity into one
    ``executemany``. ``progress`` is called as :func:`verify` calls it.
    """
    policies = db.log_policies()
    return await db.write(lambda tx: _rebuild(tx, policies, progress), bulk=True)
