"""A run is its leader's process and everything left in its process group."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from ledgerq.queue.worker.launcher import run_argv

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


def _ledgerq() -> list[str]:
    return [sys.executable, "-m", "ledgerq"]


def test_the_next_worker_kills_what_a_sigkilled_worker_left(tmp_path: Path) -> None:
    """sh dies with its worker (PDEATHSIG); its background sleep is killed by the next
    worker on the host, found through the recorded process group."""
    import signal
    import subprocess

    db = tmp_path / "q.db"
    locks = tmp_path / "locks"
    pidfile = tmp_path / "job.pid"
    script = f"sleep 60 & echo $! > {pidfile}; sleep 60"
    subprocess.run([*_ledgerq(), "--db", str(db), "submit", "command", "--", "sh", "-c",
                    script], check=True, capture_output=True, timeout=60)
    worker_cmd = [*_ledgerq(), "--db", str(db), "worker", "--lock-dir", str(locks),
                  "--poll-interval", "0.05"]
    first = subprocess.Popen(worker_cmd, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.02)
        job = int(pidfile.read_text())
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        time.sleep(0.3)
        assert _alive(job), "the background job should outlive the SIGKILLed worker"
    finally:
        if first.poll() is None:
            first.kill()
    second = subprocess.Popen(worker_cmd, stderr=subprocess.DEVNULL)
    try:
        _wait_dead(job)
    finally:
        second.send_signal(signal.SIGTERM)
        try:
            second.wait(timeout=30)
        except subprocess.TimeoutExpired:
            second.kill()
