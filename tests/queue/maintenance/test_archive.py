"""``archive_runs``: ended runs and their facts move to a file, verify stays clean, the
log's guard still refuses every other DELETE; on both backends."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from helpers.raw import RAW_ERRORS, raw, refusal
from ledgerq import StateDB
from ledgerq.errors import IntegrityViolation, InvalidInput, NotFound
from ledgerq.lifecycle.evolution import SCHEMA_VERSION
from ledgerq.projections import verify
from ledgerq.queue.maintenance.archive import (
    archive_runs,
    list_archives,
    parse_before,
    read_archived_run,
)
from ledgerq.store.sqlite import archive_file
from ledgerq.store.sqlite.archive_file import ArchiveFile, NotAnArchive, ids_digest
from lifecycle_support import OPERATOR, move, new_run

RUN = "schedule_run"
NOW = time.time()
OLD = NOW - 10 * 86400
CUTOFF = NOW - 86400


async def ended(db: StateDB, at: float, to: str = "cancelled", **extra: Any) -> str:
    rid = await new_run(db, **extra)
    code = {"cancelled": "run.cancelled.operator", "skipped": "run.skipped.scheduled"}[to]
    assert (await move(db, RUN, rid, "queued", to, code, actor=OPERATOR, now=at)).applied
    return rid


async def completed(db: StateDB, at: float, **extra: Any) -> str:
    rid = await new_run(db, **extra)
    await move(db, RUN, rid, "queued", "running", "run.started.ok", now=at - 5)
    await move(db, RUN, rid, "running", "completed", "run.completed.ok",
               patch={"exit_code": 0, "ended_at": at}, now=at)
    return rid


async def world(db: StateDB) -> dict[str, list[str]]:
    """Old ended runs (some still referred to), new ended runs, live runs."""
    free = [await ended(db, OLD) for _ in range(3)] + [await completed(db, OLD)]
    new = [await ended(db, NOW)]
    live = [await new_run(db)]
    # A chain wholly old: archived together. A chain whose child is new: kept whole.
    chain_parent = await completed(db, OLD)
    chain_child = await ended(db, OLD, chain_parent_id=chain_parent, chain_depth=1)
    kept_parent = await completed(db, OLD)
    kept_grand = await ended(db, OLD, chain_parent_id=kept_parent, chain_depth=1)
    kept_child = await new_run(db, chain_parent_id=kept_grand, chain_depth=2)
    # A live run waiting for an old completed one: the dependency stays.
    dependency = await completed(db, OLD)
    waiting = await new_run(db, "waiting_dependency", depends_on=[dependency])
    # A worker row naming an old ended run as its lease keeps it.
    leased = await completed(db, OLD)
    await db.write(lambda tx: tx.execute(
        "INSERT INTO workers (worker_id, last_heartbeat_at, leased_run_id) VALUES (?, ?, ?)",
        ("w1", NOW, leased)))
    return {"archived": sorted([*free, chain_parent, chain_child]),
            "kept_old": [kept_parent, kept_grand, dependency, leased],
            "stay": [*new, *live, kept_child, waiting]}


async def snapshot(db: StateDB, ids: list[str]) -> tuple[list[dict[str, Any]], int]:
    rows = [await db.fetch_one("SELECT * FROM schedule_runs WHERE id = ?", (i,)) for i in ids]
    facts = await db.fetch_one(
        "SELECT COUNT(*) AS n FROM status_transitions WHERE entity_id IN "
        f"({', '.join('?' * len(ids))})", tuple(ids))
    assert facts is not None
    return [r for r in rows if r is not None], int(facts["n"])


async def test_archive_round_trip_keeps_verify_clean(db: StateDB, tmp_path: Path) -> None:
    ids = await world(db)
    assert (await verify(db)).ok
    before_rows, before_facts = await snapshot(db, ids["archived"])
    target = tmp_path / "out.sqlite"

    summary = await archive_runs(db, before=CUTOFF, to=target)

    assert (summary.runs, summary.facts) == (len(ids["archived"]), before_facts)
    assert summary.skipped == len(ids["kept_old"])
    assert summary.ids_sha256 == ids_digest(ids["archived"])
    report = await verify(db)
    assert report.ok, report.drift
    assert await snapshot(db, ids["archived"]) == ([], 0)
    for rid in ids["kept_old"] + ids["stay"]:
        assert await db.fetch_one("SELECT id FROM schedule_runs WHERE id = ?", (rid,))
    # The file holds exactly what was deleted, columns and values alike.
    with ArchiveFile(target) as archive:
        assert list(archive.ids()) == ids["archived"]
        assert archive.counts() == (summary.runs, summary.facts)
        assert archive.manifest["ids_sha256"] == summary.ids_sha256
        assert archive.manifest["archive_id"] == summary.id
        for row in before_rows:
            kept = archive.run(row["id"])
            assert set(kept) == set(row)
            for col, value in row.items():
                assert kept[col] == value or str(kept[col]).replace(" ", "") == \
                    str(value).replace(" ", ""), col  # jsonb's spacing on PostgreSQL
    # The step is recorded, and names the file.
    (record,) = await list_archives(db)
    assert record["id"] == summary.id and record["file"] == str(target.resolve())
    assert (record["runs"], record["facts"], record["skipped"]) == \
        (summary.runs, summary.facts, summary.skipped)
    assert record["ids_sha256"] == summary.ids_sha256
    # The sanctioned path is closed again: the list is empty, a plain DELETE is refused.
    assert await db.fetch_all("SELECT * FROM ledgerq_archive_batch") == []
    with pytest.raises(IntegrityViolation, match="append-only"):
        await db.write(lambda tx: tx.execute(
            "DELETE FROM status_transitions WHERE entity_id = ?", (ids["stay"][0],)))
    # A rerun archives nothing twice: those runs are gone; the kept ones are still kept.
    again = await archive_runs(db, before=CUTOFF, to=tmp_path / "again.sqlite")
    assert (again.runs, again.file, again.skipped) == (0, None, len(ids["kept_old"]))
    assert not (tmp_path / "again.sqlite").exists()
    assert len(await list_archives(db)) == 1
    # Looked up from the file, the run reads as `show` reads a live one.
    found = read_archived_run(target, ids["archived"][0][-8:], db.registry.entity(RUN))
    assert found.run["id"] == ids["archived"][0]
    assert [f["entity_version"] for f in found.history] == \
        list(range(1, found.run["version"] + 1))
    assert isinstance(found.history[0]["patch"], dict)
    assert (await verify(db)).ok


async def test_dry_run_writes_nothing(db: StateDB, tmp_path: Path) -> None:
    ids = await world(db)
    target = tmp_path / "dry.sqlite"
    summary = await archive_runs(db, before=CUTOFF, to=target, dry_run=True)
    assert (summary.runs, summary.skipped, summary.file) == \
        (len(ids["archived"]), len(ids["kept_old"]), None)
    assert summary.facts == (await snapshot(db, ids["archived"]))[1]
    assert not target.exists()
    assert await list_archives(db) == []
    assert len((await snapshot(db, ids["archived"]))[0]) == len(ids["archived"])


async def test_a_failed_transaction_deletes_nothing_and_leaves_no_file(
        db: StateDB, tmp_path: Path) -> None:
    """The file is complete before the delete; a delete the database refuses rolls the
    whole step back, and the file goes with it."""
    ids = await world(db)
    make, undo = refusal(db.path, "no_run_delete", event="DELETE",
                         message="run deletes refused by this test")
    conn = raw(db.path)
    for statement in make:
        conn.execute(statement)
    target = tmp_path / "fail.sqlite"
    try:
        with pytest.raises(IntegrityViolation, match="refused by this test"):
            await archive_runs(db, before=CUTOFF, to=target)
    finally:
        for statement in undo:
            conn.execute(statement)
        conn.close()
    assert not target.exists() and not (tmp_path / "fail.sqlite.partial").exists()
    assert await list_archives(db) == []
    assert len((await snapshot(db, ids["archived"]))[0]) == len(ids["archived"])
    assert (await verify(db)).ok
    assert (await archive_runs(db, before=CUTOFF, to=target)).runs == len(ids["archived"])


async def test_refusals_write_nothing(db: StateDB, tmp_path: Path) -> None:
    await ended(db, OLD)
    taken = tmp_path / "taken.sqlite"
    taken.write_text("someone's file")
    with pytest.raises(InvalidInput, match=r"already exists .*records no archive there"):
        await archive_runs(db, before=CUTOFF, to=taken)
    assert taken.read_text() == "someone's file"
    with pytest.raises(InvalidInput, match="does not exist"):
        await archive_runs(db, before=CUTOFF, to=tmp_path / "no" / "such.sqlite")
    with pytest.raises(InvalidInput, match="finite"):
        await archive_runs(db, before=float("nan"), to=tmp_path / "x.sqlite")
    assert await list_archives(db) == []
    assert (await db.fetch_one("SELECT COUNT(*) AS n FROM schedule_runs")) == {"n": 1}


async def test_the_guard_admits_only_listed_entities(db: StateDB) -> None:
    """By hand, too: a listed entity's facts may go, anyone else's may not; UPDATE and
    an unlisted DELETE stay refused."""
    a, b = await ended(db, OLD), await ended(db, OLD)
    conn = raw(db.path)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO ledgerq_archive_batch VALUES ('schedule_run', ?)", (a,))
        with pytest.raises(RAW_ERRORS, match="append-only"):
            conn.execute("DELETE FROM status_transitions WHERE entity_id = ?", (b,))
        conn.execute("ROLLBACK")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO ledgerq_archive_batch VALUES ('schedule_run', ?)", (a,))
        with pytest.raises(RAW_ERRORS, match="append-only"):
            conn.execute("UPDATE status_transitions SET status = 'queued' WHERE entity_id = ?",
                         (a,))
        conn.execute("ROLLBACK")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO ledgerq_archive_batch VALUES ('schedule_run', ?)", (a,))
        conn.execute("DELETE FROM status_transitions WHERE entity_id = ?", (a,))
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    facts = await db.fetch_one("SELECT COUNT(*) AS n FROM status_transitions")
    assert facts == {"n": 4}


V3_SQLITE_GUARD = (
    "DROP TRIGGER status_transitions_no_delete",
    "CREATE TRIGGER status_transitions_no_delete BEFORE DELETE ON status_transitions "
    "BEGIN SELECT RAISE(ABORT, 'status_transitions is append-only: DELETE refused'); END",
)
V3_POSTGRES_GUARD = (
    "CREATE OR REPLACE FUNCTION status_transitions_append_only() RETURNS trigger "
    "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'status_transitions is append-only: "
    "%% refused', TG_OP USING ERRCODE = 'integrity_constraint_violation'; END $$",
)
V3_TABLES = ("DROP TABLE ledgerq_archives", "DROP TABLE ledgerq_archive_batch",
             "UPDATE ledgerq_schema SET value = '3' WHERE key = 'schema_version'")


async def test_a_v3_database_gets_the_new_guard_on_open(db_target: str, tmp_path: Path) -> None:
    """What the schema-3 release left (its strict guard, no archive tables): opening it
    replaces the guard, which still refuses every plain UPDATE and DELETE."""
    from evolution_support import fill_v1

    made = await fill_v1(db_target)  # the previous release's specs, too
    conn = raw(db_target)
    try:
        for statement in (V3_POSTGRES_GUARD if conn.postgres else V3_SQLITE_GUARD) + V3_TABLES:
            conn.execute(statement)
        with pytest.raises(RAW_ERRORS, match="append-only"):
            conn.execute("DELETE FROM status_transitions")
    finally:
        conn.close()
    async with StateDB(db_target) as db:
        version = await db.fetch_one(
            "SELECT value FROM ledgerq_schema WHERE key = 'schema_version'")
        assert version == {"value": str(SCHEMA_VERSION)}
        assert await list_archives(db) == []
        conn = raw(db_target)
        try:
            for sql in ("DELETE FROM status_transitions",
                        "UPDATE status_transitions SET status = 'queued'"):
                with pytest.raises(RAW_ERRORS, match="append-only"):
                    conn.execute(sql)
        finally:
            conn.close()
        summary = await archive_runs(db, before=time.time() + 60, to=tmp_path / "v3.sqlite")
        assert summary.runs == len(made["cancelled"])
        assert (await verify(db)).ok


async def test_show_lookups_refuse_clearly(db: StateDB, tmp_path: Path) -> None:
    rid = await ended(db, OLD)
    target = tmp_path / "a.sqlite"
    await archive_runs(db, before=CUTOFF, to=target)
    policy = db.registry.entity(RUN)
    with pytest.raises(NotFound, match="no run nope in archive"):
        read_archived_run(target, "nope", policy)
    plain = tmp_path / "plain.sqlite"
    sqlite3.connect(plain).execute("CREATE TABLE t (x)").connection.close()
    for bad in (plain, tmp_path / "missing.sqlite", Path(db.path) if db.file else plain):
        with pytest.raises(NotAnArchive):
            read_archived_run(bad, rid, policy)
    assert read_archived_run(target, rid, policy).run["status"] == "cancelled"


async def test_a_crafted_archive_never_hangs_a_lookup(db: StateDB, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A file whose run table is a recursive view (a lookup would never end) is not an
    archive; no statement on an archive runs past its time limit."""
    rid = await ended(db, OLD)
    target = tmp_path / "a.sqlite"
    await archive_runs(db, before=CUTOFF, to=target)
    policy = db.registry.entity(RUN)
    with ArchiveFile(target) as archive:
        table = archive.table
    crafted = tmp_path / "crafted.sqlite"
    crafted.write_bytes(target.read_bytes())
    conn = sqlite3.connect(crafted)
    conn.execute(f'DROP TABLE "{table}"')
    conn.execute(f'CREATE VIEW "{table}" AS WITH RECURSIVE r(id) AS (SELECT 1 UNION ALL '
                 "SELECT id + 1 FROM r) SELECT id FROM r")
    conn.commit()
    conn.close()
    started = time.monotonic()
    with pytest.raises(NotAnArchive, match="is a view, not a table"):
        read_archived_run(crafted, rid, policy)
    assert time.monotonic() - started < 5
    # The time limit itself: every statement on a real archive past a limit of nothing.
    monkeypatch.setattr(archive_file, "READ_SECONDS", -1.0)
    monkeypatch.setattr(archive_file, "PROGRESS_STEPS", 1)
    with pytest.raises(NotAnArchive, match="took more than"):
        read_archived_run(target, rid, policy)
    monkeypatch.undo()
    assert read_archived_run(target, rid, policy).run["id"] == rid


