"""Several OS processes on one database file: claims and submissions stay exactly-once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from ledgerq import StateDB
from ledgerq.codec import loads
from ledgerq.projections import history, verify
from ledgerq.queue import TaskApplication, submit_many

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
TIMEOUT = 60


def start_together(args: list[list[str]], go: Path) -> list[subprocess.Popen[str]]:
    """Start the processes, wait until every one is ready, then let them all go at once."""
    procs = [subprocess.Popen([sys.executable, *a], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for a in args]
    try:
        deadline = time.monotonic() + TIMEOUT
        while len(list(go.parent.glob(go.name + ".*.ready"))) < len(procs):
            for p in procs:
                assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "helpers never became ready"
            time.sleep(0.01)
        go.touch()
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return procs


def finish(procs: list[subprocess.Popen[str]]) -> list[str]:
    outs = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_several_worker_processes_run_every_task_exactly_once(tmp_path: Path,
                                                             db_target: str) -> None:
    """Four worker processes, each its own "host" (a distinct host name in its worker id,
    its own connection pool; on PostgreSQL over TCP to 127.0.0.1), claim from one database:
    every task runs exactly once."""
    db_path = db_target
    marker = tmp_path / "marker"
    go = tmp_path / "go"
    n_tasks = 40
    tokens = [f"task-{i}" for i in range(n_tasks)]

    async def setup() -> list[str]:
        async with StateDB(db_path) as db:
            return await submit_many(db, [TaskApplication(
                "command",
                {"argv": ["sh", "-c", 'printf "%s\\n" "$1" >> "$2"', "sh", token, str(marker)]},
                "host") for token in tokens])

    ids = asyncio.run(setup())
    procs = start_together([[str(HELPERS / "queue_worker_proc.py"), str(db_path),
                             f"host{n}:proc-{n}", str(go), "3"] for n in range(4)], go)
    reports = [json.loads(out) for out in finish(procs)]
    assert sum(r["claimed"] for r in reports) == n_tasks

    lines = marker.read_text().splitlines()
    assert Counter(lines) == Counter(tokens), "some task ran twice or never"

    async def check() -> None:
        async with StateDB(db_path) as db:
            for run_id, token in zip(ids, tokens, strict=True):
                row = await db.fetch_one("SELECT * FROM schedule_runs WHERE id = ?", (run_id,))
                assert row is not None
                assert loads(row["action_args"])["argv"][4] == token
                assert (row["status"], row["exit_code"], row["lease_attempts"]) == \
                    ("completed", 0, 1), row
                assert row["leased_by"] in {f"host{n}:proc-{n}" for n in range(4)}
                facts = await history(db, "schedule_run", run_id)
                assert [(f["previous_status"], f["status"]) for f in facts] == [
                    (None, "queued"), ("queued", "running"), ("running", "completed")]
            report = await verify(db)
            assert report.ok, report.drift

    asyncio.run(check())


def test_several_submitter_processes_with_one_key_make_one_row(tmp_path: Path,
                                                              db_target: str) -> None:
    db_path = db_target
    go = tmp_path / "go"

    async def create() -> None:
        async with StateDB(db_path):
            pass  # the schema exists before the race starts

    asyncio.run(create())
    procs = start_together([[str(HELPERS / "queue_submit_proc.py"), str(db_path), "one-key",
                             str(go)] for _ in range(4)], go)
    ids = {out.strip() for out in finish(procs)}
    assert len(ids) == 1

    async def check() -> None:
        async with StateDB(db_path) as db:
            rows = await db.fetch_all("SELECT id, idempotency_key FROM schedule_runs")
            assert rows == [{"id": ids.pop(), "idempotency_key": "one-key"}]
            facts = await db.fetch_one("SELECT count(*) AS n FROM status_transitions")
            assert facts == {"n": 1}
            assert (await verify(db)).ok

    asyncio.run(check())
