"""PostgreSQL's side of a migration: the schema read back, and altered in place.

Unlike SQLite, PostgreSQL alters a table where it stands: the status CHECK is dropped
and added again with the new states (the new one validates every row), columns are
added, dropped or altered, indexes dropped and created, all inside the migration's
transaction, so a failure leaves the old schema whole. A column whose type or
reference changes holds no values (the plan refuses otherwise), so it is dropped and
added again rather than cast.
"""

from __future__ import annotations

import re
from typing import Any

import psycopg

from ledgerq.lifecycle import evolution
from ledgerq.lifecycle.evolution import Change, Normal
from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.store import ddl
from ledgerq.store.postgres.tx import PostgresTx
from ledgerq.store.sqlcatalog import SqlCatalog

_LITERAL = re.compile(r"'((?:[^']|'')*)'::text")
#: How a boolean default is spelled (as ``schema.column_ddl`` spells it).
BOOLEANS = ("TRUE", "FALSE")

META_DDL = """
CREATE TABLE IF NOT EXISTS ledgerq_schema (
  key   text PRIMARY KEY,
  value text NOT NULL
);
CREATE TABLE IF NOT EXISTS ledgerq_specs (
  entity      text PRIMARY KEY,
  table_name  text NOT NULL,
  spec_hash   text NOT NULL,
  spec        text NOT NULL,
  migrated_at double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS ledgerq_spec_versions (
  entity      text NOT NULL,
  spec_hash   text NOT NULL,
  spec        text NOT NULL,
  recorded_at double precision NOT NULL,
  PRIMARY KEY (entity, spec_hash)
);
-- One row per ``ledgerq archive``: what it moved out of the live tables and where to.
CREATE TABLE IF NOT EXISTS ledgerq_archives (
  id              text PRIMARY KEY,
  created_at      double precision NOT NULL,
  ended_before    double precision NOT NULL,
  file            text NOT NULL,
  entity_type     text NOT NULL,
  runs            bigint NOT NULL,
  facts           bigint NOT NULL,
  skipped         bigint NOT NULL,
  ids_sha256      text NOT NULL,
  ledgerq_version text NOT NULL
);
"""


class PostgresCatalog(SqlCatalog):
    def tables(self) -> set[str]:
        return {r[0] for r in self.run(self.q("tables"))}

    def _status_check(self, table: str) -> tuple[str, str] | None:
        rows = self.run(self.q("status_check"), (quote(table), "%(status%"))
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    def table_states(self, table: str) -> list[str] | None:
        found = self._status_check(table)
        if found is None:
            return None
        return [m.replace("''", "'") for m in _LITERAL.findall(found[1])]

    def table_columns(self, table: str) -> list[str]:
        return [r[0] for r in self.run(self.q("table_columns"), (table,))]

    def table_indexes(self, table: str) -> set[str]:
        return {r[0] for r in self.run(self.q("table_indexes"), (table,))}

    def alter(self, old: Normal, new: EntityPolicy, changes: list[Change]) -> None:
        table = quote(new.table)
        run = self.run
        if any(c.kind == "state" for c in changes):
            found = self._status_check(new.table)
            if found is not None:
                run(f"ALTER TABLE {table} DROP CONSTRAINT {quote_any(found[0])}")
            run(f"ALTER TABLE {table} ADD {new.status_check()}")
        for c in changes:
            if c.kind != "column":
                continue
            name = quote(c.name)
            if c.action == "remove":
                run(f"ALTER TABLE {table} DROP COLUMN {name}")
            elif c.action == "add" or evolution.retyped(old["columns"][c.name],
                                                        _as_dict(new, c.name)):
                if c.action == "change":
                    run(f"ALTER TABLE {table} DROP COLUMN {name}")
                run(f"ALTER TABLE {table} ADD COLUMN {name} "
                    f"{self.column_ddl(new.columns[c.name])}")
            else:
                col = new.columns[c.name]
                run(f"ALTER TABLE {table} ALTER COLUMN {name} "
                    f"{'SET' if col.not_null else 'DROP'} NOT NULL")
                if col.default is None:
                    run(f"ALTER TABLE {table} ALTER COLUMN {name} DROP DEFAULT")
                else:
                    run(f"ALTER TABLE {table} ALTER COLUMN {name} SET DEFAULT "
                        f"{ddl.literal(col.default, BOOLEANS)}")
        for c in changes:
            if c.kind == "index" and c.action in ("remove", "change"):
                run(f"DROP INDEX IF EXISTS {quote(c.name)}")
        indexes = ddl.index_statements(new)
        for c in changes:
            if c.kind == "index" and c.action in ("add", "change"):
                run(indexes[c.name])


def _as_dict(policy: EntityPolicy, column: str) -> dict[str, Any]:
    col = policy.columns[column]
    return {"type": col.type, "not_null": col.not_null, "default": col.default,
            "references": col.references, "on_delete": col.on_delete}


def quote_any(name: str) -> str:
    """A constraint name PostgreSQL chose (``<table>_status_check``, maybe truncated):
    not a spec identifier, so quoted by doubling quotes rather than validated."""
    return '"' + name.replace('"', '""') + '"'


def read_recorded(conn: psycopg.Connection[Any]) -> dict[str, Normal]:
    """The recorded specs ({} when the database has none: new, or from before)."""
    return PostgresCatalog(PostgresTx(conn), None).recorded()


def schema_version(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT to_regclass('ledgerq_schema') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    found = conn.execute(
        "SELECT value FROM ledgerq_schema WHERE key = 'schema_version'").fetchone()
    return int(found[0]) if found else 0
