"""Behind PgBouncer in transaction mode: wake-ups, and a real worker process.

A transaction pooler hands each transaction whatever server connection is free, so a
``LISTEN`` sent through it holds nothing: its notifications reach whichever client has
that server connection next. A pooled handle therefore listens on the server's own URL
(``listen_url``), or, without one, does not listen at all and says so once; its waits
poll. (The store contract suite runs through the pooler too:
tests/store/test_store_contract.py.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import pgbouncer
from ledgerq import StateDB
from ledgerq.errors import InvalidInput
from ledgerq.queue import TaskApplication, submit_task

LEDGERQ = str(Path(sys.executable).with_name("ledgerq"))


async def test_listen_goes_to_the_server_a_listen_url_names(bouncer_target: str) -> None:
    woken = threading.Event()
    async with StateDB(bouncer_target, listen_url=pgbouncer.direct_url(bouncer_target)) as a, \
            StateDB(bouncer_target, pooled=True) as b:
        assert a.pooled and a.listen_url is not None
        await a.listen(woken.set)
        await asyncio.sleep(0.5)  # (the listener connects, and wakes once on connecting)
        woken.clear()
        await submit_task(b, TaskApplication("agent", {"n": 1}, "host"))
        assert await asyncio.to_thread(woken.wait, 10), "the submit's NOTIFY was not heard"
        await a.unlisten(woken.set)


async def test_pooled_without_a_listen_url_polls_and_says_so_once(
        bouncer_target: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ledgerq.postgres")
    async with StateDB(bouncer_target, pooled=True) as db:
        await db.listen(lambda: None)
        await db.listen(lambda: None, channel="ended")
        said = [r.getMessage() for r in caplog.records if "no LISTEN" in r.getMessage()]
        assert len(said) == 1, said
        assert db._backend._listen_thread is None  # type: ignore[attr-defined]
        await db.unlisten()


def test_pooled_options_are_postgresqls(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="pooled and listen_url are PostgreSQL's"):
        StateDB(tmp_path / "s.db", pooled=True)
    with pytest.raises(InvalidInput, match="listen_url must be a postgresql:// URL"):
        StateDB("postgresql://u@h/d", listen_url="h:5432")


def test_a_worker_behind_the_pooler_runs_what_another_process_submits(
        bouncer_target: str, tmp_path: Path) -> None:
    """``ledgerq`` through the pooler, configured by the environment a fleet would set:
    one process submits, a worker (polling: no listen URL) runs them and exits."""
    env = {**os.environ, "LEDGERQ_DB": bouncer_target, "LEDGERQ_POOLED": "1"}
    marker = tmp_path / "ran"
    for i in range(3):
        done = subprocess.run([LEDGERQ, "submit", "command", "--", "sh", "-c",
                               f"echo {i} >> {marker}"], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
    worker = subprocess.run([LEDGERQ, "worker", "--max-tasks", "3", "--poll-interval", "0.1",
                             "--no-scheduler"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert worker.returncode == 0, worker.stderr
    assert sorted(marker.read_text().split()) == ["0", "1", "2"]
    assert worker.stderr.count("no LISTEN") == 1, worker.stderr
    listed = subprocess.run([LEDGERQ, "ls", "--status", "completed", "--json"], env=env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count('"completed"') >= 3


def test_an_app_behind_the_pooler_defers_and_waits_for_a_result(bouncer_target: str) -> None:
    """The task face takes the same two options."""
    from ledgerq import App

    app = App(bouncer_target, listen_url=pgbouncer.direct_url(bouncer_target))

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    try:
        run = add.defer(2, 3)
        app.drain_sync()
        assert run.result(timeout=10) == 5
        assert app.db.pooled
    finally:
        app.close_sync()
