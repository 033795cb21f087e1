"""The archive file ``ledgerq archive`` writes: a SQLite file of runs and their facts.

Why SQLite and not JSON Lines: an archived run is looked up by id (``ledgerq show
--archive FILE ID``), which a primary key answers without reading the file through, and
an operator can query it with any SQLite tool. It holds the run table under its own name
with the live table's columns, ``status_transitions`` with the log's columns, and a
``ledgerq_archive`` manifest (key, value): what wrote it, from which spec, before when,
how many runs and facts, and a hash of the ids (which the database's own record of the
archive repeats, so the two can be matched).

The file is written under a temporary name, fsynced, and only then renamed into place
(:func:`publish`): a file under the final name is always complete. This module is the
only code that touches a file's bytes; what goes in it is decided by
:mod:`ledgerq.queue.maintenance.archive`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import operator
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from ledgerq.errors import DatabaseError, InvalidInput, NotFound
from ledgerq.lifecycle.identifiers import identifier_problem, quote
from ledgerq.lifecycle.store import FACT_COLUMNS
from ledgerq.store.sqlite.schema import SQLITE_TYPES

#: The manifest's ``format`` value: what tells a ledgerq archive from any SQLite file.
FORMAT = "ledgerq-archive"
FORMAT_VERSION = "1"
MANIFEST = "ledgerq_archive"
FACTS = "status_transitions"
#: Rows per executemany call while copying (bounded memory whatever the batch).
BATCH = 5000
#: The archive file's page cache while it is written (KiB).
CACHE_KIB = 65536
#: Shortest id piece :meth:`ArchiveFile.resolve` accepts (as ``ledgerq show``).
MIN_PIECE = 4


#: How long one statement on an archive file may run (a crafted file must not hang
#: `show --archive`); SQLite's progress handler looks every PROGRESS_STEPS steps.
READ_SECONDS = 10.0
PROGRESS_STEPS = 10_000


class ArchiveFileError(DatabaseError):
    """The archive file could not be written (nothing was archived: the runs stay live)."""


class NotAnArchive(InvalidInput):
    """The file is missing, is not SQLite, or has no ledgerq archive manifest."""


def partial_path(path: Path) -> Path:
    """Where the file is written before it is complete (renamed by :func:`publish`)."""
    return path.with_name(path.name + ".partial")


def ids_digest(ids: Iterable[str]) -> str:
    """sha256 of the ids in order, one per line: the manifest and the database's record
    of one archive carry the same value."""
    h = hashlib.sha256()
    for i in ids:
        h.update(i.encode("utf-8") + b"\n")
    return h.hexdigest()


def write(path: Path, manifest: Mapping[str, Any], table: str, columns: Mapping[str, str],
          rows: Iterator[dict[str, Any]], facts: Iterator[dict[str, Any]]
          ) -> tuple[int, int, str]:
    """Write the archive at ``partial_path(path)`` and fsync it: (runs, facts, ids digest).

    ``columns`` are the run table's (name -> logical type, as its spec declares them);
    a row with a column not among them gets it untyped (a newer release's column). The
    manifest gets ``runs``, ``facts`` and ``ids_sha256`` as counted here, last: a file
    without them was cut off.
    """
    tmp = partial_path(path)
    try:
        return _write(tmp, manifest, table, columns, rows, facts)
    except (sqlite3.Error, OSError) as exc:
        # The archive file's failure, not the live database's (a read-only or full file
        # system, a directory such as /proc that takes no file): named as such.
        raise ArchiveFileError(f"cannot write the archive {tmp}: "
                               f"{getattr(exc, 'strerror', None) or exc}") from exc


def _write(tmp: Path, manifest: Mapping[str, Any], table: str, columns: Mapping[str, str],
           rows: Iterator[dict[str, Any]], facts: Iterator[dict[str, Any]]
           ) -> tuple[int, int, str]:
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        # One transaction, no journal: the file is worthless until publish() renames it.
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        # The primary keys are built as rows arrive; a small cache spills their pages.
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        conn.execute("BEGIN")
        conn.execute(f"CREATE TABLE {MANIFEST} (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        first = next(rows, None)
        names = list(first) if first is not None else list(columns)
        types = {c: SQLITE_TYPES.get(t, "") for c, t in columns.items()}
        decls = [f"{quote(c)} {types.get(c, '')}".rstrip() +
                 (" PRIMARY KEY" if c == "id" else "") for c in names]
        conn.execute(f"CREATE TABLE {quote(table)} ({', '.join(decls)})")
        conn.execute(f"CREATE TABLE {FACTS} ({', '.join(FACT_COLUMNS)}, "
                     "PRIMARY KEY (entity_id, entity_version))")
        ids: list[str] = []
        insert = (f"INSERT INTO {quote(table)} ({', '.join(quote(c) for c in names)}) "
                  f"VALUES ({', '.join('?' * len(names))})")
        batch: list[tuple[Any, ...]] = []
        values = operator.itemgetter(*names)  # every row has the first row's columns
        for r in itertools.chain([first] if first is not None else [], rows):
            ids.append(r["id"])
            batch.append(values(r))
            if len(batch) >= BATCH:
                conn.executemany(insert, batch)
                batch = []
        if batch:
            conn.executemany(insert, batch)
        fact_insert = (f"INSERT INTO {FACTS} ({', '.join(FACT_COLUMNS)}) "
                       f"VALUES ({', '.join('?' * len(FACT_COLUMNS))})")
        n_facts = 0
        fbatch: list[tuple[Any, ...]] = []
        fact_values = operator.itemgetter(*FACT_COLUMNS)
        for f in facts:
            fbatch.append(fact_values(f))
            if len(fbatch) >= BATCH:
                conn.executemany(fact_insert, fbatch)
                n_facts += len(fbatch)
                fbatch = []
        if fbatch:
            conn.executemany(fact_insert, fbatch)
            n_facts += len(fbatch)
        digest = ids_digest(ids)
        counted = {"runs": len(ids), "facts": n_facts, "ids_sha256": digest}
        conn.executemany(f"INSERT INTO {MANIFEST} (key, value) VALUES (?, ?)",
                         [(k, str(v)) for k, v in {"format": FORMAT,
                                                   "format_version": FORMAT_VERSION,
                                                   **manifest, **counted}.items()])
        conn.execute("COMMIT")
    finally:
        conn.close()
    _fsync(tmp)
    return len(ids), n_facts, digest


def publish(path: Path) -> None:
    """Rename the complete file into place and make the rename durable (the directory's
    fsync); refused if something appeared under the name meanwhile."""
    tmp = partial_path(path)
    if path.exists() or path.is_symlink():
        raise InvalidInput(f"{path} already exists; an archive never overwrites a file")
    try:
        os.replace(tmp, path)
        _fsync(path.parent)
    except OSError as exc:
        raise ArchiveFileError(f"cannot publish the archive {path}: "
                               f"{exc.strerror or exc}") from exc


def remove(path: Path, *, published: bool) -> None:
    """Remove the partial file, and ``path`` too once :func:`publish` put it there (an
    archive whose transaction failed): a file this archive did not write stays."""
    for p in (path, partial_path(path)) if published else (partial_path(path),):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    with contextlib.suppress(OSError):
        _fsync(path.parent)


def _fsync(path: Path) -> None:
    """fsync a file or a directory (its entries: a rename is durable once this returns)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ArchiveFile:
    """An archive file opened read-only: its manifest, and runs looked up by id."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise NotAnArchive(f"no archive file at {self.path}")
        uri = self.path.resolve().as_uri() + "?mode=ro"
        try:
            self.conn = sqlite3.connect(uri, uri=True)
            # A file handed to `show --archive` may be crafted: its schema runs no
            # function of ours, and no statement on it runs longer than READ_SECONDS.
            self.conn.execute("PRAGMA trusted_schema = OFF")
            self._deadline = time.monotonic() + READ_SECONDS
            self.conn.set_progress_handler(self._too_long, PROGRESS_STEPS)
            kinds = dict(self.conn.execute(
                "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')"))
            if kinds.get(MANIFEST) != "table":
                raise sqlite3.DatabaseError(f"no {MANIFEST} table")
            found = dict(self.conn.execute(f"SELECT key, value FROM {MANIFEST}").fetchall())
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(Exception):
                self.conn.close()
            if "interrupted" in str(exc):
                raise NotAnArchive(f"{self.path}: reading it took more than "
                                   f"{READ_SECONDS:g} s; abandoned") from None
            raise NotAnArchive(f"{self.path} is not a ledgerq archive (no "
                               f"{MANIFEST} manifest)") from None
        if found.get("format") != FORMAT or "ids_sha256" not in found:
            self.conn.close()
            raise NotAnArchive(f"{self.path} is not a complete ledgerq archive (its "
                               "manifest lacks the format or the counts)")
        self.table = found.get("table", "")
        if identifier_problem(self.table) is not None:
            self.conn.close()
            raise NotAnArchive(f"{self.path}: its manifest names no valid run table")
        for name in (self.table, FACTS):
            if kinds.get(name) != "table":
                self.conn.close()
                raise NotAnArchive(f"{self.path}: {name} is "
                                   f"{'a ' + kinds[name] if name in kinds else 'missing'}, "
                                   "not a table: not a ledgerq archive")
        self.manifest: dict[str, str] = found

    def _too_long(self) -> int:
        """SQLite's progress handler: nonzero interrupts the statement."""
        return int(time.monotonic() > self._deadline)

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        """A statement on the archive, within READ_SECONDS of the lookup's start."""
        self._deadline = time.monotonic() + READ_SECONDS
        try:
            return self.conn.execute(sql, params)
        except sqlite3.OperationalError as exc:
            if "interrupted" in str(exc):
                raise NotAnArchive(f"{self.path}: reading it took more than "
                                   f"{READ_SECONDS:g} s; abandoned") from None
            raise

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ArchiveFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def resolve(self, piece: str) -> str:
        """The full id of the one archived run whose id is, starts or ends with ``piece``."""
        table = quote(self.table)
        if self._read(f"SELECT 1 FROM {table} WHERE id = ?", (piece,)).fetchone():
            return piece
        if len(piece) >= MIN_PIECE and not any(c in piece for c in "%_\\"):
            for pattern, what in ((f"{piece}%", "prefix"), (f"%{piece}", "suffix")):
                found = [r[0] for r in self._read(
                    f"SELECT id FROM {table} WHERE id LIKE ? ORDER BY id LIMIT 3", (pattern,))]
                if len(found) == 1:
                    return str(found[0])
                if found:
                    raise InvalidInput(f"id {what} {piece!r} is ambiguous in {self.path}: "
                                       f"matches {', '.join(found)}")
        raise NotFound(f"no run {piece} in archive {self.path}")

    def run(self, run_id: str) -> dict[str, Any]:
        cur = self._read(f"SELECT * FROM {quote(self.table)} WHERE id = ?", (run_id,))
        row = cur.fetchone()
        if row is None:
            raise NotFound(f"no run {run_id} in archive {self.path}")
        return dict(zip([d[0] for d in cur.description], row, strict=True))

    def facts(self, run_id: str) -> list[dict[str, Any]]:
        cur = self._read(f"SELECT {', '.join(FACT_COLUMNS)} FROM {FACTS} "
                         "WHERE entity_id = ? ORDER BY entity_version", (run_id,))
        return [dict(zip(FACT_COLUMNS, r, strict=True)) for r in cur.fetchall()]

    def counts(self) -> tuple[int, int]:
        """(runs, facts) the file actually holds (the manifest says what it should)."""
        runs = self._read(f"SELECT COUNT(*) FROM {quote(self.table)}").fetchone()[0]
        facts = self._read(f"SELECT COUNT(*) FROM {FACTS}").fetchone()[0]
        return int(runs), int(facts)

    def ids(self) -> Iterator[str]:
        return iter([r[0] for r in self._read(
            f"SELECT id FROM {quote(self.table)} ORDER BY id")])
