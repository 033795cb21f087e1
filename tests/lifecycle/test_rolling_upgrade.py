"""A rolling upgrade: two `ledgerq worker` processes, one on the specs a database was
made with and one on a newer spec directory that adds a state, serve one database at
once (both backends). The older worker leaves rows in the state it does not know alone,
says so, and keeps running; nothing runs twice; the log explains every row.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from evolution_support import SpecDir, move
from ledgerq import StateDB
from ledgerq.lifecycle.registry import load_registry, packaged_specs_dir
from ledgerq.projections import history, verify
from ledgerq.queue import TaskApplication, submit_many

TIMEOUT = 60


def _worker(db: str, specs: Path, name: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "ledgerq", "--db", db, "--specs", str(specs), "worker",
         "--worker-id", name, "--poll-interval", "0.05", "--capacity", "2"],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"), env={**os.environ})


async def _wait_for(db: StateDB, ids: list[str], states: set[str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        rows = await db.fetch_all("SELECT id, status FROM schedule_runs")
        if all(r["status"] in states for r in rows if r["id"] in ids):
            return
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.05)


async def _registered(db: StateDB, ids: set[str],
                      procs: dict[str, subprocess.Popen[bytes]], logs: dict[str, Path]) -> None:
    """Return once every worker id in ``ids`` has registered in the workers table (its
    signal handlers are in place by then); fail if any of ``procs`` dies first."""
    deadline = time.monotonic() + TIMEOUT
    while not ids <= {r["worker_id"] for r in await db.fetch_all(
            "SELECT worker_id FROM workers")}:
        for name, proc in procs.items():
            assert proc.poll() is None, f"{name} worker died: {logs[name].read_text()}"
        assert time.monotonic() < deadline, "the workers did not register"
        await asyncio.sleep(0.05)


@pytest.mark.slow
async def test_old_and_new_workers_share_one_database(db_target: str, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    newer = SpecDir(tmp_path / "newer").paused().append('''
[[edges]]
from = "queued"
to = ["paused"]
''')
    older = packaged_specs_dir()

    def task(token: str) -> TaskApplication:
        return TaskApplication("command", {"argv": [
            "sh", "-c", 'printf "%s\\n" "$1" >> "$2"', "sh", token, str(marker)]}, "host")

    async with StateDB(db_target, registry=load_registry(older)):
        pass  # the database as the older release made it
    async with StateDB(db_target, registry=load_registry(newer.path)) as db:
        assert db.migration is not None  # the newer specs' state migrated on open
        held = await submit_many(db, [task(f"held-{i}") for i in range(3)])
        for run in held:
            assert await move(db, run, "queued", "paused", "run.paused.operator")
        recorded = await db.fetch_all("SELECT entity, spec_hash FROM ledgerq_specs")

        logs = {n: tmp_path / f"{n}.log" for n in ("old", "new")}
        procs = {"old": _worker(db_target, older, "old:1", logs["old"]),
                 "new": _worker(db_target, newer.path, "new:1", logs["new"])}
        try:
            # Both serve before the work arrives: on a loaded machine a worker still
            # importing when the rest is done would serve nothing (and die of the SIGTERM
            # that stops it, before it has a handler for it).
            await _registered(db, {"old:1", "new:1"}, procs, logs)
            free = await submit_many(db, [task(f"free-{i}") for i in range(8)])
            await _wait_for(db, free, {"completed"})
            # The held runs were left alone by both (claims take queued rows only)...
            assert {r["status"] for r in await db.fetch_all(
                "SELECT status FROM schedule_runs WHERE status = 'paused'")} == {"paused"}
            # ...and the older worker said why it leaves them: a state its specs lack.
            deadline = time.monotonic() + TIMEOUT
            while "not declared by the loaded specs" not in logs["old"].read_text():
                assert procs["old"].poll() is None, logs["old"].read_text()
                assert time.monotonic() < deadline, logs["old"].read_text()
                await asyncio.sleep(0.05)
            # Resumed by the newer specs, the held runs are claimed by either worker.
            for run in held:
                assert await move(db, run, "paused", "queued", "run.queued.resumed")
            await _wait_for(db, held, {"completed"})
            for name, proc in procs.items():
                assert proc.poll() is None, f"{name} worker died: {logs[name].read_text()}"
        finally:
            for proc in procs.values():
                proc.send_signal(signal.SIGTERM)
            for proc in procs.values():
                proc.wait(timeout=TIMEOUT)
        for name, proc in procs.items():
            assert proc.returncode == 0, logs[name].read_text()
            assert "Traceback" not in logs[name].read_text()
        # The older worker never downgraded the database's specs.
        assert await db.fetch_all("SELECT entity, spec_hash FROM ledgerq_specs") == recorded
        tokens = [f"held-{i}" for i in range(3)] + [f"free-{i}" for i in range(8)]
        assert Counter(marker.read_text().split()) == Counter(tokens), "a task ran twice"
        for run in held:
            states = [f["status"] for f in await history(db, "schedule_run", run)]
            assert states[:3] == ["queued", "paused", "queued"] and states[-1] == "completed"
        report = await verify(db)
        assert report.ok, report.drift


async def test_an_older_process_keeps_working_while_a_newer_one_migrates(
        db_target: str, tmp_path: Path) -> None:
    """The older process's connections hold prepared statements (PostgreSQL prepares a
    statement run five times) over the table the newer one alters; its next claim, move
    and read must still work, unchanged."""
    from ledgerq.queue.worker.claim import claim_runs

    newer = SpecDir(tmp_path / "newer").paused().replace(
        "[columns]\n", '[columns]\nowner_team = "text"\n')
    async with StateDB(db_target, registry=load_registry(packaged_specs_dir())) as old:
        app = TaskApplication("command", {"argv": ["true"]}, "host")
        for _ in range(3):  # past psycopg's prepare threshold on every pooled connection
            await submit_many(old, [app] * 8)
            for _ in range(8):
                await claim_runs(old, worker_id="old:1", limit=1)
                await old.fetch_all("SELECT * FROM schedule_runs")
        async with StateDB(db_target, registry=load_registry(newer.path)) as new:
            assert new.migration is not None
        await submit_many(old, [app] * 4)
        for _ in range(4):
            got = await claim_runs(old, worker_id="old:1", limit=1)
            assert len(got.claimed) == 1
        rows = await old.fetch_all("SELECT * FROM schedule_runs")
        assert len(rows) == 28 and all("owner_team" in r for r in rows)
        assert (await verify(old)).ok
