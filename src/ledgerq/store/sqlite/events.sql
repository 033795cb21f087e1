-- SQLite's text of the engine's operations (ledgerq/store/sqltx/events.py): moves,
-- claims, creation, the log, and what verify and rebuild read and write.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a ? parameter.

-- name: read_for_move
SELECT {columns} FROM {table} WHERE id = ?

-- name: read_for_move_skip_locked
-- The single writer holds every row: the same read.
SELECT {columns} FROM {table} WHERE id = ?

-- name: update_entity
UPDATE {table} SET {assignments}
WHERE id = ? AND status = ? AND version = ? {guards}
RETURNING {returning}

-- name: update_entity_unread
-- A move whose caller named the state it expects, not read first: the swap is the read.
UPDATE {table} SET version = version + 1, {assignments}
WHERE id = ? AND status = ? {guards}
RETURNING {returning}

-- name: update_entity_unread_skip_locked
-- The single writer holds every row: the same swap.
UPDATE {table} SET version = version + 1, {assignments}
WHERE id = ? AND status = ? {guards}
RETURNING {returning}

-- name: find_fact_by_idempotency_key
SELECT id, previous_status, status FROM status_transitions
WHERE entity_type = ? AND entity_id = ? AND idempotency_key = ?

-- name: append_fact
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: insert_entity
INSERT INTO {table} ({columns}) VALUES ({marks}){returning}

-- name: insert_entities
INSERT INTO {table} ({columns}) VALUES ({marks})

-- name: read_entities
SELECT {columns} FROM {table} WHERE id IN ({marks})

-- name: savepoint
SAVEPOINT ledgerq_scope

-- name: rollback_to_savepoint
ROLLBACK TO ledgerq_scope

-- name: release_savepoint
RELEASE ledgerq_scope

-- name: read_facts
SELECT * FROM status_transitions WHERE entity_type = ? AND entity_id = ?
ORDER BY entity_version

-- name: read_facts_of
SELECT * FROM status_transitions WHERE entity_type = ? AND entity_id IN ({marks})
ORDER BY entity_id, entity_version

-- name: stream_facts
-- Streamed from the unique (entity_type, entity_id, entity_version) index: no sort.
SELECT entity_id, status, entity_version, patch FROM status_transitions
WHERE entity_type = ? ORDER BY entity_id, entity_version

-- name: stream_entities
SELECT * FROM {table} ORDER BY id

-- name: defer_constraints
PRAGMA defer_foreign_keys = ON

-- name: delete_entities
DELETE FROM {table}
