-- PostgreSQL's text of spec evolution (store/migrate.py, store/sqlcatalog.py): the recorded
-- specs, what a plan asks of the data, and reading the schema back.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a %s (psycopg) parameter.

-- name: recorded_specs
SELECT entity, spec FROM ledgerq_specs

-- name: record_spec
INSERT INTO ledgerq_specs (entity, table_name, spec_hash, spec, migrated_at)
VALUES (%s, %s, %s, %s, %s) ON CONFLICT (entity) DO UPDATE SET
  table_name = excluded.table_name, spec_hash = excluded.spec_hash,
  spec = excluded.spec, migrated_at = excluded.migrated_at

-- name: record_spec_version
INSERT INTO ledgerq_spec_versions (entity, spec_hash, spec, recorded_at)
VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING

-- name: forget_spec
DELETE FROM ledgerq_specs WHERE entity = %s

-- name: count_where
SELECT count(*) FROM {table} WHERE {where}

-- name: ids_where
SELECT id FROM {table} WHERE {where} ORDER BY id {limit}

-- name: tables
SELECT tablename FROM pg_tables WHERE schemaname = current_schema()

-- name: status_check
-- The status column's CHECK (PostgreSQL names it; a long table name truncates it).
SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = to_regclass(%s) AND contype = 'c' AND pg_get_constraintdef(oid) LIKE %s

-- name: table_columns
SELECT column_name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position

-- name: table_indexes
SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s
