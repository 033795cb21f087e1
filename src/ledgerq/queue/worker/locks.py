"""An authoritative machine-local lock per concurrency key: one ``flock`` file per key.

The queue's concurrency key only keeps queue claims apart; a GPU or a checkout is also
used by programs outside the queue. Any of them can take the same lock with
``flock <lock_dir>/<key>.lock <command>``.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def lock_path(lock_dir: Path, key: str) -> Path:
    return lock_dir / (_UNSAFE.sub("_", key) + ".lock")


class KeyLock:
    """An exclusive, non-blocking flock on the key's file; released on every exit path."""

    def __init__(self, lock_dir: Path, key: str) -> None:
        self.path = lock_path(lock_dir, key)
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
