"""rebuild is linear (issue 16 item 2): checked by plan and by SQLite's own VM step
count, never by a clock. The cause of the quadratic rebuild was a DELETE whose
foreign-key checks scanned a child table for every deleted row."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ledgerq import StateDB
from ledgerq.projections import rebuild, verify
from ledgerq.queue import TaskApplication, submit_many

APP = TaskApplication(action_kind="command", args={"argv": ["true"]}, execution_target="host")


def test_every_foreign_key_child_lookup_uses_an_index(tmp_path: Path) -> None:
    """What SQLite runs per deleted parent row: one lookup per referencing column."""
    import asyncio

    async def make() -> None:
        async with StateDB(tmp_path / "s.db"):
            pass

    asyncio.run(make())
    conn = sqlite3.connect(tmp_path / "s.db")
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    checked = 0
    for child in tables:
        for fk in conn.execute(f'PRAGMA foreign_key_list("{child}")').fetchall():
            column = fk[3]
            plan = " ".join(str(r[3]) for r in conn.execute(
                f'EXPLAIN QUERY PLAN SELECT 1 FROM "{child}" WHERE "{column}" = ?', ("x",)))
            assert "USING" in plan and "SCAN" not in plan, (child, column, plan)
            checked += 1
    assert checked >= 3  # schedule_id, invocation_id, chain_parent_id, workers.leased_run_id


async def _steps_to_rebuild(path: Path, n: int) -> int:
    async with StateDB(path) as db:
        for start in range(0, n, 5000):
            await submit_many(db, [APP] * min(5000, n - start))
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        await db.run(lambda c: c.set_progress_handler(count, 1000))
        report = await rebuild(db)
        await db.run(lambda c: c.set_progress_handler(None, 0))
        assert report.rows == n
        assert (await verify(db)).ok
        return steps[0]


async def test_rebuild_of_50k_rows_costs_ten_times_5k(tmp_path: Path) -> None:
    small = await _steps_to_rebuild(tmp_path / "small.db", 5_000)
    large = await _steps_to_rebuild(tmp_path / "large.db", 50_000)
    # Linear: ten times the rows, about ten times the VM steps. The quadratic rebuild
    # (a child-table scan per deleted row) took about a hundred times.
    assert large < 14 * small, (small, large)


async def test_verify_reports_a_gap_in_an_entitys_fact_versions(db_path: Path) -> None:
    async with StateDB(db_path) as db:
        (rid,) = await submit_many(db, [APP])
    conn = sqlite3.connect(db_path)
    with conn:  # fact 3 with no fact 2: the log is append-only, so insert it directly
        conn.execute(
            "INSERT INTO status_transitions (id, entity_type, entity_id, previous_status, "
            "status, reason_code, source, created_at, entity_version, patch) VALUES "
            "('gap', 'schedule_run', ?, 'queued', 'queued', 'run.queued.retry_due', "
            "'system', 2.0, 3, '{}')", (rid,))
        conn.execute("UPDATE schedule_runs SET version = 3 WHERE id = ?", (rid,))
    conn.close()
    async with StateDB(db_path) as db:
        report = await verify(db)
    gaps = [d for d in report.drift if d.problem == "fact versions have a gap"]
    assert [(g.entity_id, g.column, g.expected, g.actual) for g in gaps] == [
        (rid, "entity_version", 2, 3)]
    assert not report.ok
