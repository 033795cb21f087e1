"""An archiving process killed (SIGKILL) at each moment of its transaction: afterwards
either nothing was deleted, or everything was, recorded, and the file is complete;
``verify`` is clean, and a rerun archives each run exactly once. Both backends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ledgerq
from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue.maintenance.archive import archive_runs, list_archives
from ledgerq.store.sqlite.archive_file import ArchiveFile, ids_digest, partial_path
from lifecycle_support import OPERATOR, move, new_run

HELPER = Path(__file__).resolve().parents[2] / "helpers" / "archive_proc.py"
RUN = "schedule_run"
OLD = time.time() - 10 * 86400
CUTOFF = time.time() - 86400
RUNS = 12


async def fill(target: str) -> list[str]:
    async with StateDB(target) as db:
        ids = []
        for _ in range(RUNS):
            rid = await new_run(db)
            await move(db, RUN, rid, "queued", "cancelled", "run.cancelled.operator",
                       actor=OPERATOR, now=OLD)
            ids.append(rid)
        await new_run(db)  # live: never archived
        return sorted(ids)


def kill_at(target: str, to: Path, moment: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(ledgerq.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(HELPER), target, str(to), repr(CUTOFF),
                             moment], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == moment, (line, proc.stderr.read() if proc.poll() is not None else "")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


@pytest.mark.parametrize("moment", ["copying", "written", "published", "committed"])
async def test_a_kill_at_any_moment_loses_nothing(db_target: str, tmp_path: Path,
                                                  moment: str) -> None:
    ids = await fill(db_target)
    to = tmp_path / "archive.sqlite"
    kill_at(db_target, to, moment)

    async with StateDB(db_target) as db:
        report = await verify(db)
        assert report.ok, report.drift
        live = {r["id"] for r in await db.fetch_all("SELECT id FROM schedule_runs")}
        records = await list_archives(db)
        assert await db.fetch_all("SELECT * FROM ledgerq_archive_batch") == []
        if moment == "committed":
            # Everything deleted, recorded, and the file holds it all.
            assert not live & set(ids)
            (record,) = records
            with ArchiveFile(to) as archive:
                assert list(archive.ids()) == ids
                assert archive.counts() == (record["runs"], record["facts"]) == (RUNS, 2 * RUNS)
                assert archive.manifest["archive_id"] == record["id"]
            assert record["ids_sha256"] == ids_digest(ids)
            again = await archive_runs(db, before=CUTOFF, to=tmp_path / "again.sqlite")
            assert again.runs == 0
            return
        # Killed before the commit: nothing deleted, nothing recorded.
        assert set(ids) <= live and records == []
        if moment == "published":
            # A complete file the database never recorded: its runs are still live, and
            # the archive will not write over it.
            with ArchiveFile(to) as archive:
                assert list(archive.ids()) == ids
            with pytest.raises(ValueError, match="records no archive there"):
                await archive_runs(db, before=CUTOFF, to=to)
        else:
            assert not to.exists()
        if moment == "written":
            assert partial_path(to).exists()
        # The rerun archives each run once.
        done = await archive_runs(db, before=CUTOFF, to=tmp_path / "rerun.sqlite")
        assert (done.runs, done.facts) == (RUNS, 2 * RUNS)
        assert not partial_path(tmp_path / "rerun.sqlite").exists()
        assert len(await list_archives(db)) == 1
        assert (await verify(db)).ok
