"""PostgreSQL DDL: ledgerq's own tables plus one projection table per registered entity.

The same tables, columns and names as SQLite's (``store/sqlite/schema.py``), rendered
in PostgreSQL's types: timestamps and floats are ``double precision`` (its ``real`` is
a 4-byte float that would round an epoch timestamp to about two minutes), JSON columns
are ``jsonb``, integers ``bigint``. Foreign keys are ``DEFERRABLE`` so that ``rebuild``
can delete and re-insert referenced rows in one transaction. Every statement is
idempotent: opening a database that has the schema changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg

from ledgerq.lifecycle.evolution import SCHEMA_VERSION, Plan, StateMapping
from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import ColumnPolicy, EntityPolicy, Registry
from ledgerq.store import ddl, migrate
from ledgerq.store.postgres.catalog import (
    META_DDL,
    PostgresCatalog,
    schema_version,
)
from ledgerq.store.postgres.tx import QUERIES, PostgresTx

PG_TYPES = {"text": "text", "integer": "bigint", "float": "double precision",
            "timestamp": "double precision", "json": "jsonb", "boolean": "boolean"}

BASE_DDL = """
CREATE TABLE IF NOT EXISTS schedules (
  id          text PRIMARY KEY,
  name        text,
  created_at  double precision NOT NULL
);
CREATE TABLE IF NOT EXISTS invocations (
  id          text PRIMARY KEY,
  created_at  double precision NOT NULL,
  detail      jsonb
);
CREATE TABLE IF NOT EXISTS status_transitions (
  id              text PRIMARY KEY,
  entity_type     text NOT NULL,
  entity_id       text NOT NULL,
  previous_status text,
  status          text NOT NULL,
  reason_code     text NOT NULL,
  reason_summary  text,
  evidence_refs   jsonb,
  source          text NOT NULL,
  actor           text,
  created_at      double precision NOT NULL,
  metadata        jsonb,
  entity_version  bigint NOT NULL,
  patch           jsonb NOT NULL,
  idempotency_key text
);
CREATE UNIQUE INDEX IF NOT EXISTS uq_status_transitions_version
  ON status_transitions(entity_type, entity_id, entity_version);
CREATE UNIQUE INDEX IF NOT EXISTS uq_status_transitions_idempotency
  ON status_transitions(entity_type, entity_id, idempotency_key)
  WHERE idempotency_key IS NOT NULL;
-- The archive's sanctioned path (ledgerq.queue.maintenance.archive): a fact may be deleted only
-- while its entity is listed here, by the transaction that archives it and clears the
-- list again before it commits (no other transaction ever sees its rows); every other
-- UPDATE, DELETE and TRUNCATE is refused as before.
CREATE TABLE IF NOT EXISTS ledgerq_archive_batch (
  entity_type text NOT NULL,
  entity_id   text NOT NULL,
  PRIMARY KEY (entity_type, entity_id)
);
-- Python tasks an app declared (see the SQLite twin).
CREATE TABLE IF NOT EXISTS task_kinds (
  name        text PRIMARY KEY,
  parameters  jsonb NOT NULL,
  returns     jsonb,
  queue       text,
  recorded_at double precision NOT NULL,
  defaults    jsonb
);
CREATE OR REPLACE FUNCTION status_transitions_append_only() RETURNS trigger
  LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' AND EXISTS (
      SELECT 1 FROM ledgerq_archive_batch AS b
      WHERE b.entity_type = OLD.entity_type AND b.entity_id = OLD.entity_id) THEN
    RETURN OLD;
  END IF;
  RAISE EXCEPTION 'status_transitions is append-only: % refused', TG_OP
    USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE OR REPLACE TRIGGER status_transitions_no_update
  BEFORE UPDATE ON status_transitions
  FOR EACH ROW EXECUTE FUNCTION status_transitions_append_only();
CREATE OR REPLACE TRIGGER status_transitions_no_delete
  BEFORE DELETE ON status_transitions
  FOR EACH ROW EXECUTE FUNCTION status_transitions_append_only();
CREATE OR REPLACE TRIGGER status_transitions_no_truncate
  BEFORE TRUNCATE ON status_transitions
  FOR EACH STATEMENT EXECUTE FUNCTION status_transitions_append_only();
"""

WORKERS_DDL = """
CREATE TABLE IF NOT EXISTS workers (
  worker_id               text PRIMARY KEY,
  advertised_capabilities jsonb NOT NULL DEFAULT '[]',
  execution_targets       jsonb NOT NULL DEFAULT '[]',
  last_heartbeat_at       double precision NOT NULL,
  leased_run_id           text REFERENCES {runs}(id) DEFERRABLE INITIALLY IMMEDIATE,
  hostname                text,
  pid                     bigint,
  started_at              double precision,
  stop_requested_at       double precision,
  queues                  jsonb,
  kinds                   jsonb
);
CREATE INDEX IF NOT EXISTS idx_workers_leased_run
  ON workers(leased_run_id) WHERE leased_run_id IS NOT NULL;
"""

#: Wake-ups: a run entering ``queued`` (submitted, requeued, retried, released, fired)
#: tells every listening worker, from the statement that moved it (delivered at commit,
#: once per transaction). A trigger rather than a statement of each unit: a submit is one
#: round trip shorter, and no path into ``queued`` can forget it. The condition is
#: checked without calling the function, so claims and other moves pay nothing.
WAKEUP_DDL = """
CREATE OR REPLACE FUNCTION ledgerq_notify_claimable() RETURNS trigger
  LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ledgerq_claimable', '');
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER ledgerq_claimable
  AFTER INSERT OR UPDATE OF status ON {runs}
  FOR EACH ROW WHEN (NEW.status = {queued}) EXECUTE FUNCTION ledgerq_notify_claimable();