def test_parse_before_takes_spans_and_instants() -> None:
    assert parse_before("30d", now=1_000_000.0) == 1_000_000.0 - 30 * 86400
    assert parse_before("2026-11-01T00:00:00+00:00") == 1_793_491_200.0
    with pytest.raises(InvalidInput, match="neither an ISO 8601 time"):
        parse_before("last tuesday")


async def test_limit_takes_the_oldest_first(db: StateDB, tmp_path: Path) -> None:
    runs = [await ended(db, OLD + i) for i in range(5)]
    first = await archive_runs(db, before=CUTOFF, to=tmp_path / "1.sqlite", limit=2)
    assert first.runs == 2
    with ArchiveFile(tmp_path / "1.sqlite") as archive:
        assert list(archive.ids()) == sorted(runs[:2])
    rest = await archive_runs(db, before=CUTOFF, to=tmp_path / "2.sqlite", limit=10)
    assert rest.runs == 3
    assert (await verify(db)).ok
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidInput, match="limit must be"):
            await archive_runs(db, before=CUTOFF, to=tmp_path / "x.sqlite", limit=bad)  # type: ignore[arg-type]


async def test_a_read_only_open_of_an_older_database_lists_no_archives(
        db_target: str) -> None:
    async with StateDB(db_target):
        pass
    conn = raw(db_target)
    try:
        for statement in V3_TABLES:
            conn.execute(statement)
    finally:
        conn.close()
    async with StateDB(db_target, readonly=True) as ro:
        assert await list_archives(ro) == []


