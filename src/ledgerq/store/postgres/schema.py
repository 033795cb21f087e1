"""PostgreSQL DDL: ledgerq's own tables plus one projection table per registered entity.

The same tables, columns and names as SQLite's (``store/sqlite/schema.py``), rendered
in PostgreSQL's types: timestamps and floats are ``double precision`` (its ``real`` is
a 4-byte float that would round an epoch timestamp to about two minutes), JSON columns
are ``jsonb``, integers ``bigint``. Foreign keys are ``DEFERRABLE`` so that ``rebuild``
can delete and re-insert referenced rows in one transaction. Every statement is
idempotent: opening a database that has the schema changes nothing.
"""

from __future__ import annotations

import hashlib

from ledgerq.lifecycle.registry import ColumnPolicy, EntityPolicy, Registry
from ledgerq.store import ddl

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
CREATE OR REPLACE FUNCTION status_transitions_append_only() RETURNS trigger
  LANGUAGE plpgsql AS $$
BEGIN
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
  leased_run_id           text REFERENCES schedule_runs(id) DEFERRABLE INITIALLY IMMEDIATE,
  hostname                text,
  pid                     bigint,
  started_at              double precision
);
CREATE INDEX IF NOT EXISTS idx_workers_leased_run
  ON workers(leased_run_id) WHERE leased_run_id IS NOT NULL;
"""


def column_ddl(column: ColumnPolicy) -> str:
    """One column's PostgreSQL type and constraints; references are deferrable."""
    return ddl.column_ddl(column, types=PG_TYPES, booleans=("TRUE", "FALSE"),
                          reference_suffix="DEFERRABLE INITIALLY IMMEDIATE")


def projection_ddl(policy: EntityPolicy) -> str:
    return ddl.projection_ddl(policy, column_ddl)


def schema_statements(registry: Registry) -> list[str]:
    """The whole schema as statements; workers come last (they reference schedule_runs)."""
    parts = [BASE_DDL, *(projection_ddl(p) for p in registry.policies())]
    if "schedule_runs" in {p.table for p in registry.policies()}:
        parts.append(WORKERS_DDL)
    return parts


#: One row per fact about the schema; ``ddl`` is the fingerprint of the statements that
#: made it, so an open whose registry renders the same DDL runs none of it.
META_DDL = """
CREATE TABLE IF NOT EXISTS ledgerq_schema (
  key   text PRIMARY KEY,
  value text NOT NULL
);
"""


def fingerprint(registry: Registry) -> str:
    """A digest of the whole schema's DDL as this registry renders it."""
    return hashlib.sha256("\n".join(schema_statements(registry)).encode()).hexdigest()


def required_tables(registry: Registry) -> list[str]:
    return ["status_transitions", *(p.table for p in registry.policies())]
