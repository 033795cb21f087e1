"""Read-only handles never write; a damaged file is refused, never written into."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.unprivileged import without_write_permission
from ledgerq import StateDB
from ledgerq.errors import DatabaseDamaged, DatabaseError, SchemaMissing
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, submit_many, submit_task

APP = TaskApplication(action_kind="command", args={"argv": ["true"]}, execution_target="host")


def _files(directory: Path) -> dict[str, tuple[int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(directory.iterdir())}


async def test_readonly_reads_and_never_writes(db_path: Path) -> None:
    async with StateDB(db_path) as db:
        run_id = await submit_task(db, APP)
    before = _files(db_path.parent)
    async with StateDB(db_path, readonly=True) as ro:
        row = await ro.fetch_one("SELECT status FROM schedule_runs WHERE id = ?", (run_id,))
        assert row == {"status": "queued"}
        assert (await verify(ro)).ok
        with pytest.raises(DatabaseError, match="read-only"):
            await submit_task(ro, APP)
        with pytest.raises(DatabaseError, match="readonly"):
            await ro.fetch_one("INSERT INTO schedules (id, created_at) VALUES ('x', 1)")
    after = _files(db_path.parent)
    assert {k: v for k, v in after.items() if k == db_path.name} == \
        {k: v for k, v in before.items() if k == db_path.name}


async def test_readonly_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(DatabaseError, match="no database at"):
        await StateDB(tmp_path / "absent.db", readonly=True).open()
    assert not (tmp_path / "absent.db").exists()
    plain = tmp_path / "plain.db"
    sqlite3.connect(plain).execute("CREATE TABLE other (x)").connection.close()
    with pytest.raises(SchemaMissing, match=r"missing table.*status_transitions"):
        await StateDB(plain, readonly=True).open()
    assert SchemaMissing.__mro__.index(DatabaseError) > 0


READER = """
import asyncio, sys
from ledgerq import StateDB
from ledgerq.queue import queue_stats
async def main():
    async with StateDB(sys.argv[1], readonly=True) as db:
        print((await queue_stats(db)).counts["queued"])
asyncio.run(main())
"""


def test_readonly_works_without_write_permission(tmp_path: Path) -> None:
    prefix = without_write_permission()
    if prefix is None:
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE")
    directory = tmp_path / "ro"
    directory.mkdir()
    path = directory / "state.db"

    async def fill() -> None:
        async with StateDB(path) as db:
            await submit_many(db, [APP, APP, APP])

    import asyncio

    asyncio.run(fill())
    path.chmod(0o444)
    directory.chmod(0o555)
    try:
        before = _files(directory)
        out = subprocess.run([*prefix, sys.executable, "-c", READER, str(path)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "3"
        assert _files(directory) == before
        # The same user cannot open it for writing: SQLite refuses, nothing is created.
        probe = subprocess.run([*prefix, sys.executable, "-c",
                                "open(__import__('sys').argv[1], 'a')", str(path)],
                               capture_output=True, text=True, timeout=60)
        assert probe.returncode != 0
    finally:
        directory.chmod(0o755)
        path.chmod(0o644)


def _damage(path: Path) -> None:
    """Overwrite pages in the middle of the file with garbage, as a bad disk would."""
    size = path.stat().st_size
    page = 4096
    with path.open("r+b") as f:
        for n in range(2, size // page - 1, 3):
            f.seek(n * page)
            f.write(os.urandom(page))


async def _filled(path: Path, n: int = 3000) -> None:
    async with StateDB(path) as db:
        await submit_many(db, [APP] * n)


async def test_verify_reports_a_damaged_file_and_writes_are_refused(db_path: Path) -> None:
    await _filled(db_path)
    _damage(db_path)
    # A clean close left no WAL, so opening does not check; the damage surfaces on use.
    db = StateDB(db_path)
    try:
        await db.open()
    except DatabaseDamaged:
        return  # the schema statements already hit a damaged page: refused at open
    try:
        assert await db.check_integrity() != []
        assert db.damaged is not None
        size = db_path.stat().st_size
        with pytest.raises(DatabaseDamaged, match="writes refused"):
            await submit_task(db, APP)
        assert db_path.stat().st_size == size
    finally:
        await db.close()


async def test_a_write_open_after_a_crash_checks_and_refuses(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    await _filled(path, 1000)
    # A writer that dies without closing leaves its WAL behind.
    code = ("import sqlite3, os, sys; c = sqlite3.connect(sys.argv[1]); "
            "c.execute('PRAGMA journal_mode=WAL'); "
            "c.execute(\"INSERT INTO schedules (id, created_at) VALUES ('s', 1)\"); c.commit(); "
            "os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    assert (tmp_path / "state.db-wal").stat().st_size > 0
    _damage(path)  # and pages of the main file were lost meanwhile
    before = path.read_bytes()
    with pytest.raises(DatabaseDamaged, match="quick_check"):
        await StateDB(path).open()
    assert path.read_bytes() == before


async def test_a_clean_crash_recovery_opens_normally(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    await _filled(path, 10)
    code = ("import sqlite3, os, sys; c = sqlite3.connect(sys.argv[1]); "
            "c.execute(\"INSERT INTO schedules (id, created_at) VALUES ('s', 1)\"); c.commit(); "
            "os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60)
    async with StateDB(path) as db:
        assert await db.fetch_one("SELECT id FROM schedules") == {"id": "s"}
        assert db.damaged is None


async def test_not_a_database_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(os.urandom(8192))
    before = path.read_bytes()
    with pytest.raises(DatabaseDamaged, match="not a database"):
        await StateDB(path).open()
    assert path.read_bytes() == before


async def test_a_worker_stops_with_database_damaged_instead_of_retrying(db_path: Path) -> None:
    from ledgerq.queue import Worker

    await _filled(db_path, 10)
    async with StateDB(db_path) as db:
        worker = Worker(db, handle_signals=False, poll_interval=0.05)

        async def damaged(*args: object, **kwargs: object) -> None:
            raise DatabaseDamaged("database is damaged: test: database disk image is malformed")

        worker._claim = damaged  # type: ignore[method-assign]
        import asyncio

        with pytest.raises(DatabaseDamaged, match="malformed"):
            await asyncio.wait_for(worker.run(), timeout=30)
