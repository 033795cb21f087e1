"""Run again, output kept, watch, worker operations.

Each through the library on both backends and end to end through the ``ledgerq``
command in subprocesses (workers that drain and exit by themselves with --max-tasks,
followers stopped with a real signal). No timed assertions: waits are generous bounds.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from evolution_support import fill_v1
from ledgerq import StateDB
from ledgerq.durations import parse_duration
from ledgerq.errors import InvalidInput, NotFound
from ledgerq.lifecycle.evolution import SCHEMA_VERSION
from ledgerq.projections import rebuild, verify
from ledgerq.queue import (
    TaskApplication,
    Worker,
    retry_run,
    retry_runs,
    run_history,
    submit_task,
    wait_for_runs,
)
from ledgerq.queue.reads import FactFollower, get_run, worker_statuses
from ledgerq.queue.submission import task_kinds
from ledgerq.queue.submission.rerun import RunNotEnded
from ledgerq.queue.submission.task_kinds import TaskKind
from ledgerq.queue.worker.recycling import request_worker_stop
from test_cli import LEDGERQ, as_json, cli, ok, one_error_line

PY = sys.executable
NOISY = "import sys; print('o' * 50); sys.stderr.write('bad\\x00news\\n'); sys.exit(3)"


def command(code: str, **extra: Any) -> TaskApplication:
    return TaskApplication(action_kind="command", args={"argv": [PY, "-c", code]},
                           execution_target="host", **extra)


async def serve(db: StateDB, ids: list[str], tmp_path: Path, **opts: Any) -> dict[str, str]:
    worker = Worker(db, handle_signals=False, lock_dir=tmp_path / "locks", **opts)
    service = asyncio.create_task(worker.run())
    try:
        return await wait_for_runs(db, ids, timeout=60)
    finally:
        await worker.stop()
        await service


# ----------------------------------------------------------------- output kept


async def test_output_tails_ride_on_the_terminal_fact(db: StateDB, tmp_path: Path) -> None:
    run_id = await submit_task(db, command(NOISY))
    assert await serve(db, [run_id], tmp_path, output_tail=20) == {run_id: "failed"}
    row = await get_run(db, run_id)
    assert row["stdout_tail"] == "o" * 19 + "\n"  # the last 20 bytes
    assert row["stderr_tail"] == "bad\ufffdnews\n"  # NUL recorded as U+FFFD
    last = (await run_history(db, run_id))[-1]
    assert last["status"] == "failed"
    assert (last["patch"]["stdout_tail"], last["patch"]["stderr_tail"]) == (
        row["stdout_tail"], row["stderr_tail"])
    assert (await verify(db)).ok
    await rebuild(db)
    assert (await get_run(db, run_id))["stderr_tail"] == "bad\ufffdnews\n"


async def test_every_run_keeps_output_and_zero_keeps_none(db: StateDB, tmp_path: Path) -> None:
    good = await submit_task(db, command("print('fine')"))
    assert await serve(db, [good], tmp_path) == {good: "completed"}
    assert (await get_run(db, good))["stdout_tail"] == "fine\n"
    quiet = await submit_task(db, command("print('fine')"))
    assert await serve(db, [quiet], tmp_path, output_tail=0) == {quiet: "completed"}
    assert (await get_run(db, quiet))["stdout_tail"] is None
    with pytest.raises(ValueError, match="output_tail"):
        Worker(db, output_tail=-1)


async def test_a_v1_database_opens_with_output_columns_and_keeps_working(
        db_target: str, tmp_path: Path) -> None:
    made = await fill_v1(db_target)
    async with StateDB(db_target) as db:  # the packaged specs: migrates on open
        assert (await verify(db)).ok
        run_id = await submit_task(db, command("print('after the upgrade')"))
        assert await serve(db, [run_id], tmp_path) == {run_id: "completed"}
        assert (await get_run(db, run_id))["stdout_tail"] == "after the upgrade\n"
        old = await get_run(db, made["cancelled"][0])
        assert old["status"] == "cancelled" and old["stdout_tail"] is None
        assert (await verify(db)).ok


# ----------------------------------------------------------------- run again


async def test_retry_run_creates_a_linked_run_and_leaves_the_original(
        db: StateDB, tmp_path: Path) -> None:
    first = await submit_task(db, command(NOISY, idempotency_key="k1", timeout_seconds=30))
    assert await serve(db, [first], tmp_path) == {first: "failed"}
    before = await run_history(db, first)
    again = await retry_run(db, first)
    assert again != first
    new, old = await get_run(db, again), await get_run(db, first)
    assert old["status"] == "failed" and await run_history(db, first) == before
    assert new["status"] == "queued" and new["chain_parent_id"] == first
    assert new["chain_depth"] == old["chain_depth"] + 1
    assert new["action_args"] == old["action_args"] and new["timeout_seconds"] == 30
    assert new["idempotency_key"] is None  # the key belongs to the first submission
    (created,) = await run_history(db, again)
    assert created["reason_code"] == "run.queued.retried"
    assert created["metadata"]["retry_of"] == first
    assert created["evidence_refs"] == [{"entity_type": "schedule_run", "entity_id": first}]
    assert await serve(db, [again], tmp_path) == {again: "failed"}
    third = await retry_run(db, again)  # a run again of a run again: the chain grows
    assert (await get_run(db, third))["chain_depth"] == 2


async def test_retry_refuses_what_has_not_ended_and_writes_nothing(db: StateDB) -> None:
    queued = await submit_task(db, command("print(1)"))
    with pytest.raises(RunNotEnded, match="has not ended"):
        await retry_run(db, queued)
    with pytest.raises(NotFound):
        await retry_run(db, "no-such-run")
    assert [f["reason_code"] for f in await run_history(db, queued)] == [
        "run.queued.submitted"]
    assert (await wait_for_runs(db, [], timeout=1)) == {}


async def test_retry_runs_is_all_or_nothing(db: StateDB, tmp_path: Path) -> None:
    done = await submit_task(db, command("print(1)"))
    assert await serve(db, [done], tmp_path) == {done: "completed"}
    pending = await submit_task(db, command("print(2)"))
    with pytest.raises(RunNotEnded):
        await retry_runs(db, [done, pending])
    rows = await db.fetch_all("SELECT id FROM schedule_runs WHERE chain_parent_id IS NOT NULL")
    assert rows == []


# ----------------------------------------------------------------- watch (library)


async def test_fact_follower_returns_each_fact_once(db: StateDB, tmp_path: Path) -> None:
    follower = FactFollower(db)
    assert await follower.poll() == []
    run_id = await submit_task(db, command("print(1)"))
    first = await follower.poll()
    assert [(f["entity_id"], f["status"]) for f in first] == [(run_id, "queued")]
    assert await follower.poll() == []  # re-reads the settle window, returns nothing again
    await serve(db, [run_id], tmp_path)
    assert [f["status"] for f in await follower.poll()] == ["running", "completed"]
    since_start = FactFollower(db, since=0)
    assert len(await since_start.poll()) == 3


def test_durations_parse_once() -> None:
    assert parse_duration("10m") == 600 and parse_duration("1h30m") == 5400
    assert parse_duration("90") == 90 and parse_duration("250ms") == 0.25
    for bad in ("1x", "", "-5", "m", "inf"):
        with pytest.raises(InvalidInput, match="not a duration"):
            parse_duration(bad, "--since")


# ----------------------------------------------------------------- workers (library)


async def test_max_tasks_drains_and_exits(db: StateDB, tmp_path: Path) -> None:
    ids = [await submit_task(db, command("print(1)")) for _ in range(3)]
    worker = Worker(db, handle_signals=False, lock_dir=tmp_path / "locks", max_tasks=2,
                    capacity=1)
    await asyncio.wait_for(worker.run(), 60)  # returns by itself
    assert worker.recycling.why == "max_tasks 2 reached"
    statuses = sorted([(await get_run(db, i))["status"] for i in ids])
    assert statuses == ["completed", "completed", "queued"]


async def test_stop_request_drains_the_worker_it_was_meant_for(db: StateDB,
                                                               tmp_path: Path) -> None:
    worker = Worker(db, worker_id="w-stop", handle_signals=False, lock_dir=tmp_path / "l")
    service = asyncio.create_task(worker.run())
    while not await worker_statuses(db):
        await asyncio.sleep(0.05)
    with pytest.raises(NotFound):
        await request_worker_stop(db, "nobody")
    await request_worker_stop(db, "w-stop")
    await asyncio.wait_for(service, 60)
    assert worker.recycling.why == "stop requested"
    (status,) = await worker_statuses(db)
    assert status.stop_requested_at is not None
    # A new process with the same id is not stopped by the old request.
    again = Worker(db, worker_id="w-stop", handle_signals=False, lock_dir=tmp_path / "l",
                   max_runtime=1.0)
    await asyncio.wait_for(again.run(), 60)
    assert again.recycling.why == "max_runtime 1s reached"


async def test_a_schema_2_database_gains_the_columns_added_since(db_target: str) -> None:
    async with StateDB(db_target):
        pass
    # What the previous version made: no stop_requested_at, schema version 2 recorded.
    downgrade = ("ALTER TABLE workers DROP COLUMN stop_requested_at",
                 "ALTER TABLE workers DROP COLUMN queues",
                 "ALTER TABLE task_kinds DROP COLUMN defaults",
                 "UPDATE ledgerq_schema SET value = '2' WHERE key = 'schema_version'")
    if db_target.startswith("postgres"):
        with psycopg.connect(db_target) as conn:
            for statement in downgrade:
                conn.execute(statement)
    else:
        with sqlite3.connect(db_target) as conn:
            for statement in downgrade:
                conn.execute(statement)
        conn.close()
    async with StateDB(db_target, readonly=True) as ro:  # a reader cannot upgrade it
        assert await worker_statuses(ro) == []
        assert await task_kinds.recorded(ro) == {}  # read without the columns added since
    async with StateDB(db_target) as db:
        version = await db.fetch_one("SELECT value FROM ledgerq_schema WHERE key = "
                                     "'schema_version'")
        assert version is not None and int(version["value"]) == SCHEMA_VERSION
        w = Worker(db, worker_id="w2", handle_signals=False, max_runtime=0.5, lock_dir=None)
        await asyncio.wait_for(w.run(), 60)
        await request_worker_stop(db, "w2")
        (status,) = await worker_statuses(db)
        assert status.stop_requested_at is not None
        assert status.queues == ["default"]
        kind = TaskKind("x.y", {"type": "object"}, queue="q", defaults={"priority": 2})
        assert await task_kinds.record(db, [kind]) == 1
        assert (await task_kinds.recorded(db))["x.y"].defaults == {"priority": 2}


async def test_a_worker_row_an_older_release_wrote_serves_every_queue(db: StateDB) -> None:
    """An older release's heartbeat leaves ``queues`` NULL: it claims from every queue, and
    ``ledgerq workers`` must not claim otherwise."""
    await db.write(lambda tx: tx.execute(
        "INSERT INTO workers (worker_id, last_heartbeat_at) VALUES (?, ?)", ("old", 1.0)))
    (status,) = await worker_statuses(db)
    assert status.queues is None
# ----------------------------------------------------------------- the command, end to end


def submit(db: str, *args: str) -> str:
    return ok("submit", "--db", db, *args).stdout.strip()


def drain_worker(db: str, tmp_path: Path, n: int, *extra: str) -> str:
    """Run `ledgerq worker --max-tasks n` to its own end; its stderr."""
    res = cli("worker", "--db", db, "--poll-interval", "0.05", "--lock-dir",
              str(tmp_path / "locks"), "--max-tasks", str(n), "--quiet", *extra, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"drained: max_tasks {n} reached" in res.stderr
    return res.stderr


def test_cli_logs_retry_and_wait(db_target: str, tmp_path: Path) -> None:
    db = db_target
    bad = submit(db, "command", "--", PY, "-c", NOISY)
    good = submit(db, "command", "--", PY, "-c", "print('all good')")
    drain_worker(db, tmp_path, 2, "--output-tail", "4096")
    logs = ok("logs", bad, "--db", db).stdout
    assert "stdout (tail)" in logs and "o" * 50 in logs and "bad\ufffdnews" in logs
    assert ok("logs", good, "--db", db, "--stdout").stdout == "all good\n"
    assert as_json("logs", bad, "--db", db)["stderr_tail"] == "bad\ufffdnews\n"
    assert "all good" in ok("show", good, "--db", db).stdout
    assert cli("wait", good, "--db", db).returncode == 0
    assert cli("wait", good, bad, "--db", db, "--quiet").returncode == 1
    waited = json.loads(cli("wait", bad, "--db", db, "--json").stdout)
    assert waited["ok"] is False and waited["runs"][bad]["status"] == "failed"

    one = ok("retry", bad, "--db", db).stdout.split()
    assert one[:2] == ["retried", bad]
    again = one[-1]
    shown = as_json("show", again, "--db", db)
    assert shown["run"]["chain_parent_id"] == bad
    assert shown["history"][0]["reason_code"] == "run.queued.retried"
    one_error_line(cli("retry", again, "--db", db), 1)  # queued: not ended
    one_error_line(cli("retry", "--status", "queued", "--db", db), 2)
    one_error_line(cli("retry", "--status", "failed", "--since", "1y", "--db", db), 2)
    one_error_line(cli("retry", "--db", db), 2)
    drain_worker(db, tmp_path, 1)
    bulk = as_json("retry", "--status", "failed", "--since", "1h", "--db", db)
    assert sorted(r["id"] for r in bulk["retried"]) == sorted([bad, again])
    assert cli("wait", *(r["new_id"] for r in bulk["retried"]), "--db", db,
               "--timeout", "200ms").returncode == 1  # nobody runs them
    one_error_line(cli("wait", bad, "--db", db, "--timeout", "soon"), 2)
    assert as_json("verify", "--db", db)["ok"] is True


def test_cli_workers_and_worker_stop(db_target: str, tmp_path: Path) -> None:
    db = db_target
    proc = subprocess.Popen(
        [LEDGERQ, "worker", "--db", db, "--poll-interval", "0.05", "--lock-dir",
         str(tmp_path / "locks"), "--worker-id", "cli-drain", "--cap", "gpu", "--quiet",
         "--queue", "default", "--queue", "ops"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # The run lasts until the test has seen it listed (at most two minutes): a fixed
    # sleep was a window a loaded machine's CLI calls (a process start each) could miss.
    release = tmp_path / "release"
    wait = ("import os, time\nt = time.monotonic() + 120\n"
            f"while not os.path.exists({str(release)!r}) and time.monotonic() < t:\n"
            "    time.sleep(0.05)")
    try:
        slow = submit(db, "command", "--", PY, "-c", wait)
        listed: list[dict[str, Any]] = []
        for _ in range(600):
            listed = as_json("workers", "--db", db)["workers"]
            if listed and listed[0]["running"] == [slow]:
                break
            proc.poll()
            assert proc.returncode is None, proc.communicate()
            subprocess.run(["sleep", "0.05"], check=True)
        (w,) = listed
        assert w["worker_id"] == "cli-drain" and w["advertised_capabilities"] == ["gpu"]
        assert w["queues"] == ["default", "ops"]
        assert w["running"] == [slow]
        table = ok("workers", "--db", db).stdout
        assert "cli-drain" in table and "default,ops" in table
        release.touch()
        assert "asked worker cli-drain" in ok("worker", "stop", "cli-drain", "--db", db).stdout
        one_error_line(cli("worker", "stop", "nobody", "--db", db), 1)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "drained: stop requested" in err and "1 completed" in err  # it finished its run
    assert as_json("show", slow, "--db", db)["run"]["status"] == "completed"
    one_error_line(cli("worker", "--db", db, "--max-runtime", "forever"), 2)


def _lines_until(proc: subprocess.Popen[str], run_id: str, want: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    assert proc.stdout is not None
    while not any(f["status"] == want and f["entity_id"] == run_id for f in got):
        line = proc.stdout.readline()
        assert line, proc.communicate()
        got.append(json.loads(line))
    return got


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_follow_prints_moves_and_exits_cleanly_on_a_signal(
        db_target: str, tmp_path: Path, sig: signal.Signals) -> None:
    db = db_target
    submit(db, "command", "--", "true")  # the database exists before the follower opens it
    follow = subprocess.Popen([LEDGERQ, "ls", "--db", db, "--follow", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    shown: subprocess.Popen[str] | None = None
    try:
        run_id = submit(db, "command", "--", PY, "-c", "print('watched')")
        shown = subprocess.Popen([LEDGERQ, "show", run_id, "--db", db, "--follow"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        drain_worker(db, tmp_path, 2)
        facts = [f for f in _lines_until(follow, run_id, "completed") if f["entity_id"] == run_id]
        assert [f["status"] for f in facts][-2:] == ["running", "completed"]
        out, err = shown.communicate(timeout=60)  # ends by itself: the run ended
        assert shown.returncode == 0, err
        assert "completed" in out and "watched" in out
        follow.send_signal(sig)
        _, err = follow.communicate(timeout=60)
        assert follow.returncode == 0 and "Traceback" not in err, err
        # show --follow of a run that never moves: stopped by the signal, cleanly.
        idle = submit(db, "command", "--", "true")
        shown = subprocess.Popen([LEDGERQ, "show", idle, "--db", db, "--follow"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert shown.stdout is not None
        while "history" not in shown.stdout.readline():
            pass
        shown.send_signal(sig)
        _, err = shown.communicate(timeout=60)
        assert shown.returncode == 0 and "Traceback" not in err, err
    finally:
        for p in (follow, shown):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    listed = as_json("ls", "--db", db, "--since", "10m")
    assert listed["total"] == 3  # moved, or (the idle one) created, within 10 minutes
    one_error_line(cli("ls", "--db", db, "--since", "ten minutes"), 2)


def test_readme_command_table_names_every_command() -> None:
    from typer.main import get_command

    from ledgerq.cli import app

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    table = readme.split("## The `ledgerq` command", 1)[1].split("\n\n", 2)[1]
    group: Any = get_command(app)
    for name in group.commands:
        assert f"`ledgerq {name}" in table, f"README's command table lacks `ledgerq {name}`"


def test_show_follow_ends_for_a_run_that_ended_before_its_history_was_read(
        db_target: str) -> None:
    """``show`` reads the row, then the history: a run that ends in between is shown
    running, its terminal fact already in the history, and no later fact ever comes. The
    follow must end all the same (it once waited forever: seen under a loaded test run)."""
    import threading

    import click

    from ledgerq.cli.watch import follow_run
    from ledgerq.lifecycle import Actor
    from ledgerq.lifecycle.registry import default_registry
    from ledgerq.queue import cancel_task

    async def ended_run() -> tuple[str, int]:
        async with StateDB(db_target) as db:
            rid = await submit_task(db, TaskApplication("agent", {}, "host"))
            await cancel_task(db, rid, actor=Actor(type="operator", id="t"))
            return rid, (await run_history(db, rid))[-1]["entity_version"]

    rid, last = asyncio.run(ended_run())
    ctx = click.Context(click.Command("show"), obj={})
    policy = default_registry().entity("schedule_run")
    follower = threading.Thread(target=follow_run, daemon=True,
                                args=(ctx, db_target, policy, rid, last),
                                kwargs={"json_lines": True})
    follower.start()
    follower.join(timeout=20)
    assert not follower.is_alive(), "show --follow kept waiting for a run that had ended"
