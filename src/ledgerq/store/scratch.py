"""A throwaway database for one test: a temporary SQLite file, or a fresh schema in a
PostgreSQL database the test names. The testing kit's machines and its pytest fixtures
open one per example (or per test) and drop it after."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from ledgerq.extras import require
from ledgerq.store.db import is_postgres


class Scratch:
    """One scratch database: ``target`` is what ``StateDB(...)`` opens; :meth:`drop`
    removes it (a file's directory, or the schema and every table in it)."""

    def __init__(self, base: str | Path | None = None, *, prefix: str = "ledgerq") -> None:
        self.base = base
        self.directory: str | None = None
        self.schema: str | None = None
        if base is not None and is_postgres(base):
            require("postgres")
            from ledgerq.store.postgres.scratch import create_schema

            self.schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
            self.target: str = create_schema(str(base), self.schema)
        else:
            # tmpfs where there is one: the same SQLite, WAL and pragmas, a third the cost
            # of a disk for a database that lives for one example.
            parent = str(base) if base is not None else (
                "/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
            self.directory = tempfile.mkdtemp(prefix=f"{prefix}-", dir=parent)
            self.target = os.path.join(self.directory, "scratch.db")

    def drop(self) -> None:
        if self.schema is not None:
            from ledgerq.store.postgres.scratch import drop_schema

            drop_schema(str(self.base), self.schema)
            self.schema = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


__all__ = ["Scratch"]
