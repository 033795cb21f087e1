-- SQLite's text of spec evolution (store/migrate.py, store/sqlcatalog.py): the recorded
-- specs, what a plan asks of the data, and reading the schema back.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a ? parameter.

-- name: recorded_specs
SELECT entity, spec FROM ledgerq_specs

-- name: record_spec
INSERT INTO ledgerq_specs (entity, table_name, spec_hash, spec, migrated_at)
VALUES (?, ?, ?, ?, ?) ON CONFLICT (entity) DO UPDATE SET
  table_name = excluded.table_name, spec_hash = excluded.spec_hash,
  spec = excluded.spec, migrated_at = excluded.migrated_at

-- name: record_spec_version
INSERT INTO ledgerq_spec_versions (entity, spec_hash, spec, recorded_at)
VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING

-- name: forget_spec
DELETE FROM ledgerq_specs WHERE entity = ?

-- name: count_where
SELECT count(*) FROM {table} WHERE {where}

-- name: ids_where
SELECT id FROM {table} WHERE {where} ORDER BY id {limit}

-- name: tables
SELECT name FROM sqlite_master WHERE type = 'table'

-- name: status_check
-- The table's CREATE statement, whose status CHECK the catalog reads the states from.
SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?

-- name: table_columns
SELECT name FROM pragma_table_info(?) ORDER BY cid

-- name: table_indexes
SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?
