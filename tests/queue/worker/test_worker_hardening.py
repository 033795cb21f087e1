"""Worker robustness.

* One row a pass cannot move never stops the worker: every pass (reaper, retry
  promotion, dependency sweep, claim) skips it, reports it once, and moves the others.
* A short lease gets a short check interval instead of a refusal.
* Cancels and timeouts log no asyncio errors and are counted under their real outcome.
* A worker whose database file is deleted or replaced stops with DatabaseGone.
* A claim pass that stops early at limit=1 reads one page, at any queue depth.

A "refused" row is one a test trigger will not let any UPDATE touch: the most general
"its move raises" there is, and it works the same in every pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import trace
from helpers.raw import raw, refusal
from helpers.trace import count_writes
from ledgerq import StateDB
from ledgerq.errors import DatabaseGone
from ledgerq.lifecycle import Actor, load_registry
from ledgerq.lifecycle.registry import Registry, packaged_specs_dir
from ledgerq.projections import verify
from ledgerq.queue import (
    TaskApplication,
    Worker,
    cancel_task,
    claim_runs,
    promote_due,
    reap_expired_leases,
    register_heartbeat,
    submit_many,
    submit_task,
)
from ledgerq.queue.reads import queue_stats
from ledgerq.queue.runs import move
from ledgerq.queue.worker import claim as claim_mod
from ledgerq.queue.worker import service as runtime_mod
from ledgerq.queue.worker.functions import (
    LEASE_CHECK_SECONDS,
    PAGE_SIZE,
    Executors,
    RunContext,
    StuckRows,
    check_interval_for,
    execute_claimed,
)

OPERATOR = Actor(type="operator", id="tester")
REFUSAL = "refused by test trigger"


# ---------------------------------------------------------------- helpers


@pytest.fixture
def path(db_target: str) -> str:
    return db_target


def task(**kw: Any) -> TaskApplication:
    return TaskApplication("agent", {}, "host", **kw)


def cmd(argv: list[str], **kw: Any) -> TaskApplication:
    return TaskApplication("command", {"argv": argv}, "host", **kw)


async def ok(run: dict[str, Any]) -> tuple[int, str]:
    return 0, ""


def make_worker(db: StateDB, tmp_path: str, **kw: Any) -> Worker:
    opts: dict[str, Any] = {"poll_interval": 0.02, "shutdown_grace": 2.0, "execute": ok,
                            "lock_dir": tmp_path / "locks", "handle_signals": False}
    opts.update(kw)
    return Worker(db, **opts)


@contextlib.asynccontextmanager
async def serving(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    runner = asyncio.create_task(worker.run())
    try:
        yield runner
    finally:
        await worker.stop()
        await asyncio.wait_for(runner, 30)


async def eventually(check: Callable[[], Awaitable[Any]], *, timeout: float = 15.0,
                     what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def status(db: StateDB, rid: str) -> str:
    row = await db.fetch_one("SELECT status FROM schedule_runs WHERE id = ?", (rid,))
    assert row is not None, rid
    return str(row["status"])


async def all_in(db: StateDB, ids: list[str], state: str) -> bool:
    return all([await status(db, i) == state for i in ids])


_UNDO: dict[str, list[str]] = {}


async def refuse(db: StateDB, rid: str) -> str:
    """Make every UPDATE of run ``rid`` raise; returns the trigger's name (see allow())."""
    name = f"refuse_{uuid.uuid4().hex[:8]}"
    create, _UNDO[name] = refusal(db.path, name, event="UPDATE", message=REFUSAL, when_id=rid)
    conn = raw(db.path)
    try:
        for statement in create:
            conn.execute(statement)
        if not conn.postgres:
            conn.conn.commit()
    finally:
        conn.close()
    return name


async def allow(db: StateDB, trigger: str) -> None:
    conn = raw(db.path)
    try:
        for statement in _UNDO.pop(trigger):
            conn.execute(statement)
    finally:
        conn.close()


