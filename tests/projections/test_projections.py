"""The fact log (append-only, creation facts) and its projections: history, verify, rebuild."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers.raw import RAW_ERRORS, raw
from ledgerq import StateDB
from ledgerq.errors import IntegrityViolation
from ledgerq.lifecycle import StateReason, create
from ledgerq.projections import history, rebuild, verify
from lifecycle_support import (
    OPERATOR,
    SYSTEM,
    dispatch_values,
    move,
    new_dispatch,
    new_run,
    row,
    run_values,
)

RUN = "schedule_run"
DISPATCH = "dispatch"


async def populate(db: StateDB) -> dict[str, list[str]]:
    """A few rows of both entities in assorted states, with chained runs and a worker."""
    runs = [await new_run(db) for _ in range(4)]
    await move(db, RUN, runs[0], "queued", "running", "run.started.ok",
               patch={"leased_by": "w1", "lease_expires_at": 100.5, "lease_attempts": 1})
    await move(db, RUN, runs[0], "running", "running", "run.running.lease_renewed",
               guard={"leased_by": "w1"}, patch={"lease_expires_at": 160.25})
    await move(db, RUN, runs[1], None, "running", "run.started.ok", patch={"leased_by": "w2"})
    await move(db, RUN, runs[1], "running", "failed", "run.failed.exit_nonzero",
               patch={"exit_code": 3, "ended_at": 50.0, "error_detail": "boom"})
    await move(db, RUN, runs[2], "queued", "cancelled", "run.cancelled.operator", actor=OPERATOR)
    child = await new_run(db, "waiting_dependency", chain_parent_id=runs[0], chain_depth=1,
                          depends_on=[runs[0]], retry_policy={"max_attempts": 3})
    runs.append(child)
    await db.write(lambda conn: conn.execute(
        "INSERT INTO workers (worker_id, last_heartbeat_at, leased_run_id) VALUES (?, ?, ?)",
        ("w1", 1.0, runs[0])))
    outbox = [await new_dispatch(db) for _ in range(3)]
    await move(db, DISPATCH, outbox[0], "pending", "delivering", "dispatch.delivering.attempt",
               patch={"attempt": 1})
    await move(db, DISPATCH, outbox[0], "delivering", "dead_letter",
               "dispatch.dead_letter.exhausted", patch={"last_error": "smtp 550"})
    await move(db, DISPATCH, outbox[1], "pending", "acked", "dispatch.acked.ok")
    return {"schedule_runs": runs, "dispatch_outbox": outbox}


async def tables(db: StateDB) -> dict[str, list[dict[str, Any]]]:
    out = {t: await db.fetch_all(f"SELECT * FROM {t} ORDER BY id")
           for t in ("schedule_runs", "dispatch_outbox", "status_transitions")}
    out["workers"] = await db.fetch_all("SELECT * FROM workers ORDER BY worker_id")
    return out


# ---------------------------------------------------------------- append-only log


async def test_log_refuses_update_and_delete_at_the_database(db: StateDB) -> None:
    rid = await new_run(db)
    await move(db, RUN, rid, "queued", "running", "run.started.ok")
    before = await tables(db)
    conn = raw(db.path)
    try:
        for sql in ("UPDATE status_transitions SET status = 'completed'",
                    "UPDATE status_transitions SET patch = '{}' WHERE entity_id = ?",
                    "DELETE FROM status_transitions",
                    "DELETE FROM status_transitions WHERE entity_id = ?"):
            params = () if "?" not in sql else (rid,)
            with pytest.raises(RAW_ERRORS, match="append-only"):
                conn.execute(sql, params)
        # Also refused inside an explicit transaction, and through StateDB itself.
        conn.execute("BEGIN IMMEDIATE")
        with pytest.raises(RAW_ERRORS, match="append-only"):
            conn.execute("DELETE FROM status_transitions")
        conn.execute("ROLLBACK")
    finally:
        conn.close()
    with pytest.raises(IntegrityViolation, match="append-only"):
        await db.write(lambda tx: tx.execute(  # type: ignore[attr-defined]
            "UPDATE status_transitions SET actor = 'mallory'"))
    assert await tables(db) == before
    # Appending is of course allowed (that is how facts get in).
    assert len(before["status_transitions"]) == 2


async def test_creation_appends_a_creation_fact(db: StateDB) -> None:
    rid = await create(db, RUN, run_values("queued", queued_at=999.5, concurrency_key="ck"),
                       reason=StateReason(code="run.queued.submitted", summary="submitted",
                                          metadata={"via": "test"}),
                       actor=SYSTEM, now=1234.0)
    facts = await history(db, RUN, rid)
    assert len(facts) == 1
    fact = facts[0]
    assert fact["previous_status"] is None
    assert fact["status"] == "queued"
    assert fact["entity_version"] == 1
    assert fact["reason_code"] == "run.queued.submitted"
    assert fact["source"] == "system" and fact["actor"] == SYSTEM.id
    assert json.loads(fact["metadata"]) == {"via": "test"}
    assert fact["created_at"] == 1234.0
    patch = json.loads(fact["patch"])
    stored = await row(db, "schedule_runs", rid)
    assert stored is not None
    assert stored["version"] == 1 and stored["created_at"] == 1234.0
    # The patch carries every non-NULL initial column of the row as stored (defaults
    # included); a column it leaves out is NULL in the row.
    for col, value in stored.items():
        if col in ("status", "version"):
            continue
        assert patch.get(col) == value, col
        assert (col in patch) == (value is not None), col
    assert patch["action_kind"] == "shell"
    assert patch["queued_at"] == 999.5
    assert patch["concurrency_key"] == "ck"
    assert patch["chain_depth"] == 0 and patch["lease_attempts"] == 0  # database defaults
    assert json.loads(patch["trigger_context"]) == {"source": "test"}
    did = await create(db, DISPATCH, dispatch_values(),
                       reason=StateReason(code="dispatch.pending.created"), actor=SYSTEM)
    (dfact,) = await history(db, DISPATCH, did)
    assert dfact["previous_status"] is None and dfact["status"] == "pending"
    assert json.loads(dfact["patch"])["attempt"] == 0


async def test_failed_creation_writes_neither_row_nor_fact(db: StateDB) -> None:
    before = await tables(db)
    with pytest.raises(ValueError, match="unknown reason code"):
        await create(db, RUN, run_values(), reason=StateReason(code="run.queued.nope"),
                     actor=SYSTEM)
    with pytest.raises(ValueError, match="no column"):
        await create(db, RUN, run_values(colour="red"),
                     reason=StateReason(code="run.queued.submitted"), actor=SYSTEM)
    with pytest.raises(IntegrityViolation):  # action_kind is NOT NULL
        await create(db, RUN, {k: v for k, v in run_values().items() if k != "action_kind"},
                     reason=StateReason(code="run.queued.submitted"), actor=SYSTEM)
    assert await tables(db) == before


async def test_history_is_ordered_and_keyed_by_log_columns(db: StateDB) -> None:
    rid = await new_run(db)
    path = [("running", "run.started.ok"), ("running", "run.running.lease_renewed"),
            ("retry_wait", "run.retry_wait.backoff"), ("queued", "run.queued.retry_due"),
            ("running", "run.started.ok"), ("completed", "run.completed.ok")]
    for i, (to, code) in enumerate(path):
        # Timestamps deliberately not monotonic: order is by entity version.
        await move(db, RUN, rid, None, to, code, now=1000.0 - i)
    other = await new_run(db)
    await move(db, RUN, other, None, "cancelled", "run.cancelled.operator")
    facts = await history(db, RUN, rid)
    assert [f["entity_version"] for f in facts] == list(range(1, len(path) + 2))
    targets = [to for to, _ in path]
    assert [f["status"] for f in facts] == ["queued", *targets]
    assert [f["previous_status"] for f in facts] == [None, "queued", *targets[:-1]]
    assert {f["entity_id"] for f in facts} == {rid}
    assert {"id", "entity_type", "entity_id", "previous_status", "status", "reason_code",
            "source", "actor", "created_at", "metadata", "entity_version", "patch"} <= set(facts[0])
    assert await history(db, RUN, "no-such-run") == []
    assert await history(db, DISPATCH, rid) == [], "entity type is part of the key"
    with pytest.raises(ValueError, match="unknown entity"):
        await history(db, "widget", rid)


# ---------------------------------------------------------------- verify / rebuild


async def test_verify_is_ok_on_a_clean_database(db: StateDB) -> None:
    empty = await verify(db)
    assert empty.ok and empty.drift == []
    ids = await populate(db)
    report = await verify(db)
    assert report.ok, [str(d) for d in report.drift]
    assert report.drift == []
    assert report.rows == len(ids["schedule_runs"]) + len(ids["dispatch_outbox"])
    total = await db.fetch_one("SELECT count(*) AS n FROM status_transitions")
    assert total is not None and report.facts == total["n"]


@pytest.mark.parametrize(("table", "column", "value"), [
    ("schedule_runs", "status", "completed"),
    ("schedule_runs", "lease_expires_at", 161.0),
    ("schedule_runs", "action_args", '["rm", "-rf"]'),
    ("schedule_runs", "version", 7),
    ("schedule_runs", "updated_at", None),
    ("dispatch_outbox", "status", "pending"),
    ("dispatch_outbox", "last_error", "edited"),
    ("dispatch_outbox", "attempt", 0),
])
async def test_verify_detects_a_hand_edited_row(db: StateDB, table: str,
                                                column: str, value: Any) -> None:
    ids = await populate(db)
    target = ids[table][0]
    before = await tables(db)
    conn = raw(db.path)
    try:
        conn.execute(f"UPDATE {table} SET {column} = ? WHERE id = ?", (value, target))
    finally:
        conn.close()
    report = await verify(db)
    assert not report.ok
    assert len(report.drift) == 1, [str(d) for d in report.drift]
    (drift,) = report.drift
    assert drift.entity_id == target
    assert drift.column == column
    assert drift.actual == value
    assert target in str(drift)
    await rebuild(db)
    assert (await verify(db)).ok
    assert await tables(db) == before


async def test_verify_detects_a_deleted_row(db: StateDB) -> None:
    ids = await populate(db)
    before = await tables(db)
    gone_run, gone_dispatch = ids["schedule_runs"][2], ids["dispatch_outbox"][1]
    conn = raw(db.path)
    try:
        conn.execute("DELETE FROM schedule_runs WHERE id = ?", (gone_run,))
        conn.execute("DELETE FROM dispatch_outbox WHERE id = ?", (gone_dispatch,))
    finally:
        conn.close()
    report = await verify(db)
    assert not report.ok
    assert {(d.entity_type, d.entity_id) for d in report.drift} == {
        (RUN, gone_run), (DISPATCH, gone_dispatch)}
    assert all("missing" in d.problem for d in report.drift)
    await rebuild(db)
    assert (await verify(db)).ok
    assert await tables(db) == before


async def test_verify_detects_a_row_without_facts(db: StateDB) -> None:
    await populate(db)
    before = await tables(db)
    conn = raw(db.path)
    try:
        conn.execute("INSERT INTO schedule_runs (id, status, created_at, trigger_context, "
                     "action_kind, action_args, fired_at) "
                     "VALUES ('forged', 'completed', 0, '{}', 'k', '[]', 0)")
        conn.execute("INSERT INTO dispatch_outbox (id, status, created_at, channel, payload) "
                     "VALUES ('forged-d', 'delivered', 0, 'c', '{}')")
    finally:
        conn.close()
    report = await verify(db)
    assert not report.ok
    assert {(d.entity_type, d.entity_id) for d in report.drift} == {
        (RUN, "forged"), (DISPATCH, "forged-d")}
    assert all("no facts" in d.problem for d in report.drift)
    await rebuild(db)
    assert (await verify(db)).ok
    assert await tables(db) == before, "rebuild drops rows the log does not know"


async def test_verify_detects_a_fact_appended_without_its_projection(db: StateDB) -> None:
    rid = await new_run(db)
    conn = raw(db.path)
    try:
        conn.execute(
            "INSERT INTO status_transitions (id, entity_type, entity_id, previous_status, status,"
            " reason_code, source, actor, created_at, entity_version, patch) VALUES "
            "('sneaky', 'schedule_run', ?, 'queued', 'running', 'run.started.ok', 'system', 'x',"
            " 5, 2, '{\"leased_by\": \"ghost\"}')", (rid,))
    finally:
        conn.close()
    report = await verify(db)
    assert not report.ok
    assert {d.column for d in report.drift} >= {"status", "version", "leased_by"}
    await rebuild(db)
    assert (await verify(db)).ok
    got = await row(db, "schedule_runs", rid)
    assert got is not None and (got["status"], got["version"], got["leased_by"]) == (
        "running", 2, "ghost")


async def test_rebuild_recreates_everything_from_the_log_alone(db: StateDB) -> None:
    ids = await populate(db)
    before = await tables(db)
    conn = raw(db.path)
    try:
        conn.execute("PRAGMA foreign_keys = OFF")
        conn.execute("DELETE FROM schedule_runs")
        conn.execute("DELETE FROM dispatch_outbox")
    finally:
        conn.close()
    report = await verify(db)
    assert len(report.drift) == len(ids["schedule_runs"]) + len(ids["dispatch_outbox"])
    result = await rebuild(db)
    assert result.tables == {"schedule_runs": len(ids["schedule_runs"]),
                             "dispatch_outbox": len(ids["dispatch_outbox"]),
                             "schedule_definitions": 0}
    assert result.facts == len(before["status_transitions"])
    assert await tables(db) == before
    assert (await verify(db)).ok
    # The rebuilt rows keep working: transitions still apply with the right versions.
    res = await move(db, RUN, ids["schedule_runs"][0], "running", "completed",
                     "run.completed.ok", guard={"leased_by": "w1"})
    assert res.applied
    assert (await verify(db)).ok


async def test_rebuild_on_a_clean_database_changes_nothing(db: StateDB) -> None:
    await populate(db)
    before = await tables(db)
    await rebuild(db)
    await rebuild(db)
    assert await tables(db) == before
