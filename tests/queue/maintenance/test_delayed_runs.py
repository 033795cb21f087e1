"""Delayed runs: a start time keeps a run out of every claim until it
comes, through a declared state (`delayed`), on both backends, across restarts, and
from the command line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.errors import InvalidInput
from ledgerq.lifecycle import Actor
from ledgerq.projections import history, verify
from ledgerq.queue import TaskApplication, cancel_task, submit_task
from ledgerq.queue.maintenance.promotion import promote_due
from ledgerq.queue.worker.claim import claim_runs

T0 = 1_000_000.0
APP = TaskApplication("agent", {"prompt": "later"}, "host")


def later(delay: float, **kw: object) -> TaskApplication:
    return TaskApplication("agent", {"prompt": "later"}, "host", not_before=T0 + delay,
                           **kw)  # type: ignore[arg-type]


async def _status(db: StateDB, run_id: str) -> str:
    row = await db.fetch_one("SELECT status FROM schedule_runs WHERE id = ?", [run_id])
    assert row is not None
    return str(row["status"])


async def test_a_run_waits_for_its_start_time_even_across_a_restart(db_target: str) -> None:
    async with StateDB(db_target) as db:
        run = await submit_task(db, later(30), now=T0)
        assert await _status(db, run) == "delayed"
        got = await claim_runs(db, worker_id="w1", now=T0 + 29, limit=5)
        assert got.claimed == []
        assert (await promote_due(db, now=T0 + 29.9))["started"] == 0
    async with StateDB(db_target) as db:  # a restart: the start time is in the row
        assert await _status(db, run) == "delayed"
        assert (await promote_due(db, now=T0 + 30))["started"] == 1
        got = await claim_runs(db, worker_id="w1", now=T0 + 30, limit=5)
        assert [r["id"] for r in got.claimed] == [run]
        facts = await history(db, "schedule_run", run)
        assert [(f["status"], f["reason_code"]) for f in facts] == [
            ("delayed", "run.delayed.submitted"), ("queued", "run.queued.not_before"),
            ("running", "run.started.ok")]
        assert (await verify(db)).ok


async def test_a_start_time_already_past_queues_at_once(db: StateDB) -> None:
    run = await submit_task(db, later(-5), now=T0)
    assert await _status(db, run) == "queued"
    row = await db.fetch_one("SELECT not_before FROM schedule_runs WHERE id = ?", [run])
    assert row == {"not_before": None}


async def test_a_delayed_run_can_be_cancelled_and_is_idempotent(db: StateDB) -> None:
    run = await submit_task(db, later(60, idempotency_key="k"), now=T0)
    assert await submit_task(db, later(60, idempotency_key="k"), now=T0) == run
    with pytest.raises(InvalidInput, match="different application"):
        await submit_task(db, later(61, idempotency_key="k"), now=T0)
    assert await cancel_task(db, run, actor=Actor(type="operator", id="op"), now=T0 + 1)
    assert await _status(db, run) == "cancelled"
    assert (await promote_due(db, now=T0 + 100))["started"] == 0


@pytest.mark.parametrize("bad, message", [
    (float("inf"), "not_before must be epoch seconds"),
    ("soon", "not_before must be epoch seconds"),
])
async def test_a_bad_start_time_is_refused_writing_nothing(db: StateDB, bad: object,
                                                           message: str) -> None:
    app = TaskApplication("agent", {}, "host", not_before=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match=message):
        await submit_task(db, app, now=T0)
    assert await db.fetch_one("SELECT count(*) AS n FROM schedule_runs") == {"n": 0}


async def test_a_start_time_with_dependencies_is_refused(db: StateDB) -> None:
    dep = await submit_task(db, APP, now=T0)
    with pytest.raises(InvalidInput, match="cannot be combined"):
        await submit_task(db, later(10, depends_on=[dep]), now=T0)


async def test_a_worker_starts_it_no_sooner_than_its_time(db_target: str,
                                                          tmp_path: Path) -> None:
    """A real Worker: the claim fact comes after the start time, never before."""
    from ledgerq.queue import Worker

    marker = tmp_path / "ran"
    async with StateDB(db_target) as db:
        start = time.time() + 0.6
        run = await submit_task(db, TaskApplication(
            "command", {"argv": ["touch", str(marker)]}, "host", not_before=start))
        worker = Worker(db, poll_interval=0.05, handle_signals=False)
        task = asyncio.create_task(worker.run())
        try:
            deadline = time.monotonic() + 30
            while await _status(db, run) != "completed":
                assert time.monotonic() < deadline, await _status(db, run)
                await asyncio.sleep(0.05)
        finally:
            await worker.stop()
            await task
        facts = await history(db, "schedule_run", run)
        claimed = next(f for f in facts if f["status"] == "running")
        assert claimed["created_at"] >= start
        assert marker.exists()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerq", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ})


def test_submit_delay_and_at_from_the_command_line(db_target: str) -> None:
    delayed = _cli("--db", db_target, "submit", "agent", "--args", "{}", "--delay", "1h",
                   "--json")
    assert delayed.returncode == 0, delayed.stderr
    assert json.loads(delayed.stdout)["status"] == "delayed"
    past = _cli("--db", db_target, "submit", "agent", "--args", "{}", "--at",
                "2001-01-01T00:00:00+00:00", "--json")
    assert past.returncode == 0, past.stderr
    assert json.loads(past.stdout)["status"] == "queued"
    for args, message in ((("--delay", "5x"), "--delay: '5x' is not a duration"),
                          (("--at", "tomorrow"), "--at: 'tomorrow' is not an ISO 8601 time"),
                          (("--delay", "1m", "--at", "2030-01-01"), "not both")):
        bad = _cli("--db", db_target, "submit", "agent", "--args", "{}", *args)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
    listed = _cli("--db", db_target, "ls", "--status", "delayed", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)["runs"]) == 1


async def test_many_runs_falling_due_at_once_start_in_bounded_transactions(
        db: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledgerq.queue import submit_many
    from ledgerq.queue.maintenance import promotion

    monkeypatch.setattr(promotion, "SWEEP_CHUNK", 10)
    await submit_many(db, [later(60) for _ in range(35)], now=T0)
    units = 0
    real = db.write

    async def counting(fn: object, **kw: object) -> object:
        nonlocal units
        units += 1
        return await real(fn, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(db, "write", counting)
    assert (await promote_due(db, now=T0 + 61))["started"] == 35
    assert units == 4  # 10 + 10 + 10 + 5, each its own transaction
    rows = await db.fetch_all("SELECT status FROM schedule_runs", ())
    assert {r["status"] for r in rows} == {"queued"}
