"""Knowing when a SQLite file is damaged, and when it is worth checking.

``PRAGMA quick_check`` reads every page (about 2 ms per MB here), too slow to run on
every open of a large file. It is run when the previous writer did not close cleanly,
which is when damage is likeliest: every ledgerq write handle holds a shared ``flock``
on a sidecar file for its whole life; a handle that gets the lock exclusively is the
only writer, and if it still finds a non-empty ``-wal`` file, the last writer died
without its final checkpoint (a clean close of the last connection removes the WAL).
``flock`` locks vanish with their process, so a SIGKILLed writer leaves no stale lock.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3

#: SQLite's primary result codes for a file that is not (or no longer) a database.
SQLITE_CORRUPT = 11
SQLITE_NOTADB = 26
#: Findings quick_check reports at most (it stops there; one is enough to refuse).
MAX_FINDINGS = 20


#: Python's sqlite3 says this of a text cell that is not UTF-8: ledgerq writes only UTF-8,
#: so the cell was damaged or written by something else.
NOT_UTF8 = "Could not decode to UTF-8"


def is_damage(exc: sqlite3.DatabaseError) -> bool:
    if NOT_UTF8 in str(exc):
        return True
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (SQLITE_CORRUPT, SQLITE_NOTADB)
    text = str(exc)
    return "malformed" in text or "not a database" in text


def quick_check(conn: sqlite3.Connection) -> list[str]:
    """The findings of ``PRAGMA quick_check``: [] for a sound file."""
    try:
        rows = conn.execute(f"PRAGMA quick_check({MAX_FINDINGS})").fetchall()
    except sqlite3.DatabaseError as exc:
        if is_damage(exc):
            return [str(exc)]
        raise
    findings = [str(r[0]) for r in rows]
    return [] if findings == ["ok"] else findings


class WriterLock:
    """A shared flock held by one write handle for its lifetime; see the module doc."""

    def __init__(self, db_path: str) -> None:
        self.unclean = False
        self._fd: int | None = None
        try:
            fd = os.open(db_path + "-ledgerq.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError:
            # No lock file possible (say, a read-only directory): SQLite will refuse the
            # write open itself; there is nothing to learn about a crash here.
            return
        self._fd = fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another live writer: it checked (or was checked) when it opened
        else:
            try:
                self.unclean = os.path.getsize(db_path + "-wal") > 0
            except OSError:
                self.unclean = False
        # Downgrading (or waiting for the exclusive holder to downgrade) keeps it shared.
        fcntl.flock(fd, fcntl.LOCK_SH)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