async def direct(db: StateDB, rid: str, src: str, dst: str, code: str,
                 patch: dict[str, Any] | None = None) -> None:
    """Move a run behind the queue's back (as a raw transition() or another host would)."""
    policy = db.registry.entity("schedule_run")
    if dst == "running" and src != "running":  # a claim carries the lease the spec requires
        patch = {"leased_by": "other-host", "lease_expires_at": 4e9, **(patch or {})}
    elif src == "running" and dst != "running":  # and leaving running gives it up
        patch = {"leased_by": None, "lease_expires_at": None, "lease_token": None,
                 **(patch or {})}
    moved = await db.write(lambda c: move(c, policy, rid, src, dst, code, patch=patch))
    assert moved.applied


async def expired_running(db: StateDB, expired_at: float = 1_000.0) -> str:
    """A running row whose holder died long ago: the reaper's work."""
    rid = await submit_task(db, task())
    await direct(db, rid, "queued", "running", "run.started.ok",
                 {"leased_by": "dead-worker", "lease_expires_at": expired_at,
                  "lease_token": uuid.uuid4().hex, "lease_attempts": 1})
    return rid


async def due_retry(db: StateDB, due_at: float = 1_000.0) -> str:
    """A retry_wait row whose delay has passed: the promotion pass's work."""
    rid = await submit_task(db, task())
    await direct(db, rid, "queued", "running", "run.started.ok")
    await direct(db, rid, "running", "retry_wait", "run.retry_wait.backoff",
                 {"retry_due_at": due_at, "run_attempts": 1})
    return rid


async def settled_waiting(db: StateDB) -> str:
    """A waiting row whose only dependency completed behind the queue's back: the sweep's."""
    dep = await submit_task(db, task())
    rid = await submit_task(db, task(depends_on=[dep]))
    assert await status(db, rid) == "waiting_dependency"
    await direct(db, dep, "queued", "running", "run.started.ok")
    await direct(db, dep, "running", "completed", "run.completed.ok")
    return rid


def stuck_lines(caplog: pytest.LogCaptureFixture, rid: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "ledgerq.worker" and rid in r.getMessage() and "is stuck" in
            r.getMessage()]


