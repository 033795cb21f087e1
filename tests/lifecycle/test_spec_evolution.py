"""Spec evolution on live databases, both backends: additive changes migrate on open,
older openers keep working, conflicts are refused changing nothing, and
``migrate --apply`` removes deliberately.

Every database here is first created with the previous release's spec files
(tests/specs_v1, saved as they shipped) and filled, as a user's would be.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from evolution_support import OPERATOR, SPECS_V1, SpecDir, fill_v1, snapshot
from ledgerq import StateDB
from ledgerq.errors import IntegrityViolation, MigrationRefused
from ledgerq.lifecycle import StateReason, TransitionRequest, transition
from ledgerq.lifecycle.evolution import StateMapping
from ledgerq.lifecycle.registry import load_registry
from ledgerq.projections import history, verify

DEPLOYMENT = Path(__file__).resolve().parents[2] / "docs" / "examples" / "deployment.toml"


@pytest.fixture
async def v1(db_target: str) -> AsyncIterator[tuple[str, dict[str, list[str]]]]:
    yield db_target, await fill_v1(db_target)


def _key() -> str:
    return uuid.uuid4().hex


async def _facts(db: StateDB, ids: list[str]) -> list[list[dict[str, Any]]]:
    return [await history(db, "schedule_run", i) for i in ids]


async def test_a_new_state_migrates_on_open(v1: tuple[str, dict[str, list[str]]],
                                            tmp_path: Path) -> None:
    target, rows = v1
    async with StateDB(target, registry=load_registry(SPECS_V1)) as old:
        before = await _facts(old, rows["all"])
        versions = {r["id"]: r["version"] for r in await old.fetch_all(
            "SELECT id, version FROM schedule_runs")}
    async with StateDB(target, registry=load_registry(SPECS_V1)) as old:
        # A worker row referencing a run: the rebuilt table must keep the reference.
        await old.write(lambda tx: tx.execute(
            "INSERT INTO workers (worker_id, last_heartbeat_at, leased_run_id) "
            "VALUES ('w1', 1, ?)", [rows["running"][0]]))
    specs = SpecDir(tmp_path / "specs").paused()
    async with StateDB(target, registry=load_registry(specs.path)) as db:
        assert db.migration is not None and not db.migration.empty
        run = rows["running"][0]
        assert await db.fetch_one("SELECT leased_run_id FROM workers") == {
            "leased_run_id": run}
        with pytest.raises(IntegrityViolation):  # the foreign key is still enforced
            await db.write(lambda tx: tx.execute(
                "DELETE FROM schedule_runs WHERE id = ?", [run]))
        if db.dialect == "sqlite":
            assert await db.fetch_all("PRAGMA foreign_key_check") == []
        moved = await transition(db, TransitionRequest(
            entity_type="schedule_run", entity_id=run, from_state="running",
            to_state="paused", reason=StateReason(code="run.paused.operator"),
            actor=OPERATOR, idempotency_key=_key()))
        assert moved.applied and moved.current_state == "paused"
        report = await verify(db)
        assert report.ok, report.drift
        # The history of every row is unchanged; only the new move was appended.
        after = await _facts(db, rows["all"])
        assert [a[: len(b)] for a, b in zip(after, before, strict=True)] == before
        assert {r["id"]: r["version"] for r in await db.fetch_all(
            "SELECT id, version FROM schedule_runs")} == {
                **versions, run: versions[run] + 1}
        # The log is still append-only, and the database still refuses undeclared states.
        with pytest.raises(IntegrityViolation):
            await db.write(lambda tx: tx.execute("DELETE FROM status_transitions"))
        with pytest.raises(IntegrityViolation):
            await db.write(lambda tx: tx.execute(
                "UPDATE schedule_runs SET status = 'nowhere' WHERE id = ?", [run]))
        recorded = await db.fetch_one(
            "SELECT spec_hash FROM ledgerq_specs WHERE entity = 'schedule_run'")
        assert recorded is not None
    # Reopening with the same specs migrates nothing.
    async with StateDB(target, registry=load_registry(specs.path)) as again:
        assert again.migration is None


async def test_every_additive_kind_migrates(v1: tuple[str, dict[str, list[str]]],
                                            tmp_path: Path) -> None:
    target, rows = v1
    specs = SpecDir(tmp_path / "specs").paused()
    specs.replace("[columns]\n", '[columns]\nurgency = { type = "integer", default = 5 }\n'
                  'owner_team = "text"\nlabels = "json"\n')
    specs.replace('patch_columns = [\n', 'patch_columns = [\n  "owner_team", "urgency",\n')
    specs.append('''
[[indexes]]
name = "idx_schedule_runs_owner_team"
columns = ["owner_team"]
where_not_null = ["owner_team"]
''')
    shutil.copy(DEPLOYMENT, specs.path / "deployment.toml")  # and a whole new entity
    specs.replace('"schedule.retired.operator"', '"schedule.paused.deferred" = "Deferred by '
                  'its owner."\n"schedule.retired.operator"', "schedule.toml")
    async with StateDB(target, registry=load_registry(specs.path)) as db:
        stored = await db.fetch_all("SELECT id, urgency, owner_team FROM schedule_runs")
        assert {r["urgency"] for r in stored} == {5}
        assert {r["owner_team"] for r in stored} == {None}
        run = rows["running"][0]
        result = await transition(db, TransitionRequest(
            entity_type="schedule_run", entity_id=run, from_state="running",
            to_state="paused", reason=StateReason(code="run.paused.operator"),
            actor=OPERATOR, idempotency_key=_key()),
            patch={"owner_team": "infra", "urgency": 1})
        assert result.applied, result
        row = await db.fetch_one("SELECT owner_team, urgency FROM schedule_runs WHERE id = ?",
                                 [run])
        assert row == {"owner_team": "infra", "urgency": 1}
        if db.dialect == "sqlite":
            names = {r["name"] for r in await db.fetch_all(
                "SELECT name FROM sqlite_master WHERE type = 'index'")}
        else:
            names = {r["indexname"] for r in await db.fetch_all(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")}
        assert "idx_schedule_runs_owner_team" in names
        assert "idx_schedule_runs_claim" in names
        assert (await verify(db)).ok
        assert await db.fetch_all("SELECT id FROM deployments") == []
        lines = db.migration.lines() if db.migration else []
        assert "additive: add entity deployment.deployment (table deployments)" in lines


async def test_an_older_opener_neither_fails_nor_downgrades(
        v1: tuple[str, dict[str, list[str]]], tmp_path: Path) -> None:
    target, rows = v1
    specs = SpecDir(tmp_path / "specs").paused()
    async with StateDB(target, registry=load_registry(specs.path)) as new:
        await transition(new, TransitionRequest(
            entity_type="schedule_run", entity_id=rows["running"][0], from_state="running",
            to_state="paused", reason=StateReason(code="run.paused.operator"),
            actor=OPERATOR, idempotency_key=_key()))
        recorded = await new.fetch_all("SELECT entity, spec_hash FROM ledgerq_specs")
    async with StateDB(target, registry=load_registry(SPECS_V1)) as old:
        assert old.migration is None or old.migration.empty
        assert old.migration is None or any(
            "paused" in str(c) for e in old.migration.entities for c in e.kept)
        assert await old.fetch_all("SELECT entity, spec_hash FROM ledgerq_specs") == recorded
        # It serves the states it knows...
        moved = await transition(old, TransitionRequest(
            entity_type="schedule_run", entity_id=rows["running"][1], from_state="running",
            to_state="completed", reason=StateReason(code="run.completed.ok"),
            actor=OPERATOR, idempotency_key=_key()))
        assert moved.applied
    # ...and the newer process still can move what the older does not know.
    async with StateDB(target, registry=load_registry(specs.path)) as new:
        assert new.migration is None
        moved = await transition(new, TransitionRequest(
            entity_type="schedule_run", entity_id=rows["running"][0], from_state="paused",
            to_state="queued", reason=StateReason(code="run.queued.resumed"),
            actor=OPERATOR, idempotency_key=_key()))
        assert moved.applied


async def test_a_newer_and_an_older_change_merge(v1: tuple[str, dict[str, list[str]]],
                                                 tmp_path: Path) -> None:
    """Two branches of one release: each adds its own state; the database takes both."""
    target, _ = v1
    a = SpecDir(tmp_path / "a").paused()
    b = SpecDir(tmp_path / "b").append('''
[states.held]
description = "Held for review."

[[edges]]
from = "queued"
to = ["held"]

[[edges]]
from = "held"
to = ["queued"]
''').codes({"run.held.review": "Held for review."})
    async with StateDB(target, registry=load_registry(a.path)):
        pass
    async with StateDB(target, registry=load_registry(b.path)) as db:
        assert db.migration is not None
        spec = await db.fetch_one(
            "SELECT spec FROM ledgerq_specs WHERE entity = 'schedule_run'")
        assert spec is not None and '"paused"' in spec["spec"] and '"held"' in spec["spec"]


@pytest.mark.parametrize("edit, blocks", [
    pytest.param(lambda s: s.append('''
[[edges]]
from = "cancelled"
to = ["queued"]
''').replace('terminal = ["completed", "failed", "timed_out", "skipped", "cancelled"]',
             'terminal = ["completed", "failed", "timed_out", "skipped"]').replace(
        'outcome = "cancelled"\n', ''),
        "'cancelled'", id="terminal-given-edges"),
    pytest.param(lambda s: s.replace('exit_code = "integer"', 'exit_code = "json"'),
                 "exit_code", id="column-retyped-with-data"),
    pytest.param(lambda s: s.replace("[columns]\n",
                                     '[columns]\nteam = { type = "text", not_null = true }\n'),
                 "team", id="not-null-without-default"),
    pytest.param(lambda s: s.file().write_text(
        s.file().read_text().replace('"schedule_runs"', '"runs"')), "renamed",
        id="table-renamed"),
])
async def test_conflicts_are_refused_changing_nothing(
        v1: tuple[str, dict[str, list[str]]], tmp_path: Path, edit: Any, blocks: str) -> None:
    target, rows = v1
    if blocks == "exit_code":
        async with StateDB(target, registry=load_registry(SPECS_V1)) as db:
            await db.write(lambda tx: tx.execute(
                "UPDATE schedule_runs SET exit_code = 3 WHERE id = ?", [rows["cancelled"][0]]))
    async with StateDB(target, registry=load_registry(SPECS_V1)) as db:
        before = await snapshot(db)
    specs = SpecDir(tmp_path / "specs")
    edit(specs)
    registry = load_registry(specs.path)
    with pytest.raises(MigrationRefused) as caught:
        async with StateDB(target, registry=registry):
            pass
    message = str(caught.value)
    assert blocks in message and "nothing was changed" in message
    if blocks == "'cancelled'":
        assert "1 row" in message and rows["cancelled"][0] in message
    if blocks == "exit_code":
        assert rows["cancelled"][0] in message
    async with StateDB(target, registry=load_registry(SPECS_V1)) as db:
        assert await snapshot(db) == before


async def test_apply_removes_a_state_only_with_its_rows_mapped(
        v1: tuple[str, dict[str, list[str]]], tmp_path: Path) -> None:
    target, rows = v1
    paused = SpecDir(tmp_path / "paused").paused()
    async with StateDB(target, registry=load_registry(paused.path)) as db:
        for run in rows["running"]:
            await transition(db, TransitionRequest(
                entity_type="schedule_run", entity_id=run, from_state="running",
                to_state="paused", reason=StateReason(code="run.paused.operator"),
                actor=OPERATOR, idempotency_key=_key()))
    # Back to the old graph, with a reason code for the rows the mapping moves.
    back = SpecDir(tmp_path / "back").codes(
        {"run.queued.migrated": "Moved by a migration out of a removed state."})
    async with StateDB(target, registry=load_registry(back.path)) as db:
        before = await snapshot(db)
        plan = await db.migrate(dry_run=True)
        assert any("refused" in line and "paused" in line and "2 rows" in line
                   for line in plan.lines()), plan.lines()
        with pytest.raises(MigrationRefused) as caught:
            await db.migrate()
        assert "--map-state schedule_run:paused=STATE" in str(caught.value)
        assert await snapshot(db) == before
        plan = await db.migrate([StateMapping.parse("schedule_run:paused=queued")])
        assert not plan.refusals
        for run in rows["running"]:
            facts = await history(db, "schedule_run", run)
            assert (facts[-1]["previous_status"], facts[-1]["status"],
                    facts[-1]["reason_code"]) == ("paused", "queued", "run.queued.migrated")
        assert (await verify(db)).ok
        with pytest.raises(IntegrityViolation):
            await db.write(lambda tx: tx.execute(
                "UPDATE schedule_runs SET status = 'paused' WHERE id = ?", [rows["all"][0]]))
        spec = await db.fetch_one(
            "SELECT spec FROM ledgerq_specs WHERE entity = 'schedule_run'")
        assert spec is not None and '"paused"' not in spec["spec"]
        # Every version the database was migrated to is kept: the log's old facts are
        # explained by the spec that was in force when they were appended.
        versions = await db.fetch_all(
            "SELECT spec FROM ledgerq_spec_versions WHERE entity = 'schedule_run'")
        # v1; v1 with paused (and the outcomes); that with the migration's reason code
        # (opening `back`); `back` itself, applied.
        assert len(versions) == 4 and any('"paused"' in v["spec"] for v in versions)


async def test_a_database_from_before_recorded_specs_is_adopted(
        v1: tuple[str, dict[str, list[str]]], tmp_path: Path) -> None:
    target, rows = v1
    async with StateDB(target, registry=load_registry(SPECS_V1)) as db:
        for table in ("ledgerq_specs", "ledgerq_spec_versions", "ledgerq_schema"):
            await db.write(lambda tx, t=table: tx.execute(f"DROP TABLE {t}"))
    specs = SpecDir(tmp_path / "specs").paused()
    async with StateDB(target, registry=load_registry(specs.path)) as db:
        await transition(db, TransitionRequest(
            entity_type="schedule_run", entity_id=rows["running"][0], from_state="running",
            to_state="paused", reason=StateReason(code="run.paused.operator"),
            actor=OPERATOR, idempotency_key=_key()))
        assert (await verify(db)).ok
        assert await db.fetch_one("SELECT spec_hash FROM ledgerq_specs WHERE entity = "
                                  "'schedule_run'") is not None


async def test_concurrent_openers_serialize_and_exactly_one_migrates(
        v1: tuple[str, dict[str, list[str]]], tmp_path: Path) -> None:
    """Six processes (hosts) open one database with newer specs at the same moment."""
    from test_queue_processes import HELPERS, finish, start_together

    target, _ = v1
    specs = SpecDir(tmp_path / "specs").paused()
    go = tmp_path / "go"
    procs = start_together([[str(HELPERS / "open_with_specs.py"), target, str(specs.path),
                             str(go)] for _ in range(6)], go)
    reports = [json.loads(out) for out in finish(procs)]
    assert sum(r["migrated"] for r in reports) == 1, reports
    async with StateDB(target, registry=load_registry(specs.path)) as db:
        assert db.migration is None
        assert (await verify(db)).ok
        versions = await db.fetch_all("SELECT spec_hash FROM ledgerq_spec_versions "
                                      "WHERE entity = 'schedule_run'")
        assert len(versions) == 2  # v1, and the one migration


async def test_an_opener_that_waited_for_another_s_migration_locks_nothing(
        pg_target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker and a submit start together on a new database: one creates the schema;
    the other read it as missing first, so it waits for the schema lock, and must then
    find the schema current and run no DDL. Its ``CREATE OR REPLACE TRIGGER`` on the log
    would otherwise wait for, and deadlock with, the first one's submit, which holds its
    run and wants the log (as it once did in CI)."""
    import psycopg

    from ledgerq.store.postgres import schema

    async with StateDB(pg_target):
        pass
    registry = load_registry()
    monkeypatch.setattr(schema, "is_current", lambda conn, registry: False)
    with psycopg.connect(pg_target) as submit, psycopg.connect(pg_target) as opener:
        submit.execute("LOCK TABLE schedule_runs IN ROW EXCLUSIVE MODE")  # its run, written
        opener.execute("SET lock_timeout = '3s'")
        opener.commit()
        assert schema.open_schema(opener, registry) is None
        submit.execute("LOCK TABLE status_transitions IN ROW EXCLUSIVE MODE")  # its fact


