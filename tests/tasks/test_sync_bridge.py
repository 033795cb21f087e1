"""Synchronous code calling the async library through one background loop: real threads
submitting at once through one handle, the refusal inside a running loop, timeouts."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, submit_task
from ledgerq.tasks.bridge import LoopThread, SyncCallInEventLoop

APP = TaskApplication("command", {"argv": ["true"]}, "host")


def test_threads_share_one_loop_and_one_handle(tmp_path: Path) -> None:
    bridge = LoopThread()
    db = StateDB(str(tmp_path / "sync.db"))
    bridge.run(db.open(), what="open")
    ids: list[str] = []
    lock = threading.Lock()

    def submitter() -> None:
        for _ in range(20):
            run_id = bridge.run(submit_task(db, APP), what="submit")
            with lock:
                ids.append(run_id)

    threads = [threading.Thread(target=submitter) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 160
    assert bridge.run(verify(db), what="verify").ok
    bridge.run(db.close(), what="close")
    loop_thread = bridge._thread
    bridge.close()
    assert loop_thread is not None and not loop_thread.is_alive()


def test_a_sync_call_inside_a_running_loop_is_refused() -> None:
    bridge = LoopThread()

    async def inside() -> None:
        with pytest.raises(SyncCallInEventLoop, match="await"):
            bridge.run(asyncio.sleep(0), what="TaskRun.result()")

    asyncio.run(inside())
    bridge.close()


def test_a_sync_call_times_out() -> None:
    bridge = LoopThread()
    with pytest.raises(TimeoutError, match=r"slow\(\) did not finish"):
        bridge.run(asyncio.sleep(10), what="slow()", timeout=0.05)
    assert bridge.run(asyncio.sleep(0, result=7), what="fast()") == 7  # still serving
    bridge.close()


def test_exceptions_reach_the_caller() -> None:
    bridge = LoopThread()

    async def boom() -> None:
        raise LookupError("no such run")

    with pytest.raises(LookupError, match="no such run"):
        bridge.run(boom(), what="boom()")
    bridge.close()
