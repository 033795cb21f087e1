"""bench/pg_peers/schema_floor.py writes what a ledgerq Worker writes.

The schema floor bounds ledgerq's PostgreSQL drain target only if it does the same work
as ledgerq: the same run rows and the same facts (columns, values, patch documents), so
that the log still folds to every row. Here a ledgerq pass and a floor pass each claim
and complete two of four submitted runs; their rows and facts must match but for ids,
times and lease tokens, and ``verify`` (projection == fold(log)) must pass. The same
holds for SQLite's schema floor (bench/floor.py); the asyncio floor with the contract's
checks (bench/asyncio_floor.py) must make ledgerq's checks.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from ledgerq import StateDB
from ledgerq.codec import loads
from ledgerq.errors import InvalidInput
from ledgerq.lifecycle import default_registry
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, claim_and_execute, submit_many

# Appended, never first: bench/queue.py must not shadow the standard library's queue.
sys.path.append(str(Path(__file__).resolve().parents[2] / "bench"))
from asyncio_floor import Checks, asyncio_floor
from pg_peers import schema_floor

WORKER = "w1"
#: Values that differ between any two runs whoever writes them.
VOLATILE_COLUMNS = frozenset({"id", "entity_id", "created_at", "updated_at", "ended_at",
                              "lease_expires_at", "lease_token"})
#: And when each run is submitted on its own.
SUBMITTED_AT = VOLATILE_COLUMNS | {"fired_at", "queued_at"}
TOKEN = re.compile(r"^[0-9a-f]{32}$")


async def _noop(run: dict[str, Any]) -> tuple[int, str]:
    return 0, ""


def _masked(values: dict[str, Any], volatile: frozenset[str] = VOLATILE_COLUMNS
            ) -> dict[str, Any]:
    out = {k: "<varies>" if k in volatile and v is not None else v
           for k, v in values.items()}
    if isinstance(out.get("patch"), dict):
        out["patch"] = _masked(out["patch"], volatile)
    return out


def _written(conn: psycopg.Connection[dict[str, Any]], run_id: str
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    row = conn.execute("SELECT * FROM schedule_runs WHERE id = %s", (run_id,)).fetchone()
    assert row is not None
    facts = conn.execute("SELECT * FROM status_transitions WHERE entity_id = %s "
                         "ORDER BY entity_version", (run_id,)).fetchall()
    return row, facts


async def test_the_schema_floor_writes_the_rows_and_facts_a_worker_writes(
        pg_target: str) -> None:
    app = TaskApplication("command", {"argv": ["true"]}, "host")
    async with StateDB(pg_target) as db:
        ids = await submit_many(db, [app] * 4)
        assert await claim_and_execute(db, worker_id=WORKER, execute=_noop, limit=2) == 2
        with psycopg.connect(pg_target, autocommit=True, row_factory=dict_row) as conn:
            completed = "SELECT id FROM schedule_runs WHERE status = 'completed' ORDER BY id"
            ledgerq_ids = [r["id"] for r in conn.execute(completed)]
            with psycopg.connect(pg_target, autocommit=True) as floor_conn:
                assert schema_floor.run_pass(floor_conn, WORKER, 2,
                                               schema_floor.Cursor()) == 2
            assert [r["id"] for r in conn.execute(completed)] == sorted(ids)
            floor_ids = [i for i in ids if i not in ledgerq_ids]
            assert len(ledgerq_ids) == len(floor_ids) == 2
            reference_row, reference_facts = _written(conn, ledgerq_ids[0])
            assert [f["status"] for f in reference_facts] == ["queued", "running", "completed"]
            for run_id in [ledgerq_ids[1], *floor_ids]:
                row, facts = _written(conn, run_id)
                assert TOKEN.match(row["lease_token"])
                assert _masked(row) == _masked(reference_row)
                assert [_masked(f) for f in facts] == [_masked(f) for f in reference_facts]
        report = await verify(db)
        assert report.ok, report.drift
        assert report.rows == 4 and report.facts == 12


async def test_the_schema_floors_bulk_writes_the_rows_and_facts_submit_many_writes(
        pg_target: str) -> None:
    """Its COPYs bound ledgerq's bulk submit only if they write what submit_many writes."""
    async with StateDB(pg_target) as db:
        ids = await submit_many(db, [schema_floor.ledgerq_units._app()] * 2)
        schema_floor.submit_bulk(pg_target, 2)
        with psycopg.connect(pg_target, autocommit=True, row_factory=dict_row) as conn:
            every = [r["id"] for r in conn.execute("SELECT id FROM schedule_runs")]
            floor_ids = [i for i in every if i not in ids]
            assert len(floor_ids) == 2
            reference_row, reference_facts = _written(conn, ids[0])
            for run_id in [ids[1], *floor_ids]:
                row, facts = _written(conn, run_id)
                assert _masked(row, SUBMITTED_AT) == _masked(reference_row, SUBMITTED_AT)
                assert [_masked(f, SUBMITTED_AT) for f in facts] == \
                    [_masked(f, SUBMITTED_AT) for f in reference_facts]
        report = await verify(db)
        assert report.ok, report.drift


