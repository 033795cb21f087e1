"""DDL: ledgerq's own tables, plus one projection table per registered entity.

Projection tables are generated from their spec (columns, indexes and the status
CHECK constraint), so a contributor who adds a state or an entity edits one file.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence

from ledgerq.lifecycle.evolution import SCHEMA_VERSION, Plan, StateMapping
from ledgerq.lifecycle.registry import ColumnPolicy, EntityPolicy, Registry
from ledgerq.store import ddl, migrate
from ledgerq.store.sqlite.catalog import (
    META_DDL,
    SqliteCatalog,
    check_foreign_keys,
    schema_version,
)
from ledgerq.store.sqlite.tx import SqliteTx

BASE_DDL = """
CREATE TABLE IF NOT EXISTS schedules (
  id          TEXT PRIMARY KEY,
  name        TEXT,
  created_at  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS invocations (
  id          TEXT PRIMARY KEY,
  created_at  REAL NOT NULL,
  detail      JSON
);
CREATE TABLE IF NOT EXISTS status_transitions (
  id              TEXT PRIMARY KEY,
  entity_type     TEXT NOT NULL,
  entity_id       TEXT NOT NULL,
  previous_status TEXT,
  status          TEXT NOT NULL,
  reason_code     TEXT NOT NULL,
  reason_summary  TEXT,
  evidence_refs   JSON,
  source          TEXT NOT NULL,
  actor           TEXT,
  created_at      REAL NOT NULL,
  metadata        JSON,
  entity_version  INTEGER NOT NULL,
  patch           JSON NOT NULL,
  idempotency_key TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS uq_status_transitions_version
  ON status_transitions(entity_type, entity_id, entity_version);
CREATE UNIQUE INDEX IF NOT EXISTS uq_status_transitions_idempotency
  ON status_transitions(entity_type, entity_id, idempotency_key)
  WHERE idempotency_key IS NOT NULL;
CREATE TRIGGER IF NOT EXISTS status_transitions_no_update
  BEFORE UPDATE ON status_transitions
  BEGIN SELECT RAISE(ABORT, 'status_transitions is append-only: UPDATE refused'); END;
-- The archive's sanctioned path (ledgerq.queue.maintenance.archive): a fact may be deleted only
-- while its entity is listed here, by the transaction that archives it and clears the
-- list again before it commits; every other DELETE is refused as before.
CREATE TABLE IF NOT EXISTS ledgerq_archive_batch (
  entity_type TEXT NOT NULL,
  entity_id   TEXT NOT NULL,
  PRIMARY KEY (entity_type, entity_id)
);
-- Python tasks an app declared, recorded when it opens the database: submissions that
-- name one are checked against its parameters' JSON Schema without the app's code.
CREATE TABLE IF NOT EXISTS task_kinds (
  name        TEXT PRIMARY KEY,
  parameters  JSON NOT NULL,
  returns     JSON,
  queue       TEXT,
  recorded_at REAL NOT NULL,
  defaults    JSON
);
"""

#: The log's DELETE guard (schema version 4: it admits the archive's listed entities).
#: Dropped and created again by every migration: ``IF NOT EXISTS`` would keep the strict
#: guard of a database made before version 4, and the archive could never delete.
DELETE_GUARD = """
DROP TRIGGER IF EXISTS status_transitions_no_delete;
CREATE TRIGGER status_transitions_no_delete
  BEFORE DELETE ON status_transitions
  WHEN NOT EXISTS (SELECT 1 FROM ledgerq_archive_batch AS b
                   WHERE b.entity_type = OLD.entity_type AND b.entity_id = OLD.entity_id)
  BEGIN SELECT RAISE(ABORT, 'status_transitions is append-only: DELETE refused'); END;
"""

WORKERS_DDL = """
CREATE TABLE IF NOT EXISTS workers (
  worker_id               TEXT PRIMARY KEY,
  advertised_capabilities JSON NOT NULL DEFAULT '[]',
  execution_targets       JSON NOT NULL DEFAULT '[]',
  last_heartbeat_at       REAL NOT NULL,
  leased_run_id           TEXT REFERENCES {runs}(id),
  hostname                TEXT,
  pid                     INTEGER,
  started_at              REAL,
  stop_requested_at       REAL,
  queues                  JSON,
  kinds                   JSON
);
-- The foreign key's child side: deleting a run (rebuild) looks up referencing workers.
CREATE INDEX IF NOT EXISTS idx_workers_leased_run
  ON workers(leased_run_id) WHERE leased_run_id IS NOT NULL;
"""

#: Columns of ``workers`` added after it was first shipped, each with its DDL: a table
#: made by an older version (CREATE TABLE IF NOT EXISTS leaves it as it is) gets them in
#: the migration of the open that finds the older schema version recorded.
WORKERS_ADDED = {"stop_requested_at": "ALTER TABLE workers ADD COLUMN stop_requested_at REAL",
                 "queues": "ALTER TABLE workers ADD COLUMN queues JSON",
                 "kinds": "ALTER TABLE workers ADD COLUMN kinds JSON"}


#: Columns ``task_kinds`` gained after it was made: 7, each task's own defaults.
TASK_KINDS_ADDED = {"defaults": "ALTER TABLE task_kinds ADD COLUMN defaults JSON"}


def add_columns(conn: sqlite3.Connection, table: str, added: dict[str, str]) -> None:
    """Run each of ``added`` (column -> its ``ALTER TABLE``) whose column ``table``
    lacks (idempotent): :data:`WORKERS_ADDED`, :data:`TASK_KINDS_ADDED`."""
    have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
    for column, statement in added.items():
        if column not in have:
            conn.execute(statement)


#: SQLite's declared type per logical type. JSON keeps the declared name ``JSON`` (as
#: databases created before logical types have it); timestamps are epoch-second REALs.
SQLITE_TYPES = {"text": "TEXT", "integer": "INTEGER", "float": "REAL", "timestamp": "REAL",
                "json": "JSON", "boolean": "INTEGER"}


def column_ddl(column: ColumnPolicy) -> str:
    """One column's SQLite type and constraints (see :func:`ledgerq.store.ddl.column_ddl`)."""
    return ddl.column_ddl(column, types=SQLITE_TYPES, booleans=("1", "0"))


def projection_ddl(policy: EntityPolicy) -> str:
    return ddl.projection_ddl(policy, column_ddl)


def schema_ddl(registry: Registry) -> str:
    """The whole schema; workers come last because they reference the runs' table."""
    parts = [BASE_DDL, DELETE_GUARD]
    parts += [projection_ddl(p) for p in registry.policies()]
    workers = ddl.runs_ddl(WORKERS_DDL, registry)
    if workers is not None:
        parts.append(workers)
    return "\n".join(parts)


def missing_tables(conn: sqlite3.Connection, registry: Registry) -> list[str]:
    """The tables a ledgerq database must have that this file lacks (read-only check)."""
    wanted = ["status_transitions", *(p.table for p in registry.policies())]
    have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    return [t for t in wanted if t not in have]


def statements(script: str) -> Iterator[str]:
    """A script's statements one by one (a trigger's body holds semicolons), so they can
    run inside the caller's transaction: ``executescript`` would commit it first."""
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            if pending.strip():
                yield pending
            pending = ""
    if pending.strip():
        yield pending


def open_schema(conn: sqlite3.Connection, registry: Registry) -> Plan | None:
    """Create the schema, or migrate it to what these specs add (see ``store/migrate``).

    A database already at these specs is only read: opening it takes no write lock.
    """
    if schema_version(conn) >= SCHEMA_VERSION and not migrate.needed(
            SqliteCatalog(SqliteTx(conn), column_ddl), registry):
        return None
    return _in_migration(conn, registry, lambda cat: migrate.on_open(cat, registry))


def apply_specs(conn: sqlite3.Connection, registry: Registry,
                mappings: Sequence[StateMapping] = (), *, dry_run: bool = False) -> Plan:
    """``ledgerq migrate``: make the recorded specs exactly ``registry``'s (or, with
    ``dry_run``, say what that would do and roll back)."""
    return _in_migration(conn, registry, lambda cat: migrate.apply(
        cat, registry, mappings, dry_run=dry_run), rollback=dry_run)


def _in_migration(conn: sqlite3.Connection, registry: Registry,
                  step: Callable[[SqliteCatalog], Plan], *, rollback: bool = False) -> Plan:
    # Foreign keys off for the table rebuilds (it can only change outside a transaction);
    # every reference is checked before COMMIT instead.
    conn.execute("PRAGMA foreign_keys = OFF")
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in statements(BASE_DDL + DELETE_GUARD + META_DDL):
                conn.execute(statement)
            add_columns(conn, "task_kinds", TASK_KINDS_ADDED)
            catalog = SqliteCatalog(SqliteTx(conn), column_ddl)
            plan = step(catalog)
            workers = ddl.runs_ddl(WORKERS_DDL, registry)
            if workers is not None:
                for statement in statements(workers):
                    conn.execute(statement)
                add_columns(conn, "workers", WORKERS_ADDED)
            check_foreign_keys(catalog)
            # Never lowered: a newer release's tables stay recorded as the newer version
            # when this one opens them (its upgrades only add).
            conn.execute("INSERT INTO ledgerq_schema (key, value) VALUES ('schema_version', ?) "
                         "ON CONFLICT (key) DO UPDATE SET value = excluded.value "
                         "WHERE CAST(ledgerq_schema.value AS INTEGER) < "
                         "CAST(excluded.value AS INTEGER)", (str(SCHEMA_VERSION),))
            conn.execute(f"PRAGMA user_version = {max(SCHEMA_VERSION, schema_version(conn))}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("ROLLBACK" if rollback else "COMMIT")
    finally:
        conn.execute("PRAGMA foreign_keys = ON")
    return plan


def create_schema(conn: sqlite3.Connection, registry: Registry) -> None:
    """Create (or migrate) the schema on a raw connection: tests and tools use it.

    Like ``executescript``, it first commits whatever the connection has pending (a
    connection in Python's default transaction mode opens one at the first INSERT)."""
    if conn.in_transaction:
        conn.commit()
    open_schema(conn, registry)
