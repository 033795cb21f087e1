"""The Worker runtime: the service, lease renewal, concurrency and OS key locks,
retries, timeouts, running cancellation, dependencies, the authorize hook and adapters.

Everything runs against real SQLite files and real child processes. Timing assertions
use generous bounds and poll with deadlines; none of them measures performance.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from helpers.trace import count_write_locks
from ledgerq import StateDB
from ledgerq.lifecycle import Actor, StateReason
from ledgerq.lifecycle.engine import create_entity
from ledgerq.projections import history, rebuild, verify
from ledgerq.queue import (
    MAX_LEASE_ATTEMPTS,
    RetryPolicy,
    TaskApplication,
    Worker,
    cancel_task,
    claim_runs,
    moves,
    promote_due,
    reap_expired_leases,
    submit_many,
    submit_task,
)
from ledgerq.queue.runs import perform, run_policy
from ledgerq.queue.submission.submit import run_row
from ledgerq.queue.worker.functions import (
    LEASE_CHECK_SECONDS,
    Executors,
    RunContext,
    execute_claimed,
)
from ledgerq.queue.worker.locks import lock_path
from ledgerq.store.sqltx import SqlTx

HELPER = Path(__file__).resolve().parents[2] / "helpers" / "runtime_worker.py"
OPERATOR = Actor(type="operator", id="tester")
GPU = "gpu-exclusive"
TERMINAL = {"completed", "failed", "timed_out", "skipped", "cancelled"}


# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture
def rt_path(db_target: str) -> str:
    return db_target


@pytest.fixture
async def rdb(rt_path: str) -> AsyncIterator[StateDB]:
    async with StateDB(rt_path) as handle:
        yield handle


@pytest.fixture
def lock_dir(tmp_path: Path) -> Path:
    return tmp_path / "locks"


def cmd(argv: list[str], **kw: Any) -> TaskApplication:
    return TaskApplication("command", {"argv": argv}, "host", **kw)


def make_worker(db: StateDB, lock_dir: Path, **kw: Any) -> Worker:
    opts: dict[str, Any] = {"poll_interval": 0.05, "shutdown_grace": 2.0, "check_interval": 0.1,
                            "lock_dir": lock_dir, "handle_signals": False}
    opts.update(kw)
    return Worker(db, **opts)


@contextlib.asynccontextmanager
async def serving(*workers: Worker) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        yield tasks
    finally:
        for w in workers:
            await w.stop()
        await asyncio.wait_for(asyncio.gather(*tasks), 30)


async def eventually(check: Callable[[], Awaitable[Any]], *, timeout: float = 15.0,
                     interval: float = 0.02, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def row(db: StateDB, run_id: str) -> dict[str, Any]:
    got = await db.fetch_one("SELECT * FROM schedule_runs WHERE id = ?", (run_id,))
    assert got is not None
    return got


async def status(db: StateDB, run_id: str) -> str:
    return str((await row(db, run_id))["status"])


async def wait_status(db: StateDB, run_id: str, *states: str, timeout: float = 15.0) -> str:
    async def check() -> str | None:
        s = await status(db, run_id)
        return s if s in states else None
    return str(await eventually(check, timeout=timeout, what=f"run {run_id} in {states}"))


async def facts(db: StateDB, run_id: str) -> list[dict[str, Any]]:
    return await history(db, "schedule_run", run_id)


async def fact_count(db: StateDB) -> int:
    got = await db.fetch_one("SELECT COUNT(*) AS n FROM status_transitions")
    assert got is not None
    return int(got["n"])


def patch_of(fact: dict[str, Any]) -> dict[str, Any]:
    import json
    value: dict[str, Any] = json.loads(fact["patch"])
    return value


async def assert_clean(db: StateDB) -> None:
    report = await verify(db)
    assert report.ok, [str(d) for d in report.drift]
    doubles = await db.fetch_all(
        "SELECT entity_id, COUNT(*) AS n FROM status_transitions WHERE status IN "
        f"({', '.join('?' * len(TERMINAL))}) GROUP BY entity_id HAVING COUNT(*) > 1",
        tuple(TERMINAL))
    assert doubles == []


def proc_state(pid: int) -> str | None:
    """The /proc state letter of ``pid``, or None when it does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (an unreaped corpse does not count: it runs nothing)."""
    return proc_state(pid) not in (None, "Z", "X")


def group_alive(pgid: int) -> list[int]:
    """Live (non-zombie) members of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


async def wait_dead(pids: list[int], timeout: float = 10.0) -> None:
    async def check() -> bool:
        return not any(pid_alive(p) for p in pids)
    await eventually(check, timeout=timeout, what=f"pids {pids} to die")


async def read_pids(path: Path, count: int = 1, timeout: float = 15.0) -> list[int]:
    async def check() -> list[int] | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        parts = text.split()
        return [int(p) for p in parts] if len(parts) >= count and text.endswith("\n") else None
    return list(await eventually(check, timeout=timeout, what=f"pid file {path}"))


