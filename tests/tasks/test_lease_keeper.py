"""A task that blocks its worker's event loop keeps its lease: the lease keeper renews it
from a thread of its own, so the run is not reaped and run again by another worker, and
the worker names the task that blocked the loop and for how long.

Real worker processes on both backends: one runs an ``async def`` task that calls
``time.sleep`` (the loop stops for seconds, far past a 1.5 s lease), another reaps
expired leases meanwhile.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from ledgerq import StateDB
from ledgerq.queue import get_run

TASKS = '''
import os
import time

from ledgerq import App

app = App(os.environ["LEDGERQ_DB"])


@app.task(name="blocking.crunch")
async def crunch(seconds: float) -> str:
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write("ran\\n")
    time.sleep(seconds)  # blocks the worker's event loop: never do this in an async task
    return "done"
'''


def worker(tmp_path: Path, db: str, name: str) -> subprocess.Popen[str]:
    env = {**os.environ, "LEDGERQ_DB": db, "RAN_LOG": str(tmp_path / "ran.log"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-m", "ledgerq", "worker", "--app", "blocking_tasks:app",
         "--db", db, "--lease-ttl", "1.5", "--poll-interval", "0.1", "--worker-id", name,
         "--lock-dir", str(tmp_path / "locks")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_a_task_blocking_the_loop_keeps_its_lease_and_is_named(db_target: str,
                                                                      tmp_path: Path) -> None:
    (tmp_path / "blocking_tasks.py").write_text(TASKS, encoding="utf-8")
    first = worker(tmp_path, db_target, "w-blocked")  # records the task as it opens
    try:
        deadline = time.monotonic() + 60
        while True:
            submitted = subprocess.run(
                [sys.executable, "-m", "ledgerq", "submit", "blocking.crunch", "--arg",
                 "seconds=6", "--db", db_target], capture_output=True, text=True,
                timeout=60, check=False)
            if submitted.returncode == 0:
                break
            if first.poll() is not None:
                raise AssertionError(f"the worker exited: {first.communicate()}")
            assert time.monotonic() < deadline, submitted.stderr
            time.sleep(0.2)
        run_id = submitted.stdout.strip()
        while not (tmp_path / "ran.log").exists():
            assert time.monotonic() < deadline, "the first worker never started the run"
            time.sleep(0.05)
        reaper = worker(tmp_path, db_target, "w-reaper")  # reaps expired leases
        try:
            async with StateDB(db_target) as reader:
                while (ended := await get_run(reader, run_id)
                       )["status"] not in ("completed", "failed"):
                    assert time.monotonic() < deadline, "the run never ended"
                    time.sleep(0.2)
        finally:
            reaper.terminate()
            reaper.communicate(timeout=30)
    finally:
        first.terminate()
        _, errors = first.communicate(timeout=30)
    assert ended["status"] == "completed", ended
    assert (tmp_path / "ran.log").read_text().count("ran") == 1  # run once, not again
    assert re.search(r"task blocking\.crunch \(run \S+\) blocked the event loop for "
                     r"[56]\.\d\ds", errors), errors


async def test_the_keeper_renews_a_held_lease_and_reports_one_taken_from_it(
        db_target: str) -> None:
    """In-process: the keeper renews a held run's lease (the supervisor's own lease dict
    moves with it); once another worker's claim has replaced the lease, its renewal is
    refused and the run is reported lost; a released run is renewed no more."""
    import asyncio

    from ledgerq.queue.runs import run_policy
    from ledgerq.queue.worker.keeper import LeaseKeeper
    from lifecycle_support import new_run

    async with StateDB(db_target) as db:
        policy = run_policy(db)
        now = time.time()
        lease = {"leased_by": "w1", "lease_token": "t1", "lease_expires_at": now + 0.3}
        rid = await new_run(db, "queued")
        await db.write(lambda tx: tx.update_entity(
            policy, rid, observed="queued", version=None, to_state="running",
            changes=dict(lease), guards={}, returning=None))
        twin = db.twin()
        assert twin is not None
        keeper = LeaseKeeper(twin, policy, worker_id="w1", lease_ttl=0.9, interval=0.05,
                             owned=twin is not db)
        keeper.start()
        try:
            held = dict(lease)
            keeper.hold(rid, held)
            deadline = time.monotonic() + 20
            while keeper.renewals < 2:
                assert time.monotonic() < deadline, "no renewal"
                await asyncio.sleep(0.05)
            row = await get_run(db, rid)
            assert row["lease_expires_at"] >= held["lease_expires_at"] > now + 0.3
            await db.write(lambda tx: tx.update_entity(  # another worker's claim
                policy, rid, observed="running", version=None, to_state=None,
                changes={"leased_by": "w2", "lease_token": "t2"}, guards={}, returning=None))
            while keeper.lost(rid) is None:
                assert time.monotonic() < deadline, "the taken lease was never noticed"
                await asyncio.sleep(0.05)
            assert keeper.lost(rid) == "renewal conflicted"
            await keeper.release([rid])
            assert keeper.lost(rid) is None
        finally:
            await keeper.stop()
