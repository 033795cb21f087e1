"""rebuild is linear: checked by plan and by SQLite's own VM step
count, never by a clock. The cause of the quadratic rebuild was a DELETE whose
foreign-key checks scanned a child table for every deleted row."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.projections import log, rebuild, verify
from ledgerq.projections.log import GAP
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


async def test_a_gap_drift_says_which_version_is_missing(db_path: Path) -> None:
    """Fact 2 missing, fact 3 present: the message names both, and the gap at the start
    of the log (no fact 1) is found the same way."""
    async with StateDB(db_path) as db:
        first, second = await submit_many(db, [APP, APP])
    conn = sqlite3.connect(db_path)
    with conn:
        conn.execute("INSERT INTO status_transitions (id, entity_type, entity_id, "
                     "previous_status, status, reason_code, source, created_at, "
                     "entity_version, patch) VALUES ('gap', 'schedule_run', ?, 'queued', "
                     "'queued', 'run.queued.retry_due', 'system', 2.0, 3, '{}')", (first,))
        conn.execute("UPDATE schedule_runs SET version = 3 WHERE id = ?", (first,))
    conn.close()
    async with StateDB(db_path) as db:
        report = await verify(db)
    (gap,) = [d for d in report.drift if d.problem == GAP]
    assert str(gap) == (f"schedule_run {first}: fact versions have a gap: version 2 is "
                        "missing, the next fact is version 3")
    assert all(d.entity_id == first for d in report.drift)  # the other run is clean
    assert second != first


async def test_a_log_starting_at_version_2_is_a_gap(tmp_path: Path) -> None:
    """A fresh database whose only fact for an entity is version 2 (fact 1 never
    written), its row at version 2 too: the fold alone agrees with the row, so only the
    version check can find it."""
    source, fresh = tmp_path / "source.db", tmp_path / "fresh.db"
    async with StateDB(source) as db:
        (rid,) = await submit_many(db, [APP])
    async with StateDB(fresh):
        pass
    conn = sqlite3.connect(fresh)
    with conn:  # the run's row and only fact, copied over at version 2
        conn.execute("ATTACH DATABASE ? AS src", (str(source),))
        conn.execute("CREATE TEMP TABLE f AS SELECT * FROM src.status_transitions")
        conn.execute("CREATE TEMP TABLE r AS SELECT * FROM src.schedule_runs")
        conn.execute("UPDATE f SET entity_version = 2")
        conn.execute("UPDATE r SET version = 2")
        conn.execute("INSERT INTO main.status_transitions SELECT * FROM f")
        conn.execute("INSERT INTO main.schedule_runs SELECT * FROM r")
    conn.close()
    async with StateDB(fresh) as db:
        drift = (await verify(db)).drift
    assert [(d.entity_id, d.problem, d.column, d.expected, d.actual) for d in drift] == [
        (rid, GAP, "entity_version", 1, 2)]


async def test_progress_reports_rise_to_the_total(db_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Called every PROGRESS_EVERY facts and once more with the total, so a bar ends full;
    rebuild() and verify() without the keyword keep working (every other test)."""
    monkeypatch.setattr(log, "PROGRESS_EVERY", 10)
    async with StateDB(db_path) as db:
        await submit_many(db, [APP] * 35)
        for call in (rebuild, verify):
            seen: list[int] = []
            report: Any = await call(db, progress=seen.append)
            assert report.facts == 35
            assert seen == [10, 20, 30, 35], call


def _ledgerq(*args: str | Path, stderr: int) -> subprocess.Popen[bytes]:
    exe = Path(sys.executable).parent / "ledgerq"
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "100"}
    env.pop("NO_COLOR", None)
    return subprocess.Popen([exe, *map(str, args)], stdout=subprocess.PIPE, stderr=stderr,
                            env=env)


@pytest.mark.parametrize("command", ["rebuild", "verify"])
def test_no_progress_bar_when_stderr_is_not_a_terminal(command: str, tmp_path: Path) -> None:
    """Piped stderr (a log, CI) gets no bar frames, only what the command reports."""
    path = tmp_path / "s.db"
    import asyncio

    async def seed() -> None:
        async with StateDB(path) as db:
            await submit_many(db, [APP] * 3)

    asyncio.run(seed())
    proc = _ledgerq("--db", path, command, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err == b""
    assert b"facts" in out


@pytest.mark.parametrize("command", ["rebuild", "verify"])
def test_progress_bar_on_a_terminal_stderr(command: str, tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    import asyncio

    async def seed() -> None:
        async with StateDB(path) as db:
            await submit_many(db, [APP] * 3)

    asyncio.run(seed())
    master, slave = os.openpty()
    try:
        proc = _ledgerq("--db", path, command, stderr=slave)
        os.close(slave)
        slave = -1
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
        proc.communicate(timeout=60)
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert proc.returncode == 0
    assert b"3/3 facts" in seen, seen
