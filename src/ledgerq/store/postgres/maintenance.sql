-- PostgreSQL's text of what maintenance calls (ledgerq/store/sqltx/maintenance.py): the
-- sweeps and the archive.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a %s (psycopg) parameter.

-- name: list_expired_leases
SELECT {columns} FROM {table}
WHERE status = {running} AND lease_expires_at IS NOT NULL AND lease_expires_at < %s
LIMIT %s

-- name: list_due_retries
SELECT id, retry_due_at FROM {table}
WHERE status = {retry_wait} AND retry_due_at <= %s
LIMIT %s

-- name: list_due_starts
SELECT id, not_before FROM {table}
WHERE status = {delayed} AND not_before <= %s
LIMIT %s

-- name: list_settled_waiting
-- CASE: jsonb_array_elements_text must never see a depends_on that is not an array.
SELECT w.id FROM {table} AS w
WHERE w.status = {waiting_dependency}
  AND CASE WHEN jsonb_typeof(w.depends_on) = 'array'
      THEN (EXISTS (SELECT 1 FROM jsonb_array_elements_text(w.depends_on) AS j(value)
                    JOIN {table} AS d ON d.id = j.value WHERE d.status IN ({bad}))
            OR NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(w.depends_on) AS j(value)
                           LEFT JOIN {table} AS d ON d.id = j.value
                           WHERE NOT COALESCE(d.status IN ({met}), FALSE)))
      ELSE FALSE END
LIMIT %s

-- ------------------------------------------------------------ departed workers
-- (ledgerq/queue/maintenance/departed.py)

-- name: list_departed_workers
SELECT worker_id FROM workers WHERE last_heartbeat_at < %s ORDER BY worker_id LIMIT %s

-- name: delete_departed_workers
DELETE FROM workers WHERE last_heartbeat_at < %s RETURNING worker_id

-- ------------------------------------------------------------ the archive
-- (ledgerq/queue/maintenance/archive.py; the listed entities are ledgerq_archive_batch's rows)

-- name: mark_ended
-- A row that never moved has no updated_at: its creation stands in. A terminal row's
-- last move is its terminal fact (a terminal state has no outgoing edge). FOR UPDATE:
-- a chained run inserted meanwhile (its foreign key's KEY SHARE lock) waits for the
-- archive's commit and then fails, rather than referencing a deleted row.
INSERT INTO ledgerq_archive_batch (entity_type, entity_id)
SELECT %s, id FROM {table}
WHERE status IN ({marks}) AND COALESCE(updated_at, created_at) < %s
ORDER BY COALESCE(updated_at, created_at), id LIMIT %s
FOR UPDATE

-- name: list_marked
SELECT entity_id FROM ledgerq_archive_batch WHERE entity_type = %s

-- name: list_references
SELECT id, {column} FROM {table} WHERE {column} IS NOT NULL

-- name: list_depends_on
SELECT id, depends_on FROM {table} WHERE depends_on IS NOT NULL

-- name: list_marked_keyed
SELECT b.entity_id FROM ledgerq_archive_batch AS b JOIN {table} AS r ON r.id = b.entity_id
WHERE b.entity_type = %s AND r.idempotency_key IS NOT NULL AND r.created_at >= %s

-- name: list_leased_runs
SELECT leased_run_id FROM workers WHERE leased_run_id IS NOT NULL

-- name: unmark
DELETE FROM ledgerq_archive_batch WHERE entity_type = %s AND entity_id IN ({marks})

-- name: stream_marked_rows
SELECT r.* FROM ledgerq_archive_batch AS b JOIN {table} AS r ON r.id = b.entity_id
WHERE b.entity_type = %s ORDER BY b.entity_id

-- name: stream_marked_facts
SELECT f.id, f.entity_type, f.entity_id, f.previous_status, f.status, f.reason_code,
  f.reason_summary, f.evidence_refs, f.source, f.actor, f.created_at, f.metadata,
  f.entity_version, f.patch, f.idempotency_key
FROM ledgerq_archive_batch AS b
JOIN status_transitions AS f ON f.entity_type = b.entity_type AND f.entity_id = b.entity_id
WHERE b.entity_type = %s ORDER BY f.entity_id, f.entity_version

-- name: delete_marked_facts
-- Admitted by the log's DELETE guard only because each entity is listed.
DELETE FROM status_transitions
WHERE entity_type = %s AND entity_id IN (
  SELECT entity_id FROM ledgerq_archive_batch WHERE entity_type = %s)

-- name: delete_marked_rows
DELETE FROM {table} WHERE id IN (
  SELECT entity_id FROM ledgerq_archive_batch WHERE entity_type = %s)

-- name: clear_marks
DELETE FROM ledgerq_archive_batch

-- name: record_archive
INSERT INTO ledgerq_archives ({columns}) VALUES ({marks})

-- name: list_archives
SELECT * FROM ledgerq_archives ORDER BY created_at, id

-- name: lock_archives
-- One archive at a time (self-conflicting; released at commit).
LOCK TABLE ledgerq_archives IN SHARE ROW EXCLUSIVE MODE
