"""A SIGKILLed worker takes its child with it, so a reaped run never runs twice at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

CHILD = r"""
import asyncio, sys
from ledgerq.queue.worker.launcher import run_argv
asyncio.run(run_argv(["sh", "-c", "echo $$ > " + sys.argv[1] + "; exec sleep 60"]))
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie is dead; PID 1 here may not reap orphans


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_child_dies_when_its_worker_is_sigkilled(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    worker = subprocess.Popen([sys.executable, "-c", CHILD, str(pidfile)])
    deadline = time.monotonic() + 20
    while not (pidfile.exists() and pidfile.read_text().strip()):
        assert time.monotonic() < deadline, "child never started"
        time.sleep(0.02)
    child = int(pidfile.read_text())
    assert _alive(child)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait()
    deadline = time.monotonic() + 5
    while _alive(child):
        assert time.monotonic() < deadline, f"child {child} outlived its SIGKILLed worker"
        time.sleep(0.02)


RECORDS = r"""
import asyncio, os, sys
from pathlib import Path
from ledgerq.queue.worker import orphans
from ledgerq.queue.worker.launcher import run_argv
groups = Path(sys.argv[1])
orphans.use_ledger(groups)
# The command's first act lists the ledger: its group must be recorded before it runs.
code, out, err = asyncio.run(run_argv(["sh", "-c", f"echo $$; ls {groups}"]))
pid, *names = out.split()
print(f"{os.getpid()}.{pid}" in names)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups via /proc")
def test_a_runs_group_is_recorded_before_its_command_runs(tmp_path: Path) -> None:
    """A worker SIGKILLed the instant its command started has left a record of the
    command's group (written by the child before exec), so the next worker kills what
    the command forked, however soon the first died."""
    for _ in range(5):  # a race the recording lost would show within a few tries
        done = subprocess.run([sys.executable, "-c", RECORDS, str(tmp_path / "groups")],
                              capture_output=True, text=True, timeout=60, check=True)
        assert done.stdout.strip() == "True", (done.stdout, done.stderr)
