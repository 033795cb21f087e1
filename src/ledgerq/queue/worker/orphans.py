"""What a SIGKILLed worker leaves behind, found and killed by the next worker on the host.

``PR_SET_PDEATHSIG`` kills a run's leader when its worker dies, but not the leader's
descendants: ``sh -c 'sleep 60 & …'`` leaves ``sleep`` running beside the re-run. Every
run is its own process group, so each group a worker starts is recorded in a
host-local directory (``<lock_dir>/groups``; by the child itself, before its command
runs) while the worker holds an ``flock`` that marks it alive; a worker starting later
kills the recorded groups of every owner whose lock is free (the kernel drops an flock
with its process, however it died).

Not guaranteed: a descendant that leaves the group (``setsid``, a daemon) is beyond
this, and so is anything that runs between the worker's death and the next worker's
start on the same host and lock directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
from pathlib import Path


class GroupLedger:
    """The process groups this process's runs own, recorded as files, one per group."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.owner = os.getpid()
        self._lock_fd = os.open(directory / f"{self.owner}.owner",
                                os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)

    def record(self, pgid: int) -> None:
        (self.directory / f"{self.owner}.{pgid}").touch()

    def forget(self, pgid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"{self.owner}.{pgid}").unlink()


def _group_members(pgid: int) -> bool:
    """Whether any live process is in group ``pgid`` (a recorded group may be long gone)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the parenthesised command: state, ppid, pgrp, ...
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def kill_orphans(directory: Path) -> list[int]:
    """Kill the recorded groups of every dead owner under ``directory``; returns them."""
    killed: list[int] = []
    if not directory.is_dir():
        return killed
    for owner_file in directory.glob("*.owner"):
        fd = os.open(owner_file, os.O_RDWR | os.O_CLOEXEC)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live worker: its runs are its own
            owner = owner_file.stem
            for group_file in directory.glob(f"{owner}.*"):
                suffix = group_file.name.split(".", 1)[1]
                if suffix.isdigit():
                    pgid = int(suffix)
                    if _group_members(pgid):
                        with contextlib.suppress(ProcessLookupError, PermissionError):
                            os.killpg(pgid, signal.SIGKILL)
                            killed.append(pgid)
                    group_file.unlink(missing_ok=True)
            owner_file.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return killed


_ledger: GroupLedger | None = None


def use_ledger(directory: Path) -> list[int]:
    """Kill what dead workers left under ``directory``, then record this process's runs
    there (the first call per process decides the directory)."""
    global _ledger
    killed = kill_orphans(directory)
    if _ledger is None:
        _ledger = GroupLedger(directory)
    return killed


def current() -> GroupLedger | None:
    return _ledger
