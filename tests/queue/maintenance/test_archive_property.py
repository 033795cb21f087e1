"""Property: whatever the chains, dependencies and end times, an archive moves exactly
the old ended runs that no staying run refers to, the file holds exactly them and their
facts, and verify is clean before and after (SQLite: the property is the selection; the
contract tests run both backends)."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue.maintenance.archive import archive_runs
from ledgerq.store.sqlite.archive_file import ArchiveFile
from lifecycle_support import OPERATOR, move, new_run

RUN = "schedule_run"
NOW = time.time()
CUTOFF = NOW - 86400

# One run per item: (old?, ended?, index of an earlier run it chains to or None, index
# of an earlier run it depends on or None).
runs = st.lists(st.tuples(st.booleans(), st.booleans(),
                          st.none() | st.integers(0, 30), st.none() | st.integers(0, 30)),
                min_size=1, max_size=12)


async def scenario(items: list[tuple[bool, bool, int | None, int | None]], tmp: Path) -> None:
    async with StateDB(tmp / "s.db") as db:
        ids: list[str] = []
        old: set[str] = set()
        refs: dict[str, set[str]] = {}
        for i, (is_old, is_ended, parent, dep) in enumerate(items):
            extra: dict[str, object] = {}
            named: set[str] = set()
            if parent is not None and i:
                extra.update(chain_parent_id=ids[parent % i], chain_depth=1)
                named.add(ids[parent % i])
            if dep is not None and i:
                extra["depends_on"] = [ids[dep % i]]
                named.add(ids[dep % i])
            rid = await new_run(db, **extra)
            if is_ended:
                at = NOW - 10 * 86400 if is_old else NOW
                await move(db, RUN, rid, "queued", "cancelled", "run.cancelled.operator",
                           actor=OPERATOR, now=at)
                if is_old:
                    old.add(rid)
            ids.append(rid)
            refs[rid] = named
        assert (await verify(db)).ok
        # The expected selection, computed the slow way: drop referenced ones to a fixpoint.
        chosen = set(old)
        while True:
            stay = set(ids) - chosen
            drop = {r for s in stay for r in refs[s]} & chosen
            if not drop:
                break
            chosen -= drop
        summary = await archive_runs(db, before=CUTOFF, to=tmp / "a.sqlite")
        assert summary.runs == len(chosen)
        assert summary.skipped == len(old) - len(chosen)
        report = await verify(db)
        assert report.ok, report.drift
        live = {r["id"] for r in await db.fetch_all("SELECT id FROM schedule_runs")}
        assert live == set(ids) - chosen
        if chosen:
            with ArchiveFile(tmp / "a.sqlite") as archive:
                assert set(archive.ids()) == chosen
                assert archive.counts() == (len(chosen), 2 * len(chosen))
        else:
            assert not (tmp / "a.sqlite").exists()


@settings(max_examples=40)
@given(runs)
def test_archive_moves_exactly_the_unreferenced_old_ended_runs(
        items: list[tuple[bool, bool, int | None, int | None]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(scenario(items, Path(tmp)))