def flock_free(path: Path) -> bool:
    """Whether an exclusive non-blocking flock on ``path`` can be taken (and is released)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the only descriptor releases a lock we took
    return True


class Recorder:
    """An executor that records what ran, when, and how many ran at once.

    ``args["op"]`` chooses the outcome: ok (default), fail, raise, hang; ``args["sleep"]``
    holds the run for that many seconds first.
    """

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.intervals: list[tuple[str, str | None, float, float]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.started: dict[str, asyncio.Event] = {}

    def event(self, run_id: str) -> asyncio.Event:
        return self.started.setdefault(run_id, asyncio.Event())

    async def __call__(self, run: dict[str, Any]) -> tuple[int, str]:
        self.calls.append(run["id"])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.event(run["id"]).set()
        start = time.monotonic()
        try:
            args = run["action_args"]
            await asyncio.sleep(float(args.get("sleep", 0)))
            op = args.get("op", "ok")
            if op == "hang":
                await asyncio.sleep(3600)
            if op == "raise":
                raise RuntimeError("executor blew up")
            if op == "fail":
                return 7, "it failed"
            return 0, ""
        finally:
            self.in_flight -= 1
            self.intervals.append((run["id"], run.get("concurrency_key"), start,
                                   time.monotonic()))


def task(op: str = "ok", sleep: float = 0.0, **kw: Any) -> TaskApplication:
    """A non-command task (runs only through the worker's ``execute``)."""
    return TaskApplication("agent", {"op": op, "sleep": sleep}, "host", **kw)


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


# ---------------------------------------------------------------- 1. the Worker service


async def test_default_worker_id_has_the_records_shape(rdb: StateDB) -> None:
    ids = {Worker(rdb, handle_signals=False).worker_id for _ in range(20)}
    assert len(ids) == 20
    for wid in ids:
        assert re.fullmatch(r"host:[0-9a-f]{8}", wid), wid
    assert Worker(rdb, worker_id="mine").worker_id == "mine"


@pytest.mark.parametrize("kw", [{"capacity": 0}, {"poll_interval": 0}, {"lease_ttl": -1},
                                {"claim_cooldown": -0.1}])
async def test_worker_refuses_bad_settings(rdb: StateDB, kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Worker(rdb, **kw)


async def test_worker_refuses_a_read_only_database(rdb: StateDB, rt_path: str) -> None:
    """Refused when made, naming why: a read-only handle would fail every pass, logged
    every poll, for as long as the worker lived. (``rdb`` made the database: a read-only
    open needs one.)"""
    async with StateDB(rt_path, readonly=True) as ro:
        with pytest.raises(ValueError, match=r"read-only \(readonly=True\)"):
            Worker(ro, handle_signals=False)


async def test_worker_refuses_to_run_twice(rdb: StateDB, lock_dir: Path) -> None:
    w = make_worker(rdb, lock_dir)
    async with serving(w):
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="already running"):
            await w.run()


async def test_heartbeat_is_registered(rdb: StateDB, lock_dir: Path) -> None:
    w = make_worker(rdb, lock_dir, advertised_capabilities=["gpu"])
    async with serving(w):
        got = await eventually(lambda: rdb.fetch_one(
            "SELECT * FROM workers WHERE worker_id = ?", (w.worker_id,)), what="heartbeat")
    assert got["pid"] == os.getpid()
    assert "gpu" in got["advertised_capabilities"]


async def test_in_process_submission_wakes_an_idle_worker(rdb: StateDB, rt_path: str,
                                                          lock_dir: Path) -> None:
    """poll_interval=5: a start within a second can only come from the wake-up."""
    rec = Recorder()
    w = make_worker(rdb, lock_dir, poll_interval=5.0, execute=rec)
    async with serving(w):
        await eventually(lambda: rdb.fetch_one(
            "SELECT 1 FROM workers WHERE worker_id = ?", (w.worker_id,)), what="first pass")
        await asyncio.sleep(0.3)  # the worker is now parked in its 5 s wait
        latencies = []
        async with StateDB(rt_path) as other:  # another handle on the same file counts too
            for i in range(4):
                handle = rdb if i % 2 == 0 else other
                t0 = time.monotonic()
                rid = await submit_task(handle, task())
                await asyncio.wait_for(rec.event(rid).wait(), 1.0)
                latencies.append(time.monotonic() - t0)
                await wait_status(rdb, rid, "completed")
                await asyncio.sleep(0.2)  # idle again
    assert max(latencies) < 1.0
    assert statistics.median(latencies) < 0.5


async def test_a_row_entering_queued_wakes_listening_workers_from_any_path(
        pg_target: str, lock_dir: Path) -> None:
    """PostgreSQL: a row that enters ``queued`` by any write (here the engine's own insert
    and move, which never wake this process's workers themselves) wakes a worker parked in
    a 30 s poll, through the runs table's trigger, NOTIFY and the worker's LISTEN."""
    async with StateDB(pg_target) as db:
        policy = run_policy(db)
        rec = Recorder()
        w = make_worker(db, lock_dir, poll_interval=30.0, execute=rec)

        def created(status: str, **extra: Any) -> Callable[[SqlTx], str]:
            row = {**run_row(task(), time.time(), "host", status, [], "digest",
                             policy=policy), **extra}
            move = {"queued": moves.SUBMITTED, "delayed": moves.SUBMITTED_DELAYED}[status]
            return lambda tx: create_entity(tx, policy, row,
                                            reason=StateReason(code=move.code),
                                            actor=OPERATOR)

        async with serving(w):
            await eventually(lambda: db.fetch_one(
                "SELECT 1 FROM workers WHERE worker_id = ?", (w.worker_id,)),
                what="first pass")
            await asyncio.sleep(0.3)  # parked in its 30 s wait
            inserted = await db.write(created("queued"))
            await asyncio.wait_for(rec.event(inserted).wait(), 5.0)
            later = await db.write(created("delayed", not_before=time.time() + 3600))
            await asyncio.sleep(0.3)
            assert later not in rec.calls
            await db.write(lambda tx: perform(tx, policy, later, moves.START_DUE))
            await asyncio.wait_for(rec.event(later).wait(), 5.0)


async def test_a_trickle_of_submissions_is_claimed_a_few_rows_per_pass(
        rdb: StateDB, lock_dir: Path) -> None:
    """Each submission wakes the worker, but after a pass that drained the queue the next
    waits out the cooldown, so the trickle is claimed in batches, and every task runs once."""
    rec = Recorder()
    w = make_worker(rdb, lock_dir, execute=rec, capacity=20, claim_cooldown=0.05)
    async with serving(w):
        await asyncio.sleep(0.2)
        before = w.claim_passes
        ids = [await submit_task(rdb, task()) for _ in range(120)]
        for rid in ids:
            await wait_status(rdb, rid, "completed")
        passes = w.claim_passes - before
    assert sorted(rec.calls) == sorted(ids)
    assert passes <= 40, passes  # ~one pass per submission without the cooldown


async def test_the_cooldown_never_slows_a_backlog_or_a_rested_worker(
        rdb: StateDB, lock_dir: Path) -> None:
    """A pass that fills its limit starts the next at once: 100 tasks through 5 slots with a
    2 s cooldown finish in far less than the 20 passes x 2 s a throttled backlog would
    take. Once the cooldown has passed, a submission is claimed at once (5 s poll)."""
    rec = Recorder()
    w = make_worker(rdb, lock_dir, execute=rec, capacity=5, claim_limit=5, claim_cooldown=2.0,
                    poll_interval=5.0)
    ids = await submit_many(rdb, [task() for _ in range(100)])
    t0 = time.monotonic()
    async with serving(w):
        for rid in ids:
            await wait_status(rdb, rid, "completed", timeout=30)
        drained = time.monotonic() - t0
        await asyncio.sleep(2.2)  # the last (draining) pass's cooldown is over
        t1 = time.monotonic()
        rid = await submit_task(rdb, task())
        await asyncio.wait_for(rec.event(rid).wait(), 1.5)
        rested = time.monotonic() - t1
    assert drained < 15, drained
    assert rested < 1.0, rested


async def test_without_a_wakeup_the_worker_finds_work_by_polling(rdb: StateDB, rt_path: str,
                                                                 lock_dir: Path) -> None:
    """A write the wake-up cannot see (another process) is found at the next short poll."""
    rec = Recorder()
    w = make_worker(rdb, lock_dir, poll_interval=0.1, execute=rec)
    async with serving(w):
        await asyncio.sleep(0.2)
        code = ("import asyncio, sys\n"
                "from ledgerq import StateDB\n"
                "from ledgerq.queue import TaskApplication, submit_task\n"
                "async def main():\n"
                "    async with StateDB(sys.argv[1]) as db:\n"
                "        print(await submit_task(db, TaskApplication('agent', {}, 'host')))\n"
                "asyncio.run(main())\n")
        out = await asyncio.to_thread(subprocess.run, [sys.executable, "-c", code, str(rt_path)],
                                      capture_output=True, text=True, timeout=60, check=True)
        rid = out.stdout.strip()
        await wait_status(rdb, rid, "completed", timeout=10)
    assert rec.calls == [rid]


async def test_an_idle_worker_polling_an_empty_queue_takes_no_write_lock(
        rdb: StateDB, lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Polling must not hold other processes' writers up: an idle pass takes no write lock."""
    rec = Recorder()
    w = make_worker(rdb, lock_dir, poll_interval=0.02, execute=rec)
    async with serving(w):
        await eventually(lambda: rdb.fetch_one(
            "SELECT 1 FROM workers WHERE worker_id = ?", (w.worker_id,)), what="first pass")
        await asyncio.sleep(0.1)
        writes = await count_write_locks(rdb, monkeypatch)
        await asyncio.sleep(0.5)  # ~25 polls, with the reaper's and promoter's probes
        idle = list(writes)
        rid = await submit_task(rdb, task())  # then a submission still gets claimed
        await wait_status(rdb, rid, "completed")
    assert idle == [], idle
    assert rec.calls == [rid]


class WorkerProcess:
    """tests/helpers/runtime_worker.py in its own process."""

    def __init__(self, db: Path, lock_dir: Path, worker_id: str, *extra: str) -> None:
        self.worker_id = worker_id
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPER), "--db", str(db), "--lock-dir", str(lock_dir),
             "--worker-id", worker_id, *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    async def wait(self, timeout: float) -> int:
        return await asyncio.to_thread(self.proc.wait, timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def test_sigterm_requeues_what_does_not_finish_within_grace(
        rdb: StateDB, rt_path: str, lock_dir: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    rid = await submit_task(rdb, cmd(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"]))
    wp = WorkerProcess(rt_path, lock_dir, "host:sigterm1", "--shutdown-grace", "0.3",
                       "--capacity", "2")
    try:
        (child,) = await read_pids(pidfile)
        await wait_status(rdb, rid, "running")
        assert group_alive(child)
        t0 = time.monotonic()
        wp.proc.send_signal(signal.SIGTERM)
        assert await wp.wait(20) == 0, wp.proc.stderr.read() if wp.proc.stderr else ""
        assert time.monotonic() - t0 < 10
    finally:
        wp.kill()
    await wait_dead([child], timeout=5)
    assert group_alive(child) == []
    got = await row(rdb, rid)
    assert got["status"] == "queued"
    assert got["status_reason_code"] == "run.queued.worker_shutdown"
    assert got["leased_by"] is None and got["lease_expires_at"] is None
    assert got["lease_attempts"] == 0  # a shutdown is not a failed lease
    assert got["ended_at"] is None
    last = (await facts(rdb, rid))[-1]
    assert (last["previous_status"], last["status"], last["actor"]) == (
        "running", "queued", "host:sigterm1")
    await assert_clean(rdb)


async def test_sigterm_lets_a_short_run_finish_and_claims_nothing_more(
        rdb: StateDB, rt_path: str, lock_dir: Path, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    first = await submit_task(rdb, cmd(["sh", "-c", f"echo $$ > {pidfile}; sleep 1"]))
    wp = WorkerProcess(rt_path, lock_dir, "host:sigterm2", "--shutdown-grace", "15",
                       "--capacity", "1")
    try:
        (child,) = await read_pids(pidfile)
        second = await submit_task(rdb, cmd(["true"]))  # capacity is full: stays queued
        wp.proc.send_signal(signal.SIGTERM)
        assert await wp.wait(30) == 0
    finally:
        wp.kill()
    got = await row(rdb, first)
    assert got["status"] == "completed" and got["exit_code"] == 0
    assert not pid_alive(child)
    assert [f["status"] for f in await facts(rdb, second)] == ["queued"]
    await assert_clean(rdb)


async def test_stop_requeues_in_process_runs_after_grace(rdb: StateDB, lock_dir: Path) -> None:
    rec = Recorder()
    w = make_worker(rdb, lock_dir, execute=rec, shutdown_grace=0.2)
    t = asyncio.create_task(w.run())
    rid = await submit_task(rdb, task("hang"))
    await asyncio.wait_for(rec.event(rid).wait(), 10)
    await w.stop()
    await asyncio.wait_for(t, 10)
    got = await row(rdb, rid)
    assert (got["status"], got["status_reason_code"]) == ("queued", "run.queued.worker_shutdown")
    assert w.active == {}
    assert w.outcomes["queued"] == 1
    await assert_clean(rdb)


# ---------------------------------------------------------------- 2. lease renewal


async def test_a_healthy_long_run_keeps_its_lease(rdb: StateDB, lock_dir: Path) -> None:
    """lease_ttl 1.5 s, a 4 s child: without renewal the worker's own reaper would requeue it.

    The lease check runs at the library's default interval.
    """
    w = make_worker(rdb, lock_dir, lease_ttl=1.5, check_interval=LEASE_CHECK_SECONDS)
    async with serving(w):
        rid = await submit_task(rdb, cmd(["sleep", "4"]))
        await wait_status(rdb, rid, "completed", timeout=30)
    hist = await facts(rdb, rid)
    renewals = [f for f in hist if f["reason_code"] == "run.running.lease_renewed"]
    assert len(renewals) >= 3
    for f in renewals:
        assert (f["previous_status"], f["status"], f["actor"]) == ("running", "running",
                                                                     w.worker_id)
        assert "lease_expires_at" in patch_of(f)
    expiries = [patch_of(f)["lease_expires_at"] for f in renewals]
    assert expiries == sorted(expiries)
    # the lease never lapsed: each renewal landed before the expiry it replaced
    lease = patch_of(hist[1])["lease_expires_at"]
    for f in renewals:
        assert f["created_at"] < lease
        lease = patch_of(f)["lease_expires_at"]
    assert [f["status"] for f in hist if f["status"] == "queued"] == ["queued"]  # creation only
    assert not any(f["reason_code"] == "run.queued.lease_expired" for f in hist)
    assert (await row(rdb, rid))["lease_attempts"] == 1
    await assert_clean(rdb)
    before = await db_rows(rdb)
    await rebuild(rdb)
    assert await db_rows(rdb) == before
    await assert_clean(rdb)


async def test_concurrent_runs_share_one_lease_read_per_check(
        rdb: StateDB, lock_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """30 runs started at scattered moments still check their leases on the same
    boundaries: each check interval costs about one read for all of them, not one per
    run, and every renewal still lands before its lease would lapse."""
    lease_reads: list[int] = []
    real = SqlTx.read_leases

    def spy(self: SqlTx, policy: Any, ids: Any, **kw: Any) -> Any:
        lease_reads.append(len(ids))
        return real(self, policy, ids, **kw)

    monkeypatch.setattr(SqlTx, "read_leases", spy)
    rec = Recorder()
    w = make_worker(rdb, lock_dir, execute=rec, capacity=30, lease_ttl=0.9, check_interval=0.1)
    ids = []
    async with serving(w):
        for _ in range(30):  # 37 ms apart: every run's own phase differs
            ids.append(await submit_task(rdb, task(sleep=1.5)))
            await asyncio.sleep(0.037)
        for rid in ids:
            await wait_status(rdb, rid, "completed", timeout=30)
    checks = sum(lease_reads)
    # Every run checked about every 0.1 s over its 1.5 s: ~15 each when the machine is
    # idle; a loaded one (two suites at once) was seen at ~10, so 7 each is the floor.
    assert checks >= 30 * 7, checks
    assert len(lease_reads) <= checks / 8, (len(lease_reads), checks)
    for rid in ids:
        codes = [f["reason_code"] for f in await facts(rdb, rid)]
        assert "run.running.lease_renewed" in codes
        assert "run.queued.lease_expired" not in codes
    await assert_clean(rdb)


async def db_rows(db: StateDB) -> list[dict[str, Any]]:
    return await db.fetch_all("SELECT * FROM schedule_runs ORDER BY id")


async def test_reaped_lease_stops_the_child_and_writes_nothing(rdb: StateDB,
                                                               tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    rid = await submit_task(rdb, cmd(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"]))
    (claimed,) = (await claim_runs(rdb, worker_id="w-lost", lease_ttl=30)).claimed
    ctx = RunContext(worker_id="w-lost", lease_ttl=30, check_interval=0.1)
    runner = asyncio.create_task(execute_claimed(rdb, claimed, ctx))
    (child,) = await read_pids(pidfile)
    assert pid_alive(child)
    reaped = await reap_expired_leases(rdb, now=time.time() + 1000)
    assert reaped == {"requeued": 1, "failed": 0}
    n = await fact_count(rdb)
    assert await asyncio.wait_for(runner, 10) == "lost"
    await wait_dead([child], timeout=5)
    assert group_alive(child) == []
    assert await fact_count(rdb) == n  # not a single write after the reap
    assert not [f for f in await facts(rdb, rid) if f["actor"] == "w-lost"
                and f["status"] != "running"]
    got = await row(rdb, rid)
    assert (got["status"], got["status_reason_code"]) == ("queued", "run.queued.lease_expired")
    await assert_clean(rdb)


async def test_worker_that_loses_a_lease_stops_its_child(rdb: StateDB, lock_dir: Path,
                                                         tmp_path: Path) -> None:
    """Service level: the reaped run may be reclaimed, but the first child dies and the
    worker writes nothing terminal for the lease it lost."""
    pidfile = tmp_path / "child.pid"
    w = make_worker(rdb, lock_dir, capacity=1, lease_ttl=30)
    async with serving(w):
        rid = await submit_task(rdb, cmd(["sh", "-c", f"echo $$ >> {pidfile}; exec sleep 30"]))
        (first,) = await read_pids(pidfile)
        await reap_expired_leases(rdb, now=time.time() + 1000)
        await wait_dead([first], timeout=5)
        await eventually(lambda: asyncio.sleep(0, w.outcomes["lost"] == 1), what="lost outcome")
        await cancel_task(rdb, rid, actor=OPERATOR)  # end the (possibly reclaimed) run
        await wait_status(rdb, rid, "cancelled")
        await eventually(lambda: asyncio.sleep(0, not w.active), what="capacity released")
    for pid in (await read_pids(pidfile)):
        assert not pid_alive(pid)
    hist = await facts(rdb, rid)
    assert not [f for f in hist if f["actor"] == w.worker_id and f["status"] in TERMINAL]
    assert "run.queued.lease_expired" in [f["reason_code"] for f in hist]
    await assert_clean(rdb)


# ---------------------------------------------------------------- 3. concurrency


async def test_capacity_is_never_exceeded(rdb: StateDB, lock_dir: Path) -> None:
    rec = Recorder()
    w = make_worker(rdb, lock_dir, capacity=3, execute=rec)
    ids = await submit_many(rdb, [task(sleep=random.uniform(0.02, 0.15)) for _ in range(24)])
    async with serving(w):
        for rid in ids:
            await wait_status(rdb, rid, "completed")
    assert rec.max_in_flight == 3
    assert w.max_active == 3
    assert sorted(rec.calls) == sorted(ids)
    await assert_clean(rdb)


async def test_independent_runs_overlap(rdb: StateDB, lock_dir: Path) -> None:
    rec = Recorder()
    w = make_worker(rdb, lock_dir, capacity=4, execute=rec)
    ids = await submit_many(rdb, [task(sleep=0.5) for _ in range(4)])
    async with serving(w):
        for rid in ids:
            await wait_status(rdb, rid, "completed")
    spans = [(s, e) for _, _, s, e in rec.intervals]
    assert len(spans) == 4
    assert max(e for _, e in spans) - min(s for s, _ in spans) < 1.5  # serially: >= 2.0
    assert all(overlaps(a, b) for a in spans for b in spans)


async def test_equal_keys_never_overlap_across_two_workers(rdb: StateDB, rt_path: str,
                                                           lock_dir: Path) -> None:
    rec = Recorder()
    apps = ([task(sleep=0.08, required_capabilities=[GPU]) for _ in range(6)]
            + [task(sleep=0.08, required_capabilities=[GPU]) for _ in range(6)]
            + [task(sleep=0.08) for _ in range(6)])
    ids_a = await submit_many(rdb, apps[:6], host="hostA")
    ids_b = await submit_many(rdb, apps[6:12], host="hostB")
    free = await submit_many(rdb, apps[12:], host="hostA")
    async with StateDB(rt_path) as other:
        w1 = make_worker(rdb, lock_dir, capacity=4, execute=rec, advertised_capabilities=[GPU])
        w2 = make_worker(other, lock_dir, capacity=4, execute=rec, advertised_capabilities=[GPU])
        async with serving(w1, w2):
            for rid in ids_a + ids_b + free:
                await wait_status(rdb, rid, "completed")
    assert sorted(rec.calls) == sorted(ids_a + ids_b + free)
    by_key: dict[str | None, list[tuple[float, float]]] = {}
    for _, key, s, e in rec.intervals:
        by_key.setdefault(key, []).append((s, e))
    assert set(by_key) == {"hostA:gpu-exclusive", "hostB:gpu-exclusive", None}
    for key in ("hostA:gpu-exclusive", "hostB:gpu-exclusive"):
        spans = sorted(by_key[key])
        assert len(spans) == 6
        for a, b in itertools.pairwise(spans):
            assert a[1] <= b[0], f"{key}: {a} overlaps {b}"
    # different keys, and unkeyed runs, are independent and do overlap
    assert any(overlaps(a, b) for a in by_key["hostA:gpu-exclusive"]
               for b in by_key["hostB:gpu-exclusive"])
    await assert_clean(rdb)


async def test_concurrent_claim_passes_take_one_run_per_key(rdb: StateDB, rt_path: str) -> None:
    await submit_many(rdb, [task(required_capabilities=[GPU]) for _ in range(5)], host="h")
    async with StateDB(rt_path) as other:
        passes = await asyncio.gather(
            claim_runs(rdb, worker_id="w1", advertised_capabilities=[GPU]),
            claim_runs(other, worker_id="w2", advertised_capabilities=[GPU]),
            claim_runs(rdb, worker_id="w3", advertised_capabilities=[GPU]))
    assert sum(len(p.claimed) for p in passes) == 1
    running = await rdb.fetch_all("SELECT id FROM schedule_runs WHERE status = 'running'")
    assert len(running) == 1


async def test_capacity_is_released_on_every_exit_path(rdb: StateDB, lock_dir: Path) -> None:
    """capacity=1: any leaked slot would stop the next run from ever starting."""
    rec = Recorder()
    w = make_worker(rdb, lock_dir, capacity=1, execute=rec, lease_ttl=30,
                    authorize=lambda r: r["action_args"].get("op") != "deny")
    async with serving(w):
        ok = await submit_task(rdb, task("ok"))
        assert await wait_status(rdb, ok, "completed") == "completed"
        fail = await submit_task(rdb, task("fail"))
        assert await wait_status(rdb, fail, "failed") == "failed"
        boom = await submit_task(rdb, task("raise"))
        await wait_status(rdb, boom, "failed")
        assert (await row(rdb, boom))["status_reason_code"] == "run.failed.exception"
        deny = await submit_task(rdb, task("deny"))
        await wait_status(rdb, deny, "failed")
        slow = await submit_task(rdb, task("hang", timeout_seconds=0.3))
        await wait_status(rdb, slow, "timed_out")
        hang = await submit_task(rdb, task("hang"))
        await asyncio.wait_for(rec.event(hang).wait(), 10)
        assert await cancel_task(rdb, hang, actor=OPERATOR)
        lost = await submit_task(rdb, task("hang"))
        await asyncio.wait_for(rec.event(lost).wait(), 10)
        rec.started.pop(lost)
        await reap_expired_leases(rdb, now=time.time() + 1000)
        # the worker notices, stops the run and (being free) claims it again
        await asyncio.wait_for(rec.event(lost).wait(), 10)
        await cancel_task(rdb, lost, actor=OPERATOR)
        last = await submit_task(rdb, task("ok"))
        await wait_status(rdb, last, "completed")
        await eventually(lambda: asyncio.sleep(0, not w.active), what="no active runs")
    assert w.active == {}
    assert rec.max_in_flight == 1 and w.max_active == 1
    assert rec.in_flight == 0
    # The reaped lease is lost; both cancels count as what they are.
    assert (w.outcomes["lost"], w.outcomes["cancelled"]) == (1, 2)
    await assert_clean(rdb)


async def test_an_executor_that_raises_before_awaiting_fails_the_run(rdb: StateDB,
                                                                     lock_dir: Path) -> None:
    """An executor that raises when called (a plain function, a bad factory) is an
    exception like any other: the run fails at once instead of staying running until
    its lease expires, and the slot is released."""
    calls: list[str] = []

    def broken(run: dict[str, Any]) -> Any:
        calls.append(run["id"])
        raise LookupError("no such tool")

    w = make_worker(rdb, lock_dir, capacity=1, execute=broken)
    async with serving(w):
        rid = await submit_task(rdb, task())
        await wait_status(rdb, rid, "failed", timeout=5)
        await eventually(lambda: asyncio.sleep(0, not w.active), what="slot released")
    got = await row(rdb, rid)
    assert got["status_reason_code"] == "run.failed.exception"
    assert "no such tool" in got["error_detail"]
    assert calls == [rid]
    await assert_clean(rdb)


async def test_os_lock_is_held_while_a_keyed_run_executes(rdb: StateDB, lock_dir: Path) -> None:
    gate = asyncio.Event()
    entered = asyncio.Event()

    async def execute(run: dict[str, Any]) -> tuple[int, str]:
        entered.set()
        await gate.wait()
        if run["action_args"].get("op") == "raise":
            raise RuntimeError("boom")
        return 0, ""

    path = lock_path(lock_dir, "h:gpu-exclusive")
    w = make_worker(rdb, lock_dir, execute=execute, advertised_capabilities=[GPU])
    async with serving(w):
        for op in ("ok", "raise"):
            entered.clear()
            gate.clear()
            rid = await submit_task(rdb, task(op, required_capabilities=[GPU]), host="h")
            await asyncio.wait_for(entered.wait(), 10)
            assert not flock_free(path), "the key's lock must be held while the run executes"
            gate.set()
            await wait_status(rdb, rid, "completed", "failed")
            await eventually(lambda: asyncio.sleep(0, flock_free(path)), timeout=5,
                             what="lock released")
    assert flock_free(path)


async def test_an_external_lock_holder_delays_the_run(rdb: StateDB, lock_dir: Path) -> None:
    rec = Recorder()
    w = make_worker(rdb, lock_dir, execute=rec, advertised_capabilities=[GPU], lease_ttl=1.2)
    path = lock_path(lock_dir, "h:gpu-exclusive")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # e.g. `flock <lock> some-gpu-program`
    try:
        async with serving(w):
            rid = await submit_task(rdb, task(required_capabilities=[GPU]), host="h")
            await wait_status(rdb, rid, "running")
            await asyncio.sleep(2.0)  # longer than the lease: waiting must renew it
            assert rec.calls == []
            assert await status(rdb, rid) == "running"
            fcntl.flock(fd, fcntl.LOCK_UN)
            t0 = time.monotonic()
            await asyncio.wait_for(rec.event(rid).wait(), 5)
            assert time.monotonic() - t0 < 2
            await wait_status(rdb, rid, "completed")
    finally:
        os.close(fd)
    hist = await facts(rdb, rid)
    assert any(f["reason_code"] == "run.running.lease_renewed" for f in hist)
    assert not any(f["reason_code"] == "run.queued.lease_expired" for f in hist)
    await assert_clean(rdb)


@contextlib.contextmanager
def holding(path: Path) -> Any:
    """Hold the key's lock the way another program on the host would."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)


async def test_shutdown_while_waiting_for_the_lock_requeues(rdb: StateDB, lock_dir: Path) -> None:
    rec = Recorder()
    w = make_worker(rdb, lock_dir, execute=rec, advertised_capabilities=[GPU],
                    shutdown_grace=0.2)
    with holding(lock_path(lock_dir, "h:gpu-exclusive")):
        t = asyncio.create_task(w.run())
        rid = await submit_task(rdb, task(required_capabilities=[GPU]), host="h")
        await wait_status(rdb, rid, "running")
        await w.stop()
        await asyncio.wait_for(t, 10)
    got = await row(rdb, rid)
    assert (got["status"], got["status_reason_code"]) == ("queued", "run.queued.worker_shutdown")
    assert rec.calls == []
    await assert_clean(rdb)


async def test_cancel_while_waiting_for_the_lock_never_runs(rdb: StateDB, lock_dir: Path) -> None:
    rec = Recorder()
    path = lock_path(lock_dir, "h:gpu-exclusive")
    w = make_worker(rdb, lock_dir, execute=rec, advertised_capabilities=[GPU])
    async with serving(w):
        with holding(path):
            rid = await submit_task(rdb, task(required_capabilities=[GPU]), host="h")
            await wait_status(rdb, rid, "running")
            assert await cancel_task(rdb, rid, actor=OPERATOR)
            await eventually(lambda: asyncio.sleep(0, w.outcomes["cancelled"] == 1),
                             what="the waiting run to notice")
        await asyncio.sleep(0.3)
        assert rec.calls == []
        assert flock_free(path)
        nxt = await submit_task(rdb, task(required_capabilities=[GPU]), host="h")
        await wait_status(rdb, nxt, "completed")
    assert rec.calls == [nxt]
    await assert_clean(rdb)


# ---------------------------------------------------------------- 4. retries


async def test_failing_command_retries_then_fails(rdb: StateDB, lock_dir: Path) -> None:
    w = make_worker(rdb, lock_dir)
    async with serving(w):
        rid = await submit_task(rdb, cmd(["sh", "-c", "echo nope >&2; exit 3"],
                                         retry=RetryPolicy(3, base_delay=0.05)))
        await wait_status(rdb, rid, "failed", timeout=30)
    hist = await facts(rdb, rid)
    assert [f["status"] for f in hist] == ["queued", "running", "retry_wait", "queued", "running",
                                           "retry_wait", "queued", "running", "failed"]
    codes = [f["reason_code"] for f in hist]
    assert codes.count("run.retry_wait.backoff") == 2
    assert codes.count("run.queued.retry_due") == 2
    assert "run.queued.lease_expired" not in codes
    assert codes[-1] == "run.failed.exit_nonzero"
    waits = [patch_of(f) for f in hist if f["status"] == "retry_wait"]
    assert [p["run_attempts"] for p in waits] == [1, 2]
    assert all(p["retry_due_at"] is not None and p["leased_by"] is None for p in waits)
    for f in hist:
        if f["previous_status"] == "retry_wait" and f["status"] == "queued":
            assert patch_of(f)["lease_attempts"] == 0
            assert patch_of(f)["retry_due_at"] is None
    got = await row(rdb, rid)
    assert got["run_attempts"] == 3
    assert got["exit_code"] == 3
    assert "nope" in got["error_detail"]
    assert got["lease_attempts"] == 1  # one claim since the last due retry
    await assert_clean(rdb)


async def test_retry_succeeds_on_the_second_attempt(rdb: StateDB, lock_dir: Path,
                                                    tmp_path: Path) -> None:
    flag = tmp_path / "tried"
    script = f"test -e {flag} && exit 0; touch {flag}; exit 5"
    w = make_worker(rdb, lock_dir)
    async with serving(w):
        rid = await submit_task(rdb, cmd(["sh", "-c", script],
                                         retry=RetryPolicy(4, base_delay=0.05, jitter=0)))
        await wait_status(rdb, rid, "completed", timeout=30)
    got = await row(rdb, rid)
    assert (got["run_attempts"], got["exit_code"], got["error_detail"]) == (2, 0, None)
    assert [f["status"] for f in await facts(rdb, rid)] == [
        "queued", "running", "retry_wait", "queued", "running", "completed"]
    await assert_clean(rdb)


async def execute_once(db: StateDB, run: dict[str, Any], code: int, *, worker: str,
                       now: float) -> str:
    async def fixed(_: dict[str, Any]) -> tuple[int, str]:
        return code, "" if code == 0 else f"exit {code}"
    ctx = RunContext(worker_id=worker, lease_ttl=10, clock=lambda: now,
                     executors=Executors(execute=fixed))
    return await execute_claimed(db, run, ctx)


async def claim_one(db: StateDB, worker: str, now: float) -> dict[str, Any]:
    (got,) = (await claim_runs(db, worker_id=worker, now=now, lease_ttl=10, limit=1)).claimed
    return got


async def test_lease_expiry_and_retry_are_counted_apart(rdb: StateDB) -> None:
    """lease_attempts counts claims since submission or a due retry; run_attempts counts runs."""
    t = 1000.0
    rid = await submit_task(rdb, task(retry=RetryPolicy(5, base_delay=1, jitter=0)), now=t)
    await claim_one(rdb, "w1", t)
    await reap_expired_leases(rdb, now=t + 11)  # lease expiry 1
    got = await row(rdb, rid)
    assert (got["status"], got["lease_attempts"], got["run_attempts"]) == ("queued", 1, 0)
    run = await claim_one(rdb, "w2", t + 12)
    assert run["lease_attempts"] == 2
    assert await execute_once(rdb, run, 1, worker="w2", now=t + 13) == "retry_wait"
    got = await row(rdb, rid)
    assert (got["status"], got["lease_attempts"], got["run_attempts"]) == ("retry_wait", 2, 1)
    assert await promote_due(rdb, now=t + 13.5) == {
        "retried": 0, "released": 0, "cancelled": 0, "started": 0}
    assert (await promote_due(rdb, now=t + 14))["retried"] == 1
    got = await row(rdb, rid)
    assert (got["status"], got["lease_attempts"], got["status_reason_code"]) == (
        "queued", 0, "run.queued.retry_due")
    # the reset gives the run a full set of lease expiries again
    now = t + 20
    for i in range(MAX_LEASE_ATTEMPTS):
        await claim_one(rdb, "w3", now)
        now += 11
        await reap_expired_leases(rdb, now=now)
        expected = "queued" if i < MAX_LEASE_ATTEMPTS - 1 else "failed"
        assert await status(rdb, rid) == expected
    got = await row(rdb, rid)
    assert got["status_reason_code"] == "run.failed.lease_attempts_exhausted"
    assert got["run_attempts"] == 1
    codes = [f["reason_code"] for f in await facts(rdb, rid)]
    assert codes.count("run.queued.lease_expired") == 3
    assert codes.count("run.queued.retry_due") == 1
    await assert_clean(rdb)


def test_retry_delay_grows_by_factor_and_is_capped() -> None:
    p = RetryPolicy(10, base_delay=0.5, factor=3, max_delay=10, jitter=0)
    assert [p.delay(n) for n in range(1, 6)] == [0.5, 1.5, 4.5, 10, 10]
    assert p.delay(0) == 0.5


def test_retry_jitter_stays_within_its_fraction() -> None:
    p = RetryPolicy(10, base_delay=2, factor=2, max_delay=5, jitter=0.25)
    rng = random.Random(7)
    for n, nominal in ((1, 2.0), (2, 4.0), (3, 5.0), (9, 5.0)):
        samples = [p.delay(n, rng) for _ in range(500)]
        assert all(nominal * 0.75 <= s <= nominal * 1.25 for s in samples)
        assert max(samples) - min(samples) > nominal * 0.2  # it does spread
    assert RetryPolicy(3, 1.0, jitter=1.0).delay(1, rng) >= 0


@pytest.mark.parametrize("args", [
    {"max_attempts": 0, "base_delay": 1}, {"max_attempts": -2, "base_delay": 1},
    {"max_attempts": 2.5, "base_delay": 1}, {"max_attempts": 3, "base_delay": -1},
    {"max_attempts": 3, "base_delay": float("nan")}, {"max_attempts": 3, "base_delay": 1,
                                                      "factor": 0.5},
    {"max_attempts": 3, "base_delay": 1, "max_delay": -1},
    {"max_attempts": 3, "base_delay": 1, "max_delay": float("inf")},
    {"max_attempts": 3, "base_delay": 1, "jitter": 1.5},
    {"max_attempts": 3, "base_delay": 1, "jitter": -0.1},
])
def test_invalid_retry_policy_is_refused(args: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="RetryPolicy"):
        RetryPolicy(**args)


async def test_retry_policy_survives_the_row(rdb: StateDB) -> None:
    policy = RetryPolicy(4, base_delay=0.25, factor=3, max_delay=9, jitter=0.5)
    rid = await submit_task(rdb, task(retry=policy))
    import json
    assert RetryPolicy.from_dict(json.loads((await row(rdb, rid))["retry_policy"])) == policy


# ---------------------------------------------------------------- 5. timeouts


async def test_deadline_kills_the_process_group(rdb: StateDB, lock_dir: Path,
                                                tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 30 & echo $! > {pids}.bg; echo $$ > {pids}; exec sleep 30"
    w = make_worker(rdb, lock_dir)
    async with serving(w):
        rid = await submit_task(rdb, cmd(["sh", "-c", script], timeout_seconds=0.5))
        (leader,) = await read_pids(pids)
        (background,) = await read_pids(Path(f"{pids}.bg"))
        assert pid_alive(background) and pid_alive(leader)
        await wait_status(rdb, rid, "timed_out", timeout=15)
    got = await row(rdb, rid)
    assert got["exit_code"] == 124
    assert got["status_reason_code"] == "run.timed_out.deadline"
    assert "timed out" in got["error_detail"]
    hist = await facts(rdb, rid)
    started = next(f["created_at"] for f in hist if f["status"] == "running")
    assert 0.4 <= got["ended_at"] - started < 10
    await wait_dead([leader, background], timeout=5)
    assert group_alive(leader) == []
    await assert_clean(rdb)


async def test_a_run_within_its_deadline_completes(rdb: StateDB, lock_dir: Path) -> None:
    w = make_worker(rdb, lock_dir)
    async with serving(w):
        rid = await submit_task(rdb, cmd(["sleep", "0.1"], timeout_seconds=20))
        await wait_status(rdb, rid, "completed")


# ---------------------------------------------------------------- 6. cancelling running runs


async def test_cancel_running_kills_the_child(rdb: StateDB, lock_dir: Path,
                                              tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    w = make_worker(rdb, lock_dir, check_interval=0.5)
    async with serving(w):
        rid = await submit_task(rdb, cmd(["sh", "-c", f"echo $$ > {pidfile}; exec sleep 30"]))
        (child,) = await read_pids(pidfile)
        await wait_status(rdb, rid, "running")
        t0 = time.monotonic()
        assert await cancel_task(rdb, rid, actor=OPERATOR, summary="enough")
        n = await fact_count(rdb)
        await wait_dead([child], timeout=5)
        assert time.monotonic() - t0 < 2.0  # noticed within about a second (check: 0.5 s)
        await eventually(lambda: asyncio.sleep(0, not w.active), what="run released")
        await asyncio.sleep(0.6)
        assert await fact_count(rdb) == n  # the worker wrote nothing after the cancel
    got = await row(rdb, rid)
    assert (got["status"], got["status_reason_code"]) == ("cancelled", "run.cancelled.operator")
    assert got["ended_at"] is not None
    assert (w.outcomes["cancelled"], w.outcomes["lost"]) == (1, 0)
    assert group_alive(child) == []
    await assert_clean(rdb)
    assert not await cancel_task(rdb, rid, actor=OPERATOR)  # a terminal row: a conflict


# ---------------------------------------------------------------- 7. dependencies


async def test_unknown_dependency_is_refused_and_writes_nothing(rdb: StateDB) -> None:
    known = await submit_task(rdb, task())
    n_rows = len(await db_rows(rdb))
    n_facts = await fact_count(rdb)
    with pytest.raises(ValueError, match="no-such-run"):
        await submit_task(rdb, task(depends_on=[known, "no-such-run"]))
    with pytest.raises(ValueError, match="unknown"):
        await submit_many(rdb, [task(), task(depends_on=["missing"])])  # all or nothing
    with pytest.raises(ValueError, match="depends_on"):
        await submit_task(rdb, task(depends_on="not-a-list"))
    assert len(await db_rows(rdb)) == n_rows
    assert await fact_count(rdb) == n_facts


async def test_dependent_waits_then_is_released(rdb: StateDB) -> None:
    t = 1000.0
    a = await submit_task(rdb, task(), now=t)
    b = await submit_task(rdb, task(), now=t + 1)
    c = await submit_task(rdb, task(depends_on=[a, b]), now=t + 2)
    hist = await facts(rdb, c)
    assert len(hist) == 1
    assert (hist[0]["previous_status"], hist[0]["status"], hist[0]["reason_code"]) == (
        None, "waiting_dependency", "run.waiting_dependency.submitted")
    claimed = {r["id"]: r for r in (await claim_runs(rdb, worker_id="w", now=t + 3)).claimed}
    assert set(claimed) == {a, b}  # a waiting run is never claimed
    assert await execute_once(rdb, claimed[a], 0, worker="w", now=t + 4) == "completed"
    assert await status(rdb, c) == "waiting_dependency"
    assert await execute_once(rdb, claimed[b], 0, worker="w", now=t + 5) == "completed"
    got = await row(rdb, c)
    assert (got["status"], got["status_reason_code"]) == ("queued", "run.queued.dependencies_met")
    assert [f["status"] for f in await facts(rdb, c)] == ["waiting_dependency", "queued"]
    (run_c,) = (await claim_runs(rdb, worker_id="w", now=t + 6)).claimed
    assert run_c["id"] == c
    await assert_clean(rdb)


async def test_failed_dependency_cancels_the_chain(rdb: StateDB) -> None:
    t = 1000.0
    a = await submit_task(rdb, task(), now=t)
    ok = await submit_task(rdb, task(), now=t)
    b = await submit_task(rdb, task(depends_on=[a, ok]), now=t)
    c = await submit_task(rdb, task(depends_on=[b]), now=t)
    d = await submit_task(rdb, task(depends_on=[c, ok]), now=t)
    claimed = {r["id"]: r for r in (await claim_runs(rdb, worker_id="w", now=t + 1)).claimed}
    assert await execute_once(rdb, claimed[ok], 0, worker="w", now=t + 2) == "completed"
    assert await execute_once(rdb, claimed[a], 9, worker="w", now=t + 3) == "failed"
    for rid in (b, c, d):
        got = await row(rdb, rid)
        assert (got["status"], got["status_reason_code"]) == (
            "cancelled", "run.cancelled.dependency_failed")
        assert got["ended_at"] == t + 3
    assert a in (await row(rdb, b))["error_detail"]
    assert b in (await row(rdb, c))["error_detail"]
    assert [f["status"] for f in await facts(rdb, d)] == ["waiting_dependency", "cancelled"]
    await assert_clean(rdb)


async def test_dependencies_already_ended_at_submission(rdb: StateDB) -> None:
    t = 1000.0
    a = await submit_task(rdb, task(), now=t)
    bad = await submit_task(rdb, task(), now=t)
    claimed = {r["id"]: r for r in (await claim_runs(rdb, worker_id="w", now=t)).claimed}
    await execute_once(rdb, claimed[a], 0, worker="w", now=t)
    assert await cancel_task(rdb, bad, actor=OPERATOR, now=t)
    released = await submit_task(rdb, task(depends_on=[a]), now=t + 1)
    doomed = await submit_task(rdb, task(depends_on=[a, bad]), now=t + 1)
    assert [(f["status"], f["reason_code"]) for f in await facts(rdb, released)] == [
        ("waiting_dependency", "run.waiting_dependency.submitted"),
        ("queued", "run.queued.dependencies_met")]
    assert [(f["status"], f["reason_code"]) for f in await facts(rdb, doomed)] == [
        ("waiting_dependency", "run.waiting_dependency.submitted"),
        ("cancelled", "run.cancelled.dependency_failed")]
    await assert_clean(rdb)


async def test_cancelling_a_dependency_cancels_its_dependents(rdb: StateDB) -> None:
    a = await submit_task(rdb, task())
    b = await submit_task(rdb, task(depends_on=[a]))
    c = await submit_task(rdb, task(depends_on=[b]))
    assert await cancel_task(rdb, a, actor=OPERATOR)
    assert [await status(rdb, x) for x in (b, c)] == ["cancelled", "cancelled"]
    await assert_clean(rdb)


async def test_a_chain_runs_in_order_through_the_worker(rdb: StateDB, lock_dir: Path) -> None:
    rec = Recorder()
    w = make_worker(rdb, lock_dir, capacity=4, execute=rec)
    async with serving(w):
        a = await submit_task(rdb, task(sleep=0.05))
        b = await submit_task(rdb, task(sleep=0.05, depends_on=[a]))
        c = await submit_task(rdb, task(sleep=0.05, depends_on=[b]))
        d = await submit_task(rdb, task(depends_on=[a, c]))
        await wait_status(rdb, d, "completed", timeout=20)
    assert rec.calls == [a, b, c, d]
    spans = {rid: (s, e) for rid, _, s, e in rec.intervals}
    assert spans[a][1] <= spans[b][0] and spans[b][1] <= spans[c][0]
    await assert_clean(rdb)


async def test_retry_wait_does_not_release_or_cancel_dependents(rdb: StateDB) -> None:
    t = 1000.0
    a = await submit_task(rdb, task(retry=RetryPolicy(2, base_delay=1, jitter=0)), now=t)
    b = await submit_task(rdb, task(depends_on=[a]), now=t)
    run = await claim_one(rdb, "w", t)
    assert await execute_once(rdb, run, 1, worker="w", now=t + 1) == "retry_wait"
    assert await status(rdb, b) == "waiting_dependency"
    await promote_due(rdb, now=t + 5)
    run = await claim_one(rdb, "w", t + 6)
    assert await execute_once(rdb, run, 0, worker="w", now=t + 7) == "completed"
    assert await status(rdb, b) == "queued"
    await assert_clean(rdb)


# ---------------------------------------------------------------- 8. the authorize hook


@pytest.mark.parametrize(("verdict", "named"), [
    (False, "denied by authorize hook"), ("tenant over quota", "tenant over quota"),
    ("", "denied by authorize hook"), (None, "denied by authorize hook")])
async def test_a_denial_fails_the_run_without_running_it(rdb: StateDB, lock_dir: Path,
                                                         verdict: Any, named: str) -> None:
    rec = Recorder()
    seen: list[dict[str, Any]] = []

    def authorize(r: dict[str, Any]) -> Any:
        seen.append(r)
        return verdict

    w = make_worker(rdb, lock_dir, execute=rec, authorize=authorize)
    async with serving(w):
        rid = await submit_task(rdb, task())
        await wait_status(rdb, rid, "failed")
    got = await row(rdb, rid)
    assert got["status_reason_code"] == "run.failed.unauthorized"
    assert named in got["error_detail"] and "unauthorized" in got["error_detail"]
    assert rec.calls == []
    assert seen[0]["id"] == rid and seen[0]["action_args"] == {"op": "ok", "sleep": 0.0}
    await assert_clean(rdb)


async def test_an_approval_runs(rdb: StateDB, lock_dir: Path) -> None:
    rec = Recorder()

    async def authorize(r: dict[str, Any]) -> bool:  # awaitable hooks are awaited
        await asyncio.sleep(0)
        return True

    w = make_worker(rdb, lock_dir, execute=rec, authorize=authorize)
    async with serving(w):
        rid = await submit_task(rdb, task())
        await wait_status(rdb, rid, "completed")
    assert rec.calls == [rid]


async def test_capabilities_route_but_never_authorize(rdb: StateDB, lock_dir: Path) -> None:
    rec = Recorder()

    def authorize(r: dict[str, Any]) -> bool | str:
        if "deploy-prod" in r["required_capabilities"]:
            return "deploy-prod needs a human"
        return True

    w = make_worker(rdb, lock_dir, execute=rec, authorize=authorize,
                    advertised_capabilities=["deploy-prod"])
    async with serving(w):
        denied = await submit_task(rdb, task(required_capabilities=["deploy-prod"]))
        allowed = await submit_task(rdb, task())
        await wait_status(rdb, denied, "failed")
        await wait_status(rdb, allowed, "completed")
    got = await row(rdb, denied)
    assert got["status_reason_code"] == "run.failed.unauthorized"
    assert "deploy-prod needs a human" in got["error_detail"]
    assert rec.calls == [allowed]


async def test_a_raising_hook_denies(rdb: StateDB, lock_dir: Path) -> None:
    """A hook that raises fails closed: the row ends unauthorized, it is not left running."""
    rec = Recorder()

    def authorize(r: dict[str, Any]) -> bool:
        raise PermissionError("policy service unreachable")

    w = make_worker(rdb, lock_dir, execute=rec, authorize=authorize)
    async with serving(w):
        rid = await submit_task(rdb, task())
        await wait_status(rdb, rid, "failed", timeout=5)
    got = await row(rdb, rid)
    assert got["status_reason_code"] == "run.failed.unauthorized"
    assert "policy service unreachable" in got["error_detail"]
    assert rec.calls == []
    await assert_clean(rdb)


# ---------------------------------------------------------------- 9. adapters


async def test_workflow_without_adapter_stays_queued_and_unleased(rdb: StateDB,
                                                                  lock_dir: Path) -> None:
    rec = Recorder()
    w = make_worker(rdb, lock_dir, execute=rec)
    async with serving(w):
        wf = await submit_task(rdb, TaskApplication("workflow", {"name": "nightly"}, "host"))
        other = await submit_task(rdb, task())
        await wait_status(rdb, other, "completed")
        await asyncio.sleep(0.5)  # several passes
    got = await row(rdb, wf)
    assert (got["status"], got["leased_by"], got["lease_attempts"]) == ("queued", None, 0)
    assert len(await facts(rdb, wf)) == 1
    assert rec.calls == [other]
    got_pass = await claim_runs(rdb, worker_id="plain")  # the plain claim skips it too
    assert got_pass.claimed == []


async def test_workflow_runs_through_its_adapter(rdb: StateDB, lock_dir: Path) -> None:
    seen: list[dict[str, Any]] = []

    async def workflow(run: dict[str, Any]) -> tuple[int, str]:
        seen.append(run)
        return (0, "") if run["action_args"]["name"] == "good" else (3, "step 2 failed")

    rec = Recorder()
    w = make_worker(rdb, lock_dir, execute=rec, adapters={"workflow": workflow})
    async with serving(w):
        good = await submit_task(rdb, TaskApplication("workflow", {"name": "good"}, "host"))
        bad = await submit_task(rdb, TaskApplication("workflow", {"name": "bad"}, "host"))
        await wait_status(rdb, good, "completed")
        await wait_status(rdb, bad, "failed")
    assert sorted(r["id"] for r in seen) == sorted([good, bad])
    got = await row(rdb, bad)
    assert (got["exit_code"], got["error_detail"]) == (3, "step 2 failed")
    assert rec.calls == []
    await assert_clean(rdb)


async def test_an_adapter_overrides_the_executor_for_its_kind(rdb: StateDB,
                                                              lock_dir: Path) -> None:
    used: list[str] = []

    async def command_adapter(run: dict[str, Any]) -> tuple[int, str]:
        used.append(run["id"])
        return 0, ""

    rec = Recorder()
    w = make_worker(rdb, lock_dir, execute=rec, adapters={"command": command_adapter})
    async with serving(w):
        c = await submit_task(rdb, cmd(["false"]))  # would fail if the default ran it
        a = await submit_task(rdb, task())
        await wait_status(rdb, c, "completed")
        await wait_status(rdb, a, "completed")
    assert used == [c]
    assert rec.calls == [a]
