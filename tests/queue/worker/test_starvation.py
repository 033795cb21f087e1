"""A worker out of a resource gives runs back instead of failing them, pauses its
claims, and refuses a capacity its open-file limit cannot hold."""

from __future__ import annotations

import errno
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, claim_and_execute, submit_task
from ledgerq.queue.worker.starvation import GIVE_BACKS, ClaimPause, check_file_limit

APP = TaskApplication("agent", {"prompt": "p"}, "host")


async def codes(db: StateDB, rid: str) -> list[str]:
    rows = await db.fetch_all("SELECT reason_code FROM status_transitions WHERE entity_id = ? "
                              "ORDER BY entity_version", (rid,))
    return [r["reason_code"] for r in rows]


async def test_a_run_its_worker_cannot_start_goes_back_uncounted(db: StateDB) -> None:
    rid = await submit_task(db, APP)
    tries = 0

    async def execute(run: dict[str, Any]) -> tuple[int, str]:
        nonlocal tries
        tries += 1
        if tries <= 2:
            raise OSError(errno.EMFILE, "Too many open files")
        return 0, ""

    for _ in range(3):
        await claim_and_execute(db, worker_id="w", execute=execute)
    row = await db.fetch_one("SELECT status, run_attempts FROM schedule_runs WHERE id = ?",
                             (rid,))
    assert row is not None and (row["status"], row["run_attempts"]) == ("completed", 1)
    assert await codes(db, rid) == [
        "run.queued.submitted", "run.started.ok", "run.queued.worker_starved",
        "run.started.ok", "run.queued.worker_starved", "run.started.ok", "run.completed.ok"]
    assert (await verify(db)).ok


async def test_a_run_that_starves_every_worker_fails_after_a_few_claims(db: StateDB) -> None:
    rid = await submit_task(db, APP)

    async def execute(run: dict[str, Any]) -> tuple[int, str]:
        raise MemoryError()

    for _ in range(GIVE_BACKS + 2):
        await claim_and_execute(db, worker_id="w", execute=execute)
    row = await db.fetch_one("SELECT status, error_detail FROM schedule_runs WHERE id = ?",
                             (rid,))
    assert row is not None and row["status"] == "failed"
    assert f"given back {GIVE_BACKS} times in a row; failed" in row["error_detail"]
    assert (await codes(db, rid)).count("run.queued.worker_starved") == GIVE_BACKS - 1


def test_claims_pause_longer_while_starved_and_resume_when_fed() -> None:
    pause = ClaimPause()
    assert not pause.paused()
    pause.starved()
    first = pause.pause
    pause.starved()
    assert pause.paused() and pause.pause == 2 * first
    pause.fed()
    assert pause.pause == 0


def test_a_capacity_the_file_limit_cannot_hold_is_refused(tmp_path: Path) -> None:
    """In a child whose soft and hard limits are 256 files: capacity 10,000 is refused
    naming both numbers; 40 fits."""
    script = textwrap.dedent("""
        import asyncio, resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
        from ledgerq import StateDB
        from ledgerq.queue import Worker
        async def main():
            async with StateDB(sys.argv[1]) as db:
                Worker(db, capacity=40, lock_dir=None)
                Worker(db, capacity=10000, lock_dir=None)
        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "f.db")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "capacity 10000 needs about 40,064 open files" in done.stderr
    assert "may open 256" in done.stderr and "lower capacity to 48" in done.stderr


def test_check_file_limit_raises_the_soft_limit_when_the_hard_one_allows() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096 + 64:
        pytest.skip("the hard limit is too low to raise toward")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        check_file_limit(1000)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] >= 1000 * 4 + 64
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_worker_out_of_file_descriptors_gives_a_command_back(tmp_path: Path) -> None:
    """A real launcher in a process that has used up its file limit: the command run
    goes back to the queue (not failed); with descriptors free again it completes."""
    script = textwrap.dedent("""
        import asyncio, os, resource, sys
        from ledgerq import StateDB
        from ledgerq.queue import TaskApplication, claim_and_execute, submit_task
        async def main():
            async with StateDB(sys.argv[1]) as db:
                rid = await submit_task(db, TaskApplication("command", {"argv": ["true"]},
                                                            "host"))
                resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))
                hog = []
                try:
                    while True:
                        hog.append(os.open(os.devnull, os.O_RDONLY))
                except OSError:
                    pass
                await claim_and_execute(db, worker_id="w")
                for fd in hog:
                    os.close(fd)
                row = await db.fetch_one("SELECT status FROM schedule_runs WHERE id = ?",
                                         (rid,))
                print("after-starved", row["status"])
                await claim_and_execute(db, worker_id="w")
                row = await db.fetch_one("SELECT status, run_attempts FROM schedule_runs "
                                         "WHERE id = ?", (rid,))
                print("after-fed", row["status"], row["run_attempts"])
        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "e.db")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "after-starved queued" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "after-fed completed 1" in done.stdout