# ------------------------------------------------------------ SQLite (bench/floor.py)


async def test_the_sqlite_schema_floor_writes_the_rows_and_facts_ledgerq_writes(
        tmp_path: Path) -> None:
    """bench/floor.py bounds the SQLite targets only if its statements write what
    ledgerq's do: one submit and one pass each, alone and joined, the same rows and facts
    but for ids, times and tokens, and the log still folds to every row."""
    import floor  # bench/floor.py (on the path above)

    path = str(tmp_path / "floor.db")
    app = floor.APP
    async with StateDB(path) as db:
        alone = await submit_many(db, [app])
        joined = await submit_many(db, [app] * 2)
        conn = floor.connect(path, "NORMAL")
        try:
            floor._submit_all(conn, 1, 1)  # submit_row
            floor._submit_all(conn, 2, 2)  # submit_rows
            assert await claim_and_execute(db, worker_id=floor.WORKER, execute=_noop,
                                           limit=3) == 3
            assert floor._passes(conn, floor.claim_page(db.registry), 3) == 3
        finally:
            conn.close()
        rows = {r["id"]: r for r in await db.fetch_all("SELECT * FROM schedule_runs")}
        assert len(rows) == 6 and {r["status"] for r in rows.values()} == {"completed"}
        floor_ids = [i for i in rows if i not in {*alone, *joined}]

        async def written(run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
            facts = await db.fetch_all("SELECT * FROM status_transitions WHERE entity_id = ? "
                                       "ORDER BY entity_version", (run_id,))
            for f in facts:
                f["patch"] = loads(f["patch"])
            return rows[run_id], facts

        reference_row, reference_facts = await written(alone[0])
        assert [f["status"] for f in reference_facts] == ["queued", "running", "completed"]
        for run_id in [*joined, *floor_ids]:
            row, facts = await written(run_id)
            assert _masked(row, SUBMITTED_AT) == _masked(reference_row, SUBMITTED_AT)
            assert [_masked(f, SUBMITTED_AT) for f in facts] == \
                [_masked(f, SUBMITTED_AT) for f in reference_facts]
        report = await verify(db)
        assert report.ok, report.drift


# ------------------------------------------------------------ SQLite (bench/asyncio_floor.py)


async def test_the_checked_asyncio_floor_makes_ledgerqs_checks(tmp_path: Path) -> None:
    """bench/asyncio_floor.py's checked floor bounds target 2 for an implementation of
    ledgerq's contract only if it makes the contract's checks: it runs its scenario to
    the end, and its checks refuse what ledgerq refuses."""
    registry = default_registry()
    got = await asyncio_floor(str(tmp_path / "checked.db"), registry, "OFF", 4, 2,
                              checked=True)
    assert got["lifecycle"] > 0
    checks = Checks(registry)
    lease = {"leased_by": "w", "lease_expires_at": 1.5, "lease_token": "ab",
             "lease_attempts": 1}
    checks.claimed(lease)
    checks.ending(lease)
    for bad in ({"lease_expires_at": float("nan")}, {"leased_by": "w\x00"},
                {"lease_token": "\udc80"}):
        with pytest.raises(InvalidInput):
            checks.claimed({**lease, **bad})
        with pytest.raises(InvalidInput):
            checks.ending({**lease, **bad})
    with pytest.raises(InvalidInput):  # a claim's attempts, which only its patch holds
        checks.claimed({**lease, "lease_attempts": 2**63})


async def test_target_2s_bound_runs_ledgerqs_units_to_their_end(tmp_path: Path) -> None:
    """bench/runtime.py's bound for ledgerq's units as they are (the units alone plus the
    asyncio shape's cost) stands on a ceiling that ran every lifecycle to ``completed``,
    its log folding to every row; a round's shape adds its own time, and never a
    negative one."""
    from runtime import database_thread_ceiling, shaped_ceiling

    path = tmp_path / "ceiling.db"
    assert database_thread_ceiling(path, 130, synchronous="OFF") > 0
    async with StateDB(path) as db:
        rows = await db.fetch_all("SELECT status, count(*) AS n FROM schedule_runs "
                                  "GROUP BY status")
        assert rows == [{"status": "completed", "n": 130}]
        assert (await verify(db)).ok
    # 2 ms a lifecycle for the units, and the shape's 0.25 ms (1.25 ms under the asyncio
    # floor against 1 ms under the floor): 2.25 ms, 444/s.
    assert shaped_ceiling(500.0, 800.0, 1000.0) == pytest.approx(1 / 0.00225)
    assert shaped_ceiling(500.0, 1200.0, 1000.0) == 500.0