async def test_a_copy_that_differs_from_the_delete_deletes_nothing(
        db: StateDB, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counts deleted must be the counts written: a copy that lost a fact (here, a
    writer made to drop one) fails the whole step."""
    from ledgerq.errors import DatabaseError
    from ledgerq.store.sqlite import archive_file

    ids = sorted([await ended(db, OLD) for _ in range(3)])
    write = archive_file.write

    def lossy(path: Path, manifest: Any, table: str, columns: Any, rows: Any,
              facts: Any) -> Any:
        next(facts)
        return write(path, manifest, table, columns, rows, facts)

    monkeypatch.setattr(archive_file, "write", lossy)
    target = tmp_path / "lossy.sqlite"
    with pytest.raises(DatabaseError, match="nothing was deleted"):
        await archive_runs(db, before=CUTOFF, to=target)
    assert not target.exists() and not (tmp_path / "lossy.sqlite.partial").exists()
    assert await list_archives(db) == []
    assert (await snapshot(db, ids))[1] == 6
    assert (await verify(db)).ok


async def statements_of_archiving_a_kept_chain(db: StateDB, tmp_path: Path, n: int,
                                               monkeypatch: pytest.MonkeyPatch) -> int:
    """Add n old completed runs forming one chain that a live run still continues, and
    an old run a waiting run depends on, then archive (everything old is kept); how
    many statements the archive's transaction sent."""
    parent = None
    for _ in range(n):
        extra = {} if parent is None else {"chain_parent_id": parent, "chain_depth": 1}
        parent = await completed(db, OLD, **extra)
    dependency = await completed(db, OLD)
    await new_run(db, chain_parent_id=parent, chain_depth=1)
    await new_run(db, "waiting_dependency", depends_on=[dependency])
    sent = 0
    real = db.write

    async def counting(fn: Any, **kw: Any) -> Any:
        def unit(tx: Any) -> Any:
            nonlocal sent
            execute = tx.execute

            def count(*args: Any, **kwargs: Any) -> Any:
                nonlocal sent
                sent += 1
                return execute(*args, **kwargs)

            tx.execute = count
            try:
                return fn(tx)
            finally:
                del tx.execute
        return await real(unit, **kw)

    with monkeypatch.context() as m:
        m.setattr(db, "write", counting)
        summary = await archive_runs(db, before=CUTOFF, to=tmp_path / f"chain-{n}.sqlite")
    assert summary.runs == 0
    return sent


async def test_keeping_a_long_chain_costs_the_same_statements_as_a_short_one(
        db_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which listed runs a staying row refers to, through any number of kept runs, is
    found from one read of the references: a statement per level of the chain made
    keeping a 6,000-run chain quadratic (30 s holding the write lock)."""
    async with StateDB(db_target) as db:
        short = await statements_of_archiving_a_kept_chain(db, tmp_path, 5, monkeypatch)
        long = await statements_of_archiving_a_kept_chain(db, tmp_path, 60, monkeypatch)
        assert short == long
        assert (await verify(db)).ok


async def test_a_keyed_run_stays_while_its_key_is_to_answer(db: StateDB, tmp_path: Path) -> None:
    """Archiving a keyed run would make its key forget it: a submit with the same key
    would run the task again. Such runs stay live (with what they refer to) unless the
    operator sets a window after which keys may be used afresh."""
    from ledgerq.lifecycle import Actor
    from ledgerq.queue import TaskApplication, cancel_task, submit_task

    ops = Actor(type="operator", id="ops")
    app = TaskApplication("command", {"argv": ["true"]}, "host", idempotency_key="pay-42")
    keyed = await submit_task(db, app, now=OLD - 100 * 86400)
    plain = await submit_task(db, TaskApplication("command", {"argv": ["true"]}, "host"),
                              now=OLD)
    for rid in (keyed, plain):
        assert await cancel_task(db, rid, actor=ops, now=OLD)
    first = await archive_runs(db, before=CUTOFF, to=tmp_path / "a.sqlite")
    assert (first.runs, first.skipped, first.keyed) == (1, 1, 1)
    assert await submit_task(db, app) == keyed  # the key still answers
    # A window: keys of runs created longer ago than that expire, and those runs go.
    young = await archive_runs(db, before=CUTOFF, to=tmp_path / "b.sqlite",
                               keys_expire_after=200 * 86400)
    assert (young.runs, young.keyed) == (0, 1)
    old = await archive_runs(db, before=CUTOFF, to=tmp_path / "c.sqlite",
                             keys_expire_after=30 * 86400)
    assert (old.runs, old.skipped) == (1, 0)
    assert await submit_task(db, app) != keyed  # documented: the key was used afresh
    with pytest.raises(InvalidInput, match="keys_expire_after"):
        await archive_runs(db, before=CUTOFF, keys_expire_after=-1)
    assert (await verify(db)).ok
