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
from ledgerq.lifecycle import evolution
from ledgerq.lifecycle.evolution import Change, Normal
from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.operations import Tx
from ledgerq.store import ddl
from ledgerq.store.migrate import Catalog

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
"""


class SqliteCatalog(Catalog):
    def __init__(self, conn: sqlite3.Connection, column_ddl: Any, tx: Tx) -> None:
        self.conn = conn
        self._column_ddl = column_ddl
        self._tx = tx

    def _one(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self.conn.execute(sql, params).fetchone()

    def recorded(self) -> dict[str, Normal]:
        return read_recorded(self.conn)

    def tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}

    def table_states(self, table: str) -> list[str] | None:
        row = self._one("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (table,))
        match = _CHECK.search(row[0]) if row else None
        if match is None:
            return None
        return [m.replace("''", "'") for m in _LITERAL.findall(match.group(1))]

    def table_columns(self, table: str) -> list[str]:
        return [r[1] for r in self.conn.execute(f"PRAGMA table_info({quote(table)})")]

    def table_indexes(self, table: str) -> set[str]:
        return {r[0] for r in self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?", (table,))}

    def _sample(self, table: str, where: str, params: tuple[Any, ...]) -> tuple[int, list[str]]:
        t = quote(table)
        n = self._one(f"SELECT count(*) FROM {t} WHERE {where}", params)[0]
        ids = [r[0] for r in self.conn.execute(
            f"SELECT id FROM {t} WHERE {where} ORDER BY id LIMIT {evolution.SAMPLE_IDS}",
            params)] if n else []
        return int(n), ids

    def rows(self, table: str) -> tuple[int, list[str]]:
        return self._sample(table, "1 = 1", ())

    def rows_in(self, table: str, state: str) -> tuple[int, list[str]]:
        return self._sample(table, "status = ?", (state,))

    def holding(self, table: str, column: str, *, null: bool = False) -> tuple[int, list[str]]:
        return self._sample(table, f"{quote(column)} IS {'' if null else 'NOT '}NULL", ())

    def ids_in(self, table: str, state: str) -> list[str]:
        return [r[0] for r in self.conn.execute(
            f"SELECT id FROM {quote(table)} WHERE status = ? ORDER BY id", (state,))]

    def create(self, policy: EntityPolicy) -> None:
        self.conn.execute(ddl.table_statement(policy, self._column_ddl))
        for statement in ddl.index_statements(policy).values():
            self.conn.execute(statement)

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
                self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {quote(c.name)} "
                                  f"{self._column_ddl(new.columns[c.name])}")
            elif c.action in ("remove", "change"):
                self.conn.execute(f"DROP INDEX IF EXISTS {quote(c.name)}")
        indexes = ddl.index_statements(new)
        for c in changes:
            if c.kind == "index" and c.action in ("add", "change"):
                self.conn.execute(indexes[c.name])

    def _rebuild(self, new: EntityPolicy) -> None:
        """The twelve steps, inside the caller's transaction (foreign keys are off)."""
        have = set(self.table_columns(new.table))
        keep = ", ".join(quote(c) for c in new.columns if c in have)
        self.conn.execute(f"DROP TABLE IF EXISTS {quote(REBUILD_TABLE)}")
        self.conn.execute(ddl.table_statement(new, self._column_ddl, name=REBUILD_TABLE))
        self.conn.execute(f"INSERT INTO {quote(REBUILD_TABLE)} ({keep}) "
                          f"SELECT {keep} FROM {quote(new.table)}")
        self.conn.execute(f"DROP TABLE {quote(new.table)}")
        self.conn.execute(f"ALTER TABLE {quote(REBUILD_TABLE)} RENAME TO {quote(new.table)}")
        for statement in ddl.index_statements(new).values():
            self.conn.execute(statement)

    def drop(self, table: str) -> None:
        self.conn.execute(f"DROP TABLE {quote(table)}")

    def record(self, normal: Normal, now: float) -> None:
        text = evolution.encode(normal)
        digest = evolution.spec_hash(normal)
        self.conn.execute(
            "INSERT INTO ledgerq_specs (entity, table_name, spec_hash, spec, migrated_at) "
            "VALUES (?, ?, ?, ?, ?) ON CONFLICT (entity) DO UPDATE SET "
            "table_name = excluded.table_name, spec_hash = excluded.spec_hash, "
            "spec = excluded.spec, migrated_at = excluded.migrated_at",
            (normal["entity"], normal["table"], digest, text, now))
        self.conn.execute(
            "INSERT OR IGNORE INTO ledgerq_spec_versions (entity, spec_hash, spec, recorded_at)"
            " VALUES (?, ?, ?, ?)", (normal["entity"], digest, text, now))

    def forget(self, entity: str) -> None:
        self.conn.execute("DELETE FROM ledgerq_specs WHERE entity = ?", (entity,))

    def tx(self) -> Tx:
        return self._tx

    def foreign_key_problems(self) -> list[str]:
        return [f"{r[0]} row {r[1]} references a missing {r[2]} row"
                for r in self.conn.execute("PRAGMA foreign_key_check").fetchmany(5)]


def _addable(column: Any) -> bool:
    """What ``ALTER TABLE ADD COLUMN`` takes: no primary key, and (with foreign keys on
    at run time) a reference only with a NULL default; NOT NULL only with a default."""
    if column.not_null and column.default is None:
        return False
    return column.references is None or column.default is None


def read_recorded(conn: sqlite3.Connection) -> dict[str, Normal]:
    """The recorded specs ({} when the database has none: new, or from before)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                    "name = 'ledgerq_specs'").fetchone() is None:
        return {}
    return {r[0]: evolution.decode(r[1])
            for r in conn.execute("SELECT entity, spec FROM ledgerq_specs")}


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
