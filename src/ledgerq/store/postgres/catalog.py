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
from ledgerq.operations import Tx
from ledgerq.store import ddl
from ledgerq.store.migrate import Catalog

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
"""


class PostgresCatalog(Catalog):
    def __init__(self, conn: psycopg.Connection[Any], column_ddl: Any, tx: Tx) -> None:
        self.conn = conn
        self._column_ddl = column_ddl
        self._tx = tx

    def _all(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return self.conn.execute(sql, params).fetchall()

    def recorded(self) -> dict[str, Normal]:
        return read_recorded(self.conn)

    def tables(self) -> set[str]:
        return {r[0] for r in self._all(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}

    def _status_check(self, table: str) -> tuple[str, str] | None:
        rows = self._all(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = to_regclass(%s) AND contype = 'c' "
            "AND pg_get_constraintdef(oid) LIKE %s", (quote(table), "%(status%"))
        return (str(rows[0][0]), str(rows[0][1])) if rows else None

    def table_states(self, table: str) -> list[str] | None:
        found = self._status_check(table)
        if found is None:
            return None
        return [m.replace("''", "'") for m in _LITERAL.findall(found[1])]

    def table_columns(self, table: str) -> list[str]:
        return [r[0] for r in self._all(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = %s ORDER BY ordinal_position", (table,))]

    def table_indexes(self, table: str) -> set[str]:
        return {r[0] for r in self._all(
            "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = %s", (table,))}

    def _sample(self, table: str, where: str, params: tuple[Any, ...]) -> tuple[int, list[str]]:
        t = quote(table)
        n = self._all(f"SELECT count(*) FROM {t} WHERE {where}", params)[0][0]
        ids = [r[0] for r in self._all(
            f"SELECT id FROM {t} WHERE {where} ORDER BY id LIMIT {evolution.SAMPLE_IDS}",
            params)] if n else []
        return int(n), ids

    def rows(self, table: str) -> tuple[int, list[str]]:
        return self._sample(table, "TRUE", ())

    def rows_in(self, table: str, state: str) -> tuple[int, list[str]]:
        return self._sample(table, "status = %s", (state,))

    def holding(self, table: str, column: str, *, null: bool = False) -> tuple[int, list[str]]:
        return self._sample(table, f"{quote(column)} IS {'' if null else 'NOT '}NULL", ())

    def ids_in(self, table: str, state: str) -> list[str]:
        return [r[0] for r in self._all(
            f"SELECT id FROM {quote(table)} WHERE status = %s ORDER BY id", (state,))]

    def create(self, policy: EntityPolicy) -> None:
        self.conn.execute(ddl.table_statement(policy, self._column_ddl))
        for statement in ddl.index_statements(policy).values():
            self.conn.execute(statement)

    def alter(self, old: Normal, new: EntityPolicy, changes: list[Change]) -> None:
        table = quote(new.table)
        run = self.conn.execute
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
                    f"{self._column_ddl(new.columns[c.name])}")
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

    def drop(self, table: str) -> None:
        self.conn.execute(f"DROP TABLE {quote(table)}")

    def record(self, normal: Normal, now: float) -> None:
        text = evolution.encode(normal)
        digest = evolution.spec_hash(normal)
        self.conn.execute(
            "INSERT INTO ledgerq_specs (entity, table_name, spec_hash, spec, migrated_at) "
            "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (entity) DO UPDATE SET "
            "table_name = excluded.table_name, spec_hash = excluded.spec_hash, "
            "spec = excluded.spec, migrated_at = excluded.migrated_at",
            (normal["entity"], normal["table"], digest, text, now))
        self.conn.execute(
            "INSERT INTO ledgerq_spec_versions (entity, spec_hash, spec, recorded_at) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (normal["entity"], digest, text, now))

    def forget(self, entity: str) -> None:
        self.conn.execute("DELETE FROM ledgerq_specs WHERE entity = %s", (entity,))

    def tx(self) -> Tx:
        return self._tx


def _as_dict(policy: EntityPolicy, column: str) -> dict[str, Any]:
    col = policy.columns[column]
    return {"type": col.type, "not_null": col.not_null, "default": col.default,
            "references": col.references, "on_delete": col.on_delete}


def quote_any(name: str) -> str:
    """A constraint name PostgreSQL chose (``<table>_status_check``, maybe truncated):
    not a spec identifier, so quoted by doubling quotes rather than validated."""
    return '"' + name.replace('"', '""') + '"'


def read_recorded(conn: psycopg.Connection[Any]) -> dict[str, Normal]:
    row = conn.execute("SELECT to_regclass('ledgerq_specs') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return {}
    return {r[0]: evolution.decode(r[1])
            for r in conn.execute("SELECT entity, spec FROM ledgerq_specs").fetchall()}


def schema_version(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT to_regclass('ledgerq_schema') IS NOT NULL").fetchone()
    if not row or not row[0]:
        return 0
    found = conn.execute(
        "SELECT value FROM ledgerq_schema WHERE key = 'schema_version'").fetchone()
    return int(found[0]) if found else 0