-- A run's end (it entered a terminal state): whoever awaits its result, on any host,
-- wakes at the commit instead of at its next poll.
CREATE OR REPLACE FUNCTION ledgerq_notify_ended() RETURNS trigger
  LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('ledgerq_ended', NEW.id);
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER ledgerq_ended
  AFTER UPDATE OF status ON {runs}
  FOR EACH ROW WHEN (NEW.status IN ({terminal}) AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION ledgerq_notify_ended();
"""

#: Columns of ``workers`` added after it was first shipped (see the SQLite twin): a table
#: an older version made gets them in the migration that finds its schema version lower.
WORKERS_UPGRADE = """
ALTER TABLE workers ADD COLUMN IF NOT EXISTS stop_requested_at double precision;
ALTER TABLE workers ADD COLUMN IF NOT EXISTS queues jsonb;
ALTER TABLE workers ADD COLUMN IF NOT EXISTS kinds jsonb;
"""
#: Columns of ``task_kinds`` added after it was first shipped (7: each task's defaults).
TASK_KINDS_UPGRADE = "ALTER TABLE task_kinds ADD COLUMN IF NOT EXISTS defaults jsonb"


def column_ddl(column: ColumnPolicy) -> str:
    """One column's PostgreSQL type and constraints; references are deferrable."""
    return ddl.column_ddl(column, types=PG_TYPES, booleans=("TRUE", "FALSE"),
                          reference_suffix="DEFERRABLE INITIALLY IMMEDIATE")


def projection_ddl(policy: EntityPolicy) -> str:
    return ddl.projection_ddl(policy, column_ddl)


def is_current(conn: psycopg.Connection[Any], registry: Registry) -> bool:
    """Whether opening needs no migration, found by reads alone: then it runs no DDL at
    all. ``CREATE ... IF NOT EXISTS`` and ``CREATE OR REPLACE TRIGGER`` take table locks
    even when they change nothing, so a worker starting beside busy writers would queue
    behind them."""
    try:
        return _current(conn, registry)
    finally:
        conn.rollback()


def _current(conn: psycopg.Connection[Any], registry: Registry) -> bool:
    return schema_version(conn) >= SCHEMA_VERSION and not migrate.needed(
        PostgresCatalog(PostgresTx(conn), column_ddl), registry)


def open_schema(conn: psycopg.Connection[Any], registry: Registry) -> Plan | None:
    """Create the schema, or migrate it to what these specs add, behind an advisory
    lock: many hosts may open one database at once; exactly one migrates, and the
    others find it current once the lock is theirs, and run no DDL (which would lock
    the tables the first one's writers are already using)."""
    if is_current(conn, registry):
        return None
    return _in_migration(conn, registry, lambda cat: migrate.on_open(cat, registry),
                         unless_current=True)


def apply_specs(conn: psycopg.Connection[Any], registry: Registry,
                mappings: Sequence[StateMapping] = (), *, dry_run: bool = False) -> Plan:
    plan = _in_migration(conn, registry, lambda cat: migrate.apply(
        cat, registry, mappings, dry_run=dry_run), rollback=dry_run)
    assert plan is not None
    return plan


class _Rollback(Exception):
    pass


def _in_migration(conn: psycopg.Connection[Any], registry: Registry,
                  step: Callable[[PostgresCatalog], Plan], *, rollback: bool = False,
                  unless_current: bool = False) -> Plan | None:
    plan: Plan | None = None
    try:
        with conn.transaction():
            conn.execute(QUERIES("schema_lock"))
            if unless_current and _current(conn, registry):
                return None  # another opener migrated while this one waited for the lock
            _lock_in_writer_order(conn, registry)
            conn.execute(BASE_DDL)
            conn.execute(META_DDL)
            if schema_version(conn) < SCHEMA_VERSION:
                conn.execute(TASK_KINDS_UPGRADE)
            # Rebuilds and mapped moves may delete and re-add referenced rows' columns.
            conn.execute("SET CONSTRAINTS ALL DEFERRED")
            plan = step(PostgresCatalog(PostgresTx(conn), column_ddl))
            workers = ddl.runs_ddl(WORKERS_DDL + WAKEUP_DDL, registry)
            if workers is not None:
                conn.execute(workers)
                if schema_version(conn) < SCHEMA_VERSION:  # an ALTER locks even when idle
                    conn.execute(WORKERS_UPGRADE)
            conn.execute(QUERIES("record_schema_version"), (str(SCHEMA_VERSION),))
            if rollback:
                raise _Rollback
    except _Rollback:
        pass
    assert plan is not None
    return plan


def _lock_in_writer_order(conn: psycopg.Connection[Any], registry: Registry) -> None:
    """Lock the existing tables this migration's DDL will lock, in the writers' order
    (``lock_for_migration``); a new database has none, and no writers."""
    order = [p.table for p in registry.policies()] + ["status_transitions", "workers"]
    have = {r[0] for r in conn.execute(QUERIES("tables_present"), (order,))}
    tables = [t for t in order if t in have]
    if tables:
        conn.execute(QUERIES("lock_for_migration",
                             tables=", ".join(quote(t) for t in tables)))