async def test_a_migration_beside_a_submit_takes_the_tables_in_the_writers_order(
        pg_target: str, tmp_path: Path) -> None:
    """A real migration (a new state: the runs' CHECK is altered) starts while a submit
    holds its run: the migration must wait for that run's table before it locks the log,
    so the submit's fact goes in, it commits, and the migration follows."""
    import threading

    import psycopg

    from ledgerq.store.postgres import schema

    async with StateDB(pg_target, registry=load_registry(SPECS_V1)):
        pass
    registry = load_registry(SpecDir(tmp_path / "specs").paused().path)
    outcome: dict[str, Any] = {}

    def migrate() -> None:
        try:
            with psycopg.connect(pg_target) as conn:
                outcome["plan"] = schema.open_schema(conn, registry)
        except psycopg.Error as exc:
            outcome["error"] = exc

    with psycopg.connect(pg_target, autocommit=True) as watch, \
            psycopg.connect(pg_target) as submit:
        submit.execute("SET lock_timeout = '10s'")
        submit.execute("LOCK TABLE schedule_runs IN ROW EXCLUSIVE MODE")
        thread = threading.Thread(target=migrate)
        thread.start()
        for _ in range(500):  # until the migration waits for the run's table
            waiting = watch.execute("SELECT count(*) FROM pg_locks WHERE NOT granted "
                                    "AND relation = 'schedule_runs'::regclass").fetchone()
            if (waiting and waiting[0]) or not thread.is_alive():
                break
            await asyncio.sleep(0.02)
        submit.execute("LOCK TABLE status_transitions IN ROW EXCLUSIVE MODE")
        submit.commit()
        thread.join(timeout=60)
    assert "error" not in outcome, outcome
    assert outcome["plan"] is not None and not outcome["plan"].empty


