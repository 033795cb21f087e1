"""SQLite's side of a migration: the schema read back, and changed, on one connection.

A CHECK constraint cannot be altered in SQLite, so a table whose states or column
definitions change is rebuilt by the documented twelve steps (sqlite.org/lang_altertable.html
"Making Other Kinds Of Table Schema Changes"): with foreign keys off, create the new
table, copy every row (ids and versions unchanged), drop the old, rename the new, create
its indexes, and check every foreign key before COMMIT. The log and its append-only
triggers are another table and are never touched. A new nullable column or an index
needs no rebuild.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from ledgerq.errors import MigrationRefused
from ledgerq.lifecycle.evolution import Change, Normal
from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.store import ddl
from ledgerq.store.sqlcatalog import SqlCatalog
from ledgerq.store.sqlite.tx import SqliteTx

#: The rebuilt table's name until it replaces the old one (one rebuild at a time).
REBUILD_TABLE = "ledgerq_rebuild"
_CHECK = re.compile(r"CHECK\s*\(\s*status\s+IN\s*\(((?:'(?:[^']|'')*'\s*,?\s*)*)\)\s*\)",
                    re.IGNORECASE)
_LITERAL = re.compile(r"'((?:[^']|'')*)'")

META_DDL = """
CREATE TABLE IF NOT EXISTS ledgerq_schema (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS ledgerq_specs (
  entity      TEXT PRIMARY KEY,
  table_name  TEXT NOT NULL,
  spec_hash   TEXT NOT NULL,
  spec        TEXT NOT NULL,
  migrated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ledgerq_spec_versions (
  entity      TEXT NOT NULL,
  spec_hash   TEXT NOT NULL,
  spec        TEXT NOT NULL,
  recorded_at REAL NOT NULL,
  PRIMARY KEY (entity, spec_hash)
);
-- One row per ``ledgerq archive``: what it moved out of the live tables and where to.
CREATE TABLE IF NOT EXISTS ledgerq_archives (
  id              TEXT PRIMARY KEY,
  created_at      REAL NOT NULL,
  ended_before    REAL NOT NULL,
  file            TEXT NOT NULL,
  entity_type     TEXT NOT NULL,
  runs            INTEGER NOT NULL,
  facts           INTEGER NOT NULL,
  skipped         INTEGER NOT NULL,
  ids_sha256      TEXT NOT NULL,
  ledgerq_version TEXT NOT NULL
);
"""


class SqliteCatalog(SqlCatalog):
    def tables(self) -> set[str]:
        return {r[0] for r in self.run(self.q("tables"))}

    def table_states(self, table: str) -> list[str] | None:
        row = self.run(self.q("status_check"), (table,))
        match = _CHECK.search(row[0][0]) if row else None
        if match is None:
            return None
        return [m.replace("''", "'") for m in _LITERAL.findall(match.group(1))]

    def table_columns(self, table: str) -> list[str]:
        return [r[0] for r in self.run(self.q("table_columns"), (table,))]

    def table_indexes(self, table: str) -> set[str]:
        return {r[0] for r in self.run(self.q("table_indexes"), (table,))}

    def alter(self, old: Normal, new: EntityPolicy, changes: list[Change]) -> None:
        simple = all(
            (c.kind == "index") or (c.kind == "column" and c.action == "add"
                                    and _addable(new.columns[c.name]))
            for c in changes)
        if not simple:
            self._rebuild(new)
            return
        table = quote(new.table)
        for c in changes:
            if c.kind == "column":
                self.run(f"ALTER TABLE {table} ADD COLUMN {quote(c.name)} "
                         f"{self.column_ddl(new.columns[c.name])}")
            elif c.action in ("remove", "change"):
                self.run(f"DROP INDEX IF EXISTS {quote(c.name)}")
        indexes = ddl.index_statements(new)
        for c in changes:
            if c.kind == "index" and c.action in ("add", "change"):
                self.run(indexes[c.name])

    def _rebuild(self, new: EntityPolicy) -> None:
        """The twelve steps, inside the caller's transaction (foreign keys are off)."""
        have = set(self.table_columns(new.table))
        keep = ", ".join(quote(c) for c in new.columns if c in have)
        self.run(f"DROP TABLE IF EXISTS {quote(REBUILD_TABLE)}")
        self.run(ddl.table_statement(new, self._column_ddl, name=REBUILD_TABLE))
        self.run(f"INSERT INTO {quote(REBUILD_TABLE)} ({keep}) "
                 f"SELECT {keep} FROM {quote(new.table)}")
        self.run(f"DROP TABLE {quote(new.table)}")
        self.run(f"ALTER TABLE {quote(REBUILD_TABLE)} RENAME TO {quote(new.table)}")
        for statement in ddl.index_statements(new).values():
            self.run(statement)

    def foreign_key_problems(self) -> list[str]:
        return [f"{r[0]} row {r[1]} references a missing {r[2]} row"
                for r in self.run("PRAGMA foreign_key_check")[:5]]


def _addable(column: Any) -> bool:
    """What ``ALTER TABLE ADD COLUMN`` takes: no primary key, and (with foreign keys on
    at run time) a reference only with a NULL default; NOT NULL only with a default."""
    if column.not_null and column.default is None:
        return False
    return column.references is None or column.default is None


def read_recorded(conn: sqlite3.Connection) -> dict[str, Normal]:
    """The recorded specs ({} when the database has none: new, or from before)."""
    return SqliteCatalog(SqliteTx(conn), None).recorded()


def schema_version(conn: sqlite3.Connection) -> int:
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                    "name = 'ledgerq_schema'").fetchone() is None:
        return 0
    row = conn.execute("SELECT value FROM ledgerq_schema WHERE key = 'schema_version'"
                       ).fetchone()
    return int(row[0]) if row else 0


def check_foreign_keys(catalog: SqliteCatalog) -> None:
    problems = catalog.foreign_key_problems()
    if problems:
        raise MigrationRefused("the migration would break foreign keys; nothing was "
                               "changed: " + "; ".join(problems))
