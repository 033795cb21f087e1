-- SQLite's text of what maintenance calls (ledgerq/store/sqltx/maintenance.py): the
-- sweeps and the archive.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a ? parameter.

-- name: list_expired_leases
SELECT {columns} FROM {table}
WHERE {hint} AND status = {running} AND lease_expires_at IS NOT NULL
  AND lease_expires_at < ?
LIMIT ?

-- name: list_due_retries
SELECT id, retry_due_at FROM {table}
WHERE {hint} AND status = {retry_wait} AND retry_due_at <= ?
LIMIT ?

-- name: list_due_starts
SELECT id, not_before FROM {table}
WHERE {hint} AND status = {delayed} AND not_before <= ?
LIMIT ?

-- name: list_settled_waiting
-- A waiting run settles when a dependency ended badly ({bad}: the terminal states whose
-- outcome is not succeeded) or every dependency is met ({met}: those whose outcome is;
-- a missing dependency is not); text that is not JSON never does.
SELECT id FROM {table}
WHERE {hint} AND status = {waiting_dependency}
  AND CASE WHEN json_valid({table}.depends_on)
      THEN (EXISTS (SELECT 1 FROM json_each({table}.depends_on) AS j
                    JOIN {table} AS d ON d.id = j.value WHERE d.status IN ({bad}))
            OR NOT EXISTS (SELECT 1 FROM json_each({table}.depends_on) AS j
                           LEFT JOIN {table} AS d ON d.id = j.value
                           WHERE NOT COALESCE(d.status IN ({met}), 0)))
      ELSE 0 END
LIMIT ?

-- ------------------------------------------------------------ departed workers
-- (ledgerq/queue/maintenance/departed.py)

-- name: list_departed_workers
SELECT worker_id FROM workers WHERE last_heartbeat_at < ? ORDER BY worker_id LIMIT ?

-- name: delete_departed_workers
DELETE FROM workers WHERE last_heartbeat_at < ? RETURNING worker_id

-- ------------------------------------------------------------ the archive
-- (ledgerq/queue/maintenance/archive.py; the listed entities are ledgerq_archive_batch's rows)

-- name: mark_ended
-- A row that never moved has no updated_at: its creation stands in. A terminal row's
-- last move is its terminal fact (a terminal state has no outgoing edge).
INSERT INTO ledgerq_archive_batch (entity_type, entity_id)
SELECT ?, id FROM {table}
WHERE status IN ({marks}) AND COALESCE(updated_at, created_at) < ?
ORDER BY COALESCE(updated_at, created_at), id LIMIT ?

-- name: list_marked
SELECT entity_id FROM ledgerq_archive_batch WHERE entity_type = ?

-- name: list_references
SELECT id, {column} FROM {table} WHERE {column} IS NOT NULL

-- name: list_depends_on
SELECT id, depends_on FROM {table} WHERE depends_on IS NOT NULL

-- name: list_marked_keyed
SELECT b.entity_id FROM ledgerq_archive_batch AS b JOIN {table} AS r ON r.id = b.entity_id
WHERE b.entity_type = ? AND r.idempotency_key IS NOT NULL AND r.created_at >= ?

-- name: list_leased_runs
SELECT leased_run_id FROM workers WHERE leased_run_id IS NOT NULL

-- name: unmark
DELETE FROM ledgerq_archive_batch WHERE entity_type = ? AND entity_id IN ({marks})

-- name: stream_marked_rows
SELECT r.* FROM ledgerq_archive_batch AS b JOIN {table} AS r ON r.id = b.entity_id
WHERE b.entity_type = ? ORDER BY b.entity_id

-- name: stream_marked_facts
SELECT f.id, f.entity_type, f.entity_id, f.previous_status, f.status, f.reason_code,
  f.reason_summary, f.evidence_refs, f.source, f.actor, f.created_at, f.metadata,
  f.entity_version, f.patch, f.idempotency_key
FROM ledgerq_archive_batch AS b
JOIN status_transitions AS f ON f.entity_type = b.entity_type AND f.entity_id = b.entity_id
WHERE b.entity_type = ? ORDER BY f.entity_id, f.entity_version

-- name: delete_marked_facts
-- Admitted by the log's DELETE guard only because each entity is listed.
DELETE FROM status_transitions
WHERE entity_type = ? AND entity_id IN (
  SELECT entity_id FROM ledgerq_archive_batch WHERE entity_type = ?)

-- name: delete_marked_rows
DELETE FROM {table} WHERE id IN (
  SELECT entity_id FROM ledgerq_archive_batch WHERE entity_type = ?)

-- name: clear_marks
DELETE FROM ledgerq_archive_batch

-- name: record_archive
INSERT INTO ledgerq_archives ({columns}) VALUES ({marks})

-- name: list_archives
SELECT * FROM ledgerq_archives ORDER BY created_at, id
