"""A migration killed at any moment leaves the database exactly before or exactly after.

A process opens a database of many rows with specs that add a state (on SQLite a table
rebuild that copies every row; on PostgreSQL a constraint that validates every row) and
is SIGKILLed after a varying delay. Whatever the moment, the next open finds either the
old schema and record or the new ones, never a mix, every row and fact still there, and
projection == fold(log).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evolution_support import SpecDir
from ledgerq import StateDB
from ledgerq.errors import IntegrityViolation
from ledgerq.lifecycle import Actor, StateReason
from ledgerq.lifecycle.engine import create_entities
from ledgerq.lifecycle.registry import load_registry, packaged_specs_dir
from ledgerq.projections import verify

ROWS = 20_000
OPEN = ("import asyncio, sys\n"
        "from ledgerq import StateDB\n"
        "from ledgerq.lifecycle.registry import load_registry\n"
        "async def main():\n"
        "    print('opening', flush=True)\n"
        "    async with StateDB(sys.argv[1], registry=load_registry(sys.argv[2])):\n"
        "        pass\n"
        "asyncio.run(main())\n")


async def _fill(target: str) -> None:
    async with StateDB(target, registry=load_registry(packaged_specs_dir())) as db:
        policy = db.registry.entity("schedule_run")
        now = time.time()
        rows = [{"status": "queued", "trigger_context": "{}", "action_kind": "agent",
                 "action_args": "{}", "fired_at": now, "queued_at": now,
                 "execution_target": "host"} for _ in range(ROWS)]
        await db.write(lambda tx: create_entities(
            tx, policy, rows, reason=StateReason(code="run.queued.submitted"),
            actor=Actor(type="system", id="fill")))


@pytest.mark.slow
async def test_a_killed_migration_is_all_or_nothing(db_target: str, tmp_path: Path) -> None:
    await _fill(db_target)
    specs = SpecDir(tmp_path / "specs").paused()
    outcomes = set()
    for delay in (0.0, 0.05, 0.1, 0.2, 0.35, 0.6):
        async with StateDB(db_target, migrate_on_open=False) as db:
            recorded = db.recorded["schedule_run"]
        if "paused" in recorded["states"]:
            break  # a run finished the migration: the rest have nothing to interrupt
        proc = subprocess.Popen([sys.executable, "-c", OPEN, db_target, str(specs.path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None
        proc.stdout.readline()  # imported and about to open
        await asyncio.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        # Read back with specs that know nothing of the change (they never migrate it).
        async with StateDB(db_target, registry=load_registry(packaged_specs_dir())) as db:
            migrated = "paused" in db.recorded["schedule_run"]["states"]
            outcomes.add(migrated)
            counts = await db.fetch_one(
                "SELECT (SELECT count(*) FROM schedule_runs) AS rows, "
                "(SELECT count(*) FROM status_transitions) AS facts")
            assert counts == {"rows": ROWS, "facts": ROWS}
            some = (await db.fetch_one("SELECT id FROM schedule_runs LIMIT 1") or {})["id"]
            if migrated:  # the schema admits the state the recorded spec has
                await db.write(lambda tx, i=some: tx.execute(
                    "UPDATE schedule_runs SET status = 'paused' WHERE id = ?", [i]))
                await db.write(lambda tx, i=some: tx.execute(
                    "UPDATE schedule_runs SET status = 'queued' WHERE id = ?", [i]))
            else:  # and not the one it lacks
                with pytest.raises(IntegrityViolation):
                    await db.write(lambda tx, i=some: tx.execute(
                        "UPDATE schedule_runs SET status = 'paused' WHERE id = ?", [i]))
            report = await verify(db)
            assert report.ok, report.drift[:3]
    # The last open (not killed) migrates whatever state the kills left.
    async with StateDB(db_target, registry=load_registry(specs.path)) as db:
        assert "paused" in db.recorded["schedule_run"]["states"]
        assert (await verify(db)).ok
    assert False in outcomes, "no kill landed before the migration committed"
