"""A run is its leader's process and everything left in its process group (issue 16 item 13)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from ledgerq.queue.launcher import run_argv

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def _wait_dead(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, f"{pid} outlived its run"
        time.sleep(0.02)


FORKER = """
import os, sys, time
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
open(sys.argv[1], "w").write(str(pid))
print("leader done")
sys.exit(3)
"""


async def test_a_forked_helper_neither_holds_the_run_open_nor_outlives_it(tmp_path: Path
                                                                          ) -> None:
    pidfile = tmp_path / "helper.pid"
    started = time.monotonic()
    code, out, _ = await run_argv([sys.executable, "-c", FORKER, str(pidfile)])
    # Bounded, not timed: the helper sleeps 60 s, the wait below allows 30.
    assert time.monotonic() - started < 30
    assert (code, out) == (3, "leader done\n")
    _wait_dead(int(pidfile.read_text()))


async def test_a_shell_background_job_is_killed_with_its_run(tmp_path: Path) -> None:
    pidfile = tmp_path / "job.pid"
    code, out, _ = await run_argv(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; echo hi"])
    assert (code, out) == (0, "hi\n")
    _wait_dead(int(pidfile.read_text()))


async def test_no_descriptor_leaks_across_runs() -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        await run_argv(["true"])
    assert len(os.listdir("/proc/self/fd")) <= before + 2