async def test_an_older_release_never_lowers_the_recorded_schema_version(
        v1: tuple[str, dict[str, list[str]]], tmp_path: Path) -> None:
    """A newer release recorded its own tables' version: this one opens the database,
    migrates what its specs add, and leaves that version as it is."""
    from ledgerq.lifecycle.evolution import SCHEMA_VERSION

    target, _ = v1
    async with StateDB(target) as db:
        await db.write(lambda tx: tx.execute(
            "UPDATE ledgerq_schema SET value = ? WHERE key = 'schema_version'",
            [str(SCHEMA_VERSION + 1)]))
    specs = SpecDir(tmp_path / "specs").paused()
    async with StateDB(target, registry=load_registry(specs.path)) as db:
        assert db.migration is not None and not db.migration.empty
        row = await db.fetch_one(
            "SELECT value FROM ledgerq_schema WHERE key = 'schema_version'")
        assert row == {"value": str(SCHEMA_VERSION + 1)}
    async with StateDB(target, registry=load_registry(specs.path)) as db:
        assert db.migration is None  # current: no lock, no DDL


async def test_runs_from_before_queues_migrate_to_priority_0_in_the_default_queue(
        v1: tuple[str, dict[str, list[str]]]) -> None:
    from ledgerq.queue import TaskApplication, claim_runs, submit_task

    target, rows = v1
    async with StateDB(target) as db:  # the packaged specs: priority, queue, their index
        assert db.migration is not None
        lines = db.migration.lines()
        assert "additive: add column schedule_run.priority" in lines, lines
        assert "additive: add index schedule_run.idx_schedule_runs_claim_order" in lines
        stored = await db.fetch_all("SELECT id, priority, queue FROM schedule_runs")
        assert {r["id"] for r in stored} == set(rows["all"])
        assert {(r["priority"], r["queue"]) for r in stored} == {(0, "default")}
        assert (await verify(db)).ok
        old = [r for r in rows["all"] if r not in rows["running"] + rows["cancelled"]]
        urgent = await submit_task(db, TaskApplication("agent", {}, "host", priority=3))
        elsewhere = await submit_task(db, TaskApplication("agent", {}, "host", queue="other"))
        # Claim order on the migrated table: the new urgent run, then the old one; the
        # other queue's run only by a worker serving it.
        got = await claim_runs(db, worker_id="host:00000001", limit=1)
        assert [r["id"] for r in got.claimed] == [urgent]
        got = await claim_runs(db, worker_id="host:00000001", limit=5)
        assert [r["id"] for r in got.claimed] == old
        got = await claim_runs(db, worker_id="host:00000002", limit=5, queues=["other"])
        assert [r["id"] for r in got.claimed] == [elsewhere]
        assert (await verify(db)).ok


async def test_a_new_index_may_not_take_a_name_only_the_database_still_has(
        v1: tuple[str, dict[str, list[str]]], tmp_path: Path) -> None:
    """The previous release's claim index left the spec but stays in databases until
    `migrate --apply`: a new entity's index of that name would be skipped by CREATE INDEX
    IF NOT EXISTS, silently. Refused, naming the owner, and nothing changes."""
    target, _ = v1
    async with StateDB(target) as db:  # this release: idx_schedule_runs_claim is kept
        before = await snapshot(db)
    specs = SpecDir(tmp_path / "specs")
    specs.path.joinpath("deployment.toml").write_text(DEPLOYMENT.read_text().replace(
        "[columns]", '[[indexes]]\nname = "idx_schedule_runs_claim"\ncolumns = ["version"]'
        "\n\n[columns]", 1))
    with pytest.raises(MigrationRefused) as caught:
        async with StateDB(target, registry=load_registry(specs.path)):
            pass
    message = str(caught.value)
    assert "'idx_schedule_runs_claim'" in message and "'schedule_run'" in message
    assert "nothing was changed" in message
    async with StateDB(target) as db:
        assert await snapshot(db) == before