def older_specs(tmp_path: str) -> Registry:
    """The packaged specs without retry_wait: what an older (or trimmed) version loads."""
    spec_dir = tmp_path / "older-specs"
    shutil.copytree(packaged_specs_dir(), spec_dir)
    f = spec_dir / "schedule_run.toml"
    text = f.read_text()
    for old, new in [
        ('[states.retry_wait]\ndescription = "Failed with retries left; becomes queued '
         'again at retry_due_at."\n', ""),
        ('to = ["retry_wait", "queued"]', 'to = ["queued"]'),
        ('[[edges]]\nfrom = "retry_wait"\nto = ["queued", "cancelled"]\n', ""),
        ('[[indexes]]\nname = "idx_schedule_runs_retry_due"\ncolumns = ["retry_due_at"]\n'
         'where_status = ["retry_wait"]\n', ""),
        ('"run.retry_wait.backoff" = "Failed with retries left; waiting for the backoff '
         'delay."\n', ""),
        ('where_status = ["queued", "running", "retry_wait"]', 'where_status = ["queued", '
         '"running"]'),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    f.write_text(text)
    registry = load_registry(spec_dir)
    assert "retry_wait" not in registry.entity("schedule_run").states
    return registry


# ---------------------------------------------------------------- one row never stops a pass


async def test_a_worker_whose_specs_lack_a_rows_state_still_claims_new_work(
        path: str, tmp_path: str, caplog: pytest.LogCaptureFixture) -> None:
    """The reproduction: a due retry_wait row, and a worker whose specs lack
    retry_wait. Before, promotion raised on every tick before the claim step."""
    async with StateDB(path) as packaged:
        old = await due_retry(packaged)
    registry = older_specs(tmp_path)
    caplog.set_level(logging.WARNING)
    async with StateDB(path, registry=registry) as db:
        w = make_worker(db, tmp_path)
        async with serving(w):
            fresh = await submit_task(db, task())
            await eventually(lambda: all_in(db, [fresh], "completed"), what="the new run")
            await asyncio.sleep(1.1)  # at least two maintenance passes (every 0.5 s)
        assert await status(db, old) == "retry_wait"  # left alone: the specs lack its state
        notes = [r for r in caplog.records if "do not declare retry_wait" in r.getMessage()]
        assert len(notes) == 1
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        stats = await queue_stats(db)
        assert stats.counts["retry_wait"] == 1 and stats.stuck == 1
        assert [(s.id, s.status) for s in stats.stuck_runs] == [(old, "retry_wait")]
        assert "not declared" in stats.stuck_runs[0].why


async def test_the_reaper_skips_a_row_it_cannot_move_and_reaps_the_others(
        db: StateDB, caplog: pytest.LogCaptureFixture) -> None:
    bad, good = await expired_running(db), await expired_running(db)
    trigger = await refuse(db, bad)
    stuck = StuckRows()
    caplog.set_level(logging.WARNING)
    assert await reap_expired_leases(db, stuck=stuck) == {"requeued": 1, "failed": 0}
    assert (await status(db, bad), await status(db, good)) == ("running", "queued")
    assert bad in stuck and stuck.rows[bad].step == "reaper"
    assert REFUSAL in stuck.rows[bad].reason
    assert len(stuck_lines(caplog, bad)) == 1
    # While it is skipped, nothing else expired: the pass does not even take the write lock.
    writes = count_writes(db)
    assert await reap_expired_leases(db, stuck=stuck) == {"requeued": 0, "failed": 0}
    assert writes == [], writes
    # Repaired and due for its retry: it is reaped, and reported as moving again.
    await allow(db, trigger)
    stuck.retry_after = 0
    stuck.rows[bad].retry_at = 0
    assert await reap_expired_leases(db, stuck=stuck) == {"requeued": 1, "failed": 0}
    assert await status(db, bad) == "queued" and bad not in stuck
    assert (await verify(db)).ok


async def test_promotion_skips_a_retry_it_cannot_move(db: StateDB) -> None:
    bad, good = await due_retry(db), await due_retry(db)
    await refuse(db, bad)
    stuck = StuckRows()
    got = await promote_due(db, stuck=stuck)
    assert got == {"retried": 1, "released": 0, "cancelled": 0, "started": 0}
    assert (await status(db, bad), await status(db, good)) == ("retry_wait", "queued")
    assert stuck.rows[bad].step == "promotion"


async def test_the_dependency_sweep_settles_the_rows_it_can(db: StateDB) -> None:
    bad, good = await settled_waiting(db), await settled_waiting(db)
    await refuse(db, bad)
    stuck = StuckRows()
    got = await promote_due(db, stuck=stuck)
    assert got == {"retried": 0, "released": 1, "cancelled": 0, "started": 0}
    assert (await status(db, bad), await status(db, good)) == ("waiting_dependency", "queued")
    assert list(stuck.rows) == [bad]
    assert (await verify(db)).ok


async def test_a_waiting_row_with_unreadable_depends_on_does_not_stop_the_sweep(
        db: StateDB) -> None:
    """json_each() on one row's bad JSON used to fail the sweep's query for every row."""
    broken = await submit_task(db, task(depends_on=[await submit_task(db, task())]))
    # PostgreSQL's jsonb holds only JSON: there the nearest breakage is JSON that is no list.
    garbage = "[not json" if db.dialect == "sqlite" else '{"not": "a list"}'
    await db.write(lambda c: c.execute(
        "UPDATE schedule_runs SET depends_on = ? WHERE id = ?", (garbage, broken)))
    good = await settled_waiting(db)
    assert (await promote_due(db, stuck=StuckRows()))["released"] == 1
    assert (await status(db, good), await status(db, broken)) == ("queued",
                                                                 "waiting_dependency")
    stats = await queue_stats(db)
    assert [(s.id, s.why) for s in stats.stuck_runs] == [(broken,
                                                          "depends_on is not valid JSON")]


async def test_a_dependent_that_cannot_move_does_not_undo_its_dependencys_end(
        db: StateDB, tmp_path: Path) -> None:
    """Before, the terminal write failed with its dependent: the run stayed running and,
    once its lease expired, ran a second time."""
    dep = await submit_task(db, task())
    waiting = await submit_task(db, task(depends_on=[dep]))
    await refuse(db, waiting)
    w = make_worker(db, tmp_path)
    async with serving(w):
        await eventually(lambda: all_in(db, [dep], "completed"), what="the dependency")
        await eventually(lambda: asyncio.sleep(0, waiting in w.stuck), what="sweep report")
    assert w.outcomes["completed"] == 1 and w.outcomes["error"] == 0
    assert await status(db, waiting) == "waiting_dependency"


async def test_a_claim_that_raises_is_lost_and_the_others_are_claimed(
        db: StateDB, caplog: pytest.LogCaptureFixture) -> None:
    # Distinct queue times: ids minted in one millisecond are not in submission order.
    ids = [await submit_task(db, task(), now=time.time() - 10 + i) for i in range(3)]
    bad = ids[0]
    await refuse(db, bad)
    stuck = StuckRows()
    caplog.set_level(logging.WARNING)
    got = await claim_runs(db, worker_id="w1", limit=2, stuck=stuck)
    assert [r["id"] for r in got.claimed] == [ids[1]]
    assert got.lost == 1 and list(got.failures) == [bad] and REFUSAL in got.failures[bad]
    assert len(stuck_lines(caplog, bad)) == 1
    # The next pass passes over it: with limit=1 it would otherwise take the only slot.
    again = await claim_runs(db, worker_id="w1", limit=1, stuck=stuck)
    assert [r["id"] for r in again.claimed] == [ids[2]] and again.lost == 0
    assert len(stuck_lines(caplog, bad)) == 1
    assert await status(db, bad) == "queued"


async def test_a_worker_reports_each_stuck_row_once_and_serves_everything_else(
        db: StateDB, tmp_path: str, caplog: pytest.LogCaptureFixture) -> None:
    """A stuck row in every pass; stuck_retry=0, so each pass tries each again and fails."""
    now = time.time()
    # Another worker, alive since before the rows fell due: its passes should have moved
    # them, so the database alone shows the first two as stuck.
    await register_heartbeat(db, worker_id="other", now=now - 500)
    await register_heartbeat(db, worker_id="other", now=now - 10)
    stuck_ids = [await expired_running(db, now - 400), await due_retry(db, now - 400),
                 await settled_waiting(db), await submit_task(db, task())]
    triggers = [await refuse(db, rid) for rid in stuck_ids]
    caplog.set_level(logging.INFO)
    w = make_worker(db, tmp_path, stuck_retry=0)
    async with serving(w):
        fresh = [await submit_task(db, task()) for _ in range(3)]
        await eventually(lambda: all_in(db, fresh, "completed"), what="the fresh runs")
        await eventually(lambda: asyncio.sleep(0, len(w.stuck) == 4), what="four reports")
        passes = w.claim_passes
        await asyncio.sleep(1.1)  # two more maintenance passes, many claim passes
        assert w.claim_passes > passes
        for rid in stuck_ids:
            assert len(stuck_lines(caplog, rid)) == 1, rid
        stats = await queue_stats(db, stuck_after=60)
        assert {s.id for s in stats.stuck_runs} == set(stuck_ids[:2])  # what the db shows
        for trigger in triggers:
            await allow(db, trigger)
        await eventually(lambda: all_in(db, stuck_ids, "completed"), what="the repaired runs")
    assert len(w.stuck) == 0
    moving = [r for r in caplog.records if "no longer stuck" in r.getMessage()]
    assert {rid for rid in stuck_ids if any(rid in r.getMessage() for r in moving)} == \
        set(stuck_ids)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert (await verify(db)).ok


async def test_a_failing_pass_does_not_stop_the_others_and_is_logged_once(
        db: StateDB, tmp_path: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    calls = 0
    broken = True
    real = runtime_mod.reap_expired_leases

    async def reaper(*args: Any, **kw: Any) -> dict[str, int]:
        nonlocal calls
        calls += 1
        if broken:
            raise RuntimeError("reaper broke")
        return await real(*args, **kw)

    monkeypatch.setattr(runtime_mod, "reap_expired_leases", reaper)
    caplog.set_level(logging.WARNING)
    w = make_worker(db, tmp_path)
    async with serving(w):
        fresh = [await submit_task(db, task()) for _ in range(3)]
        await eventually(lambda: all_in(db, fresh, "completed"), what="claims past the reaper")
        await eventually(lambda: asyncio.sleep(0, calls >= 3), what="three reaper passes")
        failures = [r for r in caplog.records if "reaper pass failed" in r.getMessage()]
        assert len(failures) == 1 and failures[0].exc_info is not None
        broken = False
        await eventually(lambda: asyncio.sleep(0, any(
            "reaper pass works again" in r.getMessage() for r in caplog.records)),
            what="the recovery line")


async def test_stats_count_overdue_rows_only_after_a_live_worker_should_have_moved_them(
        db: StateDB) -> None:
    now = time.time()
    lease = await expired_running(db, now - 600)
    retry = await due_retry(db, now - 600)
    # No worker has been alive since: nothing is overdue, the queue merely waits.
    assert (await queue_stats(db, now=now)).stuck == 0
    await register_heartbeat(db, worker_id="recent", now=now - 5)  # started only now
    assert (await queue_stats(db, now=now)).stuck == 0
    await db.write(lambda c: c.execute(
        "UPDATE workers SET started_at = ? WHERE worker_id = 'recent'", (now - 700,)))
    stats = await queue_stats(db, now=now)
    assert stats.stuck == 2
    assert {(s.id, s.status) for s in stats.stuck_runs} == {(lease, "running"),
                                                           (retry, "retry_wait")}
    assert stats.to_dict()["stuck"] == 2
    await reap_expired_leases(db, stuck=StuckRows())
    await promote_due(db, stuck=StuckRows())
    assert (await queue_stats(db, now=now)).stuck == 0


def test_a_stuck_tracker_refuses_a_negative_retry() -> None:
    with pytest.raises(ValueError, match="retry_after"):
        StuckRows(-1)


# ---------------------------------------------------------------- short leases


def test_the_check_interval_follows_a_short_lease() -> None:
    assert check_interval_for(300) == LEASE_CHECK_SECONDS
    assert check_interval_for(1.0) == pytest.approx(1 / 3)
    assert 3 * check_interval_for(0.3) <= 0.3


async def test_a_worker_with_a_one_second_lease_keeps_it(db: StateDB, tmp_path: str) -> None:
    w = make_worker(db, tmp_path, lease_ttl=1.0, execute=None)
    assert w.check_interval <= 1 / 3
    stop = asyncio.Event()

    async def rival_reaper() -> None:  # another host's reaper, watching all the time
        while not stop.is_set():
            await reap_expired_leases(db, stuck=StuckRows())
            await asyncio.sleep(0.05)

    rival = asyncio.create_task(rival_reaper())
    try:
        async with serving(w):
            rid = await submit_task(db, cmd(["sleep", "2.5"]))
            await eventually(lambda: all_in(db, [rid], "completed"), what="the long run")
    finally:
        stop.set()
        await rival
    assert dict(w.outcomes) == {"completed": 1}
    renewals = await db.fetch_all(
        "SELECT 1 FROM status_transitions WHERE entity_id = ? AND reason_code = "
        "'run.running.lease_renewed'", (rid,))
    assert len(renewals) >= 2


@pytest.mark.parametrize("kw", [{"lease_ttl": 1.0, "check_interval": 0.5},
                                {"lease_ttl": 30, "check_interval": 11}])
async def test_an_inconsistent_lease_and_check_interval_are_refused(
        db: StateDB, kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"lease_ttl .* check_interval"):
        Worker(db, handle_signals=False, **kw)
    Worker(db, handle_signals=False, lease_ttl=kw["lease_ttl"])  # derived: accepted


# ---------------------------------------------------------------- cancels and timeouts


async def test_cancel_and_timeout_log_no_asyncio_error_and_count_their_outcome(
        db: StateDB, tmp_path: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    w = make_worker(db, tmp_path, execute=None, check_interval=0.1)
    async with serving(w):
        late = await submit_task(db, cmd(["sleep", "30"], timeout_seconds=0.3))
        doomed = await submit_task(db, cmd(["sleep", "30"]))
        await eventually(lambda: all_in(db, [doomed], "running"), what="the run to start")
        assert await cancel_task(db, doomed, actor=OPERATOR)
        await eventually(lambda: all_in(db, [late], "timed_out"), what="the timeout")
        await eventually(lambda: asyncio.sleep(0, sum(w.outcomes.values()) == 2),
                         what="both outcomes")
    gc.collect()  # "exception was never retrieved" is logged when the future is collected
    await asyncio.sleep(0)
    assert dict(w.outcomes) == {"timed_out": 1, "cancelled": 1}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_cancel_counts_as_cancelled_only_for_the_lease_it_ended(db: StateDB) -> None:
    """The run cancelled under its own lease is cancelled; an earlier holder's is lost."""
    rid = await submit_task(db, task(), now=1_000.0)
    (first,) = (await claim_runs(db, worker_id="w1", now=1_000.0, lease_ttl=10)).claimed
    await reap_expired_leases(db, now=1_011.0, stuck=StuckRows())
    (second,) = (await claim_runs(db, worker_id="w2", now=1_011.0, lease_ttl=10)).claimed

    async def cancelled_meanwhile(run: dict[str, Any]) -> tuple[int, str]:
        assert await cancel_task(db, rid, actor=OPERATOR)
        return 0, ""

    ctx = RunContext(worker_id="w2", lease_ttl=10, clock=lambda: 1_012.0,
                     executors=Executors(execute=cancelled_meanwhile))
    assert await execute_claimed(db, second, ctx) == "cancelled"
    stale = RunContext(worker_id="w1", lease_ttl=10, clock=lambda: 1_012.0,
                       executors=Executors(execute=ok))
    assert await execute_claimed(db, first, stale) == "lost"
    assert await status(db, rid) == "cancelled"
    assert (await verify(db)).ok


# ---------------------------------------------------------------- the database file goes away


@pytest.mark.sqlite_only
async def test_a_worker_stops_with_database_gone_when_its_file_is_deleted(
        path: str, tmp_path: str) -> None:
    pidfile = tmp_path / "child.pid"
    async with StateDB(path) as db:
        w = make_worker(db, tmp_path, execute=None, check_interval=0.1)
        runner = asyncio.create_task(w.run())
        rid = await submit_task(db, cmd(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"]))
        await eventually(lambda: asyncio.sleep(0, pidfile.exists() and
                                               pidfile.read_text().endswith("\n")),
                         what="the child")
        child = int(pidfile.read_text())
        assert await status(db, rid) == "running"
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        with pytest.raises(DatabaseGone, match="was deleted"):
            await asyncio.wait_for(runner, 20)
        assert str(path) in str(runner.exception())
        assert w.active == {}
        await eventually(lambda: asyncio.sleep(0, not pid_alive(child)), what="child stopped")


@pytest.mark.sqlite_only
async def test_a_worker_stops_when_its_file_is_replaced(path: str, tmp_path: str) -> None:
    other = tmp_path / "other.db"
    async with StateDB(other):
        pass
    async with StateDB(path) as db:
        w = make_worker(db, tmp_path)
        runner = asyncio.create_task(w.run())
        fresh = await submit_task(db, task())
        await eventually(lambda: all_in(db, [fresh], "completed"), what="a first run")
        os.replace(other, path)
        with pytest.raises(DatabaseGone, match="replaced"):
            await asyncio.wait_for(runner, 20)


@pytest.mark.sqlite_only
def test_ledgerq_worker_exits_nonzero_with_one_line_when_its_database_is_deleted(
        path: str, tmp_path: str) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ledgerq", "worker", "--db", str(path), "--quiet",
         "--lock-dir", str(tmp_path / "locks"), "--poll-interval", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        banner = proc.stderr.readline()
        assert banner.startswith("ledgerq worker "), banner
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{path}{suffix}")
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ledgerq: error: database file") and "deleted" in lines[0]


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


# ---------------------------------------------------------------- one page at limit=1


async def test_a_limit_one_pass_over_a_deep_queue_reads_one_page(db: StateDB) -> None:
    await submit_many(db, [task()] * (10 * PAGE_SIZE))
    statements = trace.start()
    try:
        got = await claim_runs(db, worker_id="w1", limit=1, stuck=StuckRows())
        # Its one page is as long as the pass can use: one row (and its spares where
        # writers run at once).
        usable = claim_mod.CLAIM_SPARES if db.many_writers else 1
        assert len(got.claimed) == 1 and got.scanned == usable
        pages = [q for q in statements if q.startswith('SELECT "id", "queued_at"')]
        assert len(pages) == 1, pages
        # With an affinity token the pass must rank every row: the same queue reads 10 pages.
        statements.clear()
        got = await claim_runs(db, worker_id="w1", limit=1, stuck=StuckRows(),
                               advertised_capabilities=["warmed-cache"])
    finally:
        trace.stop()
    pages = [q for q in statements if q.startswith('SELECT "id", "queued_at"')]
    # Ten pages; the last one came up short within its priority level, so it went on
    # below that level too (one more statement, which found nothing).
    assert len(got.claimed) == 1 and len(pages) == 11
    assert got.scanned == 10 * PAGE_SIZE - 1


async def test_a_pass_reads_all_it_can_use_in_one_page(db: StateDB) -> None:
    # A pass of 20 slots can use 20 rows (80 with its spares where writers run at once,
    # more than PAGE_SIZE): one statement reads them all, not a page and then another.
    await submit_many(db, [task()] * (4 * PAGE_SIZE))
    statements = trace.start()
    try:
        got = await claim_runs(db, worker_id="w1", limit=20, stuck=StuckRows())
    finally:
        trace.stop()
    usable = 20 * (claim_mod.CLAIM_SPARES if db.many_writers else 1)
    assert len(got.claimed) == 20 and got.scanned == usable
    pages = [q for q in statements if q.startswith('SELECT "id", "queued_at"')]
    assert len(pages) == 1, pages


async def test_a_pass_chooses_in_the_transaction_it_claims_in(
        db: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    # A pass whose first page is enough reads it in the transaction that claims its rows:
    # no snapshot of its own (no hop to the read connection's or a pool thread), the same
    # rows. Where writers run one at a time that transaction begins deferred (the first
    # claim takes the lock); where they run at once it is READ COMMITTED.
    ids = await submit_many(db, [task()] * 30)
    reads: list[object] = []
    real_read = db.read

    async def reading(fn: Any) -> Any:
        reads.append(fn)
        return await real_read(fn)

    monkeypatch.setattr(db, "read", reading)
    writes = count_writes(db)
    sent: list[str] = []
    if db.many_writers:
        sent = trace.start()
    else:
        await db.run(lambda conn: conn.set_trace_callback(sent.append))
    try:
        got = await claim_runs(db, worker_id="w1", limit=20, stuck=StuckRows())
    finally:
        if db.many_writers:
            trace.stop()
    assert [r["id"] for r in got.claimed] == sorted(ids)[:20]
    assert got.scanned == (30 if db.many_writers else 20)  # (spares where writers run at once)
    assert reads == [] and len(writes) == 1
    if db.many_writers:
        order = [q.split(None, 1)[0].upper() for q in sent]
        assert order.index("SELECT") < order.index("WITH"), order  # the page, then claims
        return
    await db.run(lambda conn: conn.set_trace_callback(None))
    sent = [q for q in sent if not q.startswith("PRAGMA")]  # (run()'s own)
    order = [q.split(None, 1)[0].upper() for q in sent]
    assert order[0] == "BEGIN" and order[-1] == "COMMIT" and order.count("BEGIN") == 1
    assert sent[0] == "BEGIN"  # deferred: the lock is taken by the first claim
    assert order.index("SELECT") < order.index("UPDATE"), order


async def test_a_pass_whose_short_first_page_is_filtered_reads_on(db: StateDB) -> None:
    # The first page is only as long as the pass can use; when its rows cannot be served
    # (a capability the worker lacks, a concurrency key chosen earlier in the pass), the
    # pass reads on and claims the rows behind them, as a full page would have found.
    gpu = await submit_many(db, [task(required_capabilities=["gpu"])] * 3)
    keyed = await submit_many(db, [task(required_capabilities=["gpu-exclusive"])] * 2)
    plain = await submit_many(db, [task()] * 2)
    got = await claim_runs(db, worker_id="w1", limit=3, stuck=StuckRows(),
                           advertised_capabilities=["gpu-exclusive"])
    claimed = {r["id"] for r in got.claimed}
    # The gpu rows are never eligible; one keyed row waits for the other's key.
    assert len(claimed) == 3 and set(plain) <= claimed and not set(gpu) & claimed
    assert len(set(keyed) & claimed) == 1
    assert got.scanned == 7 and not got.malformed
