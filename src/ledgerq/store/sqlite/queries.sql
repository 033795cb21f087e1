-- SQLite's text of every named store operation (see ledgerq/store/queries.py).
-- {table}, {columns}, {hint} ... are filled with quoted, validated identifiers or with
-- other templates of this file; every value is a ? parameter.

-- name: true
1

-- name: status_in
status IN ({states})

-- name: assign
{column} = ?

-- name: guard_term
AND {column} IS ?

-- name: and_in_list
AND {column} IN ({marks})

-- name: and_at_least
-- A row that never moved has no updated_at (nor ended_at): its creation stands in.
AND COALESCE({column}, created_at) >= ?

-- name: where
WHERE 1 {terms}

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

-- name: read_entity
SELECT * FROM {table} WHERE id = ?

-- name: read_statuses
SELECT id, status FROM {table} WHERE id IN ({marks})

-- name: savepoint
SAVEPOINT ledgerq_scope

-- name: rollback_to_savepoint
ROLLBACK TO ledgerq_scope

-- name: release_savepoint
RELEASE ledgerq_scope

-- name: find_run_by_idempotency_key
SELECT id, application_digest FROM {table} WHERE idempotency_key = ?

-- name: ensure_schedule
INSERT INTO schedules (id, name, created_at) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING

-- name: list_waiting_runs
SELECT id, depends_on FROM {table} WHERE status = 'waiting_dependency' AND id IN ({marks})

-- name: list_dependents
-- CASE: json_each must never see text that is not JSON (it would fail the statement).
SELECT id, depends_on FROM {table}
WHERE {hint} AND status = 'waiting_dependency'
  AND CASE WHEN json_valid(depends_on)
      THEN EXISTS (SELECT 1 FROM json_each({table}.depends_on) WHERE value IN ({marks}))
      ELSE 0 END

-- name: read_latest_fire
-- The unique (schedule_id, slot_at) index answers it: one entry, read backwards.
SELECT id, status, slot_at, ended_at, exit_code FROM {table}
WHERE schedule_id = ? AND slot_at IS NOT NULL
ORDER BY slot_at DESC LIMIT 1

-- name: find_run_for_slot
SELECT id FROM {table} WHERE schedule_id = ? AND slot_at = ?

-- name: find_fire_in_progress
SELECT id FROM {table}
WHERE schedule_id = ? AND slot_at IS NOT NULL AND status NOT IN ({marks})
ORDER BY slot_at LIMIT 1

-- name: upsert_worker
INSERT INTO workers (worker_id, advertised_capabilities, execution_targets,
                     last_heartbeat_at, hostname, pid, started_at, queues)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (worker_id) DO UPDATE SET
  advertised_capabilities = excluded.advertised_capabilities,
  execution_targets = excluded.execution_targets, queues = excluded.queues,
  last_heartbeat_at = excluded.last_heartbeat_at, pid = excluded.pid

-- name: read_worker_heartbeat
SELECT last_heartbeat_at FROM workers WHERE worker_id = ?

-- name: list_workers
SELECT worker_id, hostname, pid, last_heartbeat_at FROM workers ORDER BY worker_id

-- name: list_worker_rows
SELECT * FROM workers ORDER BY worker_id

-- name: request_worker_stop
UPDATE workers SET stop_requested_at = ? WHERE worker_id = ? RETURNING worker_id

-- name: read_worker_stop_request
SELECT stop_requested_at FROM workers WHERE worker_id = ?

-- name: list_expired_leases
SELECT {columns} FROM {table}
WHERE {hint} AND status = 'running' AND lease_expires_at IS NOT NULL
  AND lease_expires_at < ?
LIMIT ?

-- name: list_due_retries
SELECT id, retry_due_at FROM {table}
WHERE {hint} AND status = 'retry_wait' AND retry_due_at <= ?
LIMIT ?

-- name: list_due_starts
SELECT id, not_before FROM {table}
WHERE {hint} AND status = 'delayed' AND not_before <= ?
LIMIT ?

-- name: list_settled_waiting
-- A waiting run settles when a dependency ended badly ({bad}: the terminal states whose
-- outcome is not succeeded) or every dependency is met ({met}: those whose outcome is;
-- a missing dependency is not); text that is not JSON never does.
SELECT id FROM {table}
WHERE {hint} AND status = 'waiting_dependency'
  AND CASE WHEN json_valid({table}.depends_on)
      THEN (EXISTS (SELECT 1 FROM json_each({table}.depends_on) AS j
                    JOIN {table} AS d ON d.id = j.value WHERE d.status IN ({bad}))
            OR NOT EXISTS (SELECT 1 FROM json_each({table}.depends_on) AS j
                           LEFT JOIN {table} AS d ON d.id = j.value
                           WHERE NOT COALESCE(d.status IN ({met}), 0)))
      ELSE 0 END
LIMIT ?

-- name: kinds_excluded
AND action_kind NOT IN ({marks})

-- name: claimable_unscheduled
schedule_id IS NULL

-- name: claimable_scheduled
(schedule_id IS NULL OR slot_at IS NOT NULL)

-- name: claim_level
-- The rest of one priority level of one queue, after a (queued_at, id) cursor: one
-- range of idx_schedule_runs_claim_order, read in order.
SELECT {columns} FROM {table}
WHERE {hint} AND status = 'queued' AND queue = ? AND priority = ?
  AND (queued_at, id) > (?, ?) AND {scope} {kinds}
ORDER BY queued_at, id LIMIT ?

-- name: claim_below
-- One queue's levels below a priority (none given: from the top), in claim order:
-- the index's own order, so no sort and no row past the LIMIT is read.
SELECT {columns} FROM {table}
WHERE {hint} AND status = 'queued' AND queue = ? {bound}
  AND queued_at IS NOT NULL AND {scope} {kinds}
ORDER BY priority DESC, queued_at, id LIMIT ?

-- name: priority_below
AND priority < ?

-- name: claim_unqueued
-- Specs without queues or priorities: (queued_at, id) order.
SELECT {columns} FROM {table}
WHERE {hint} AND status = 'queued' AND (queued_at, id) > (?, ?) AND {scope} {kinds}
ORDER BY queued_at, id LIMIT ?

-- name: list_running_keys
SELECT DISTINCT concurrency_key FROM {table}
WHERE {hint} AND status = 'running' AND concurrency_key IS NOT NULL

-- name: is_key_running
SELECT 1 FROM {table}
WHERE {hint} AND concurrency_key = ? AND status = 'running' LIMIT 1

-- name: read_leases
SELECT {columns} FROM {table} WHERE id IN ({marks})

-- name: read_facts
SELECT * FROM status_transitions WHERE entity_type = ? AND entity_id = ?
ORDER BY entity_version

-- name: read_facts_after
-- Fact ids are time-ordered (UUIDv7): the primary key's index reads them in log order.
SELECT * FROM status_transitions WHERE id > ? AND entity_type = ? ORDER BY id LIMIT ?

-- name: stream_facts
-- Streamed from the unique (entity_type, entity_id, entity_version) index: no sort.
SELECT entity_id, status, entity_version, patch FROM status_transitions
WHERE entity_type = ? ORDER BY entity_id, entity_version

-- name: stream_entities
SELECT * FROM {table} ORDER BY id

-- name: count_facts
SELECT COUNT(*) FROM status_transitions

-- name: defer_constraints
PRAGMA defer_foreign_keys = ON

-- name: delete_entities
DELETE FROM {table}

-- name: count_rows
SELECT COUNT(*) FROM {table} {where}

-- name: read_page
SELECT {columns} FROM {table} {where} ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?

-- name: and_before
AND (created_at, id) < (?, ?)

-- name: read_page_before
SELECT {columns} FROM {table} {where} ORDER BY created_at DESC, id DESC LIMIT ?

-- name: count_facts_by_reason
SELECT entity_type, reason_code, COUNT(*) FROM status_transitions
GROUP BY entity_type, reason_code ORDER BY entity_type, reason_code

-- name: wait_bucket
, SUM(CASE WHEN waited <= ? THEN 1 ELSE 0 END)

-- name: read_wait_histogram
-- Each fact joined to the entity's previous one through the log's unique
-- (entity_type, entity_id, entity_version) index. Parameters: the bounds, then
-- entity_type and reason_code.
SELECT COUNT(*), SUM(waited) {buckets} FROM (
  SELECT f.created_at - p.created_at AS waited
  FROM status_transitions AS f
  JOIN status_transitions AS p ON p.entity_type = f.entity_type
    AND p.entity_id = f.entity_id AND p.entity_version = f.entity_version - 1
  WHERE f.entity_type = ? AND f.reason_code = ?
) AS w

-- name: ids_like
SELECT id FROM {table} WHERE id LIKE ? ORDER BY id LIMIT ?

-- name: count_statuses
SELECT status, COUNT(*) FROM {table} GROUP BY status

-- name: find_oldest_queued_at
-- Specs without queues and priorities: one step into their (queued_at) index.
SELECT MIN(queued_at) FROM {table} WHERE {hint} AND status = 'queued'

-- name: queued_level_first
-- The oldest queued run, found without an index of its own: a loose scan of the claim
-- order's index, one (queue, priority) level at a time (a handful of probes, each one
-- step into the index), then each level's oldest row.
SELECT queue, priority FROM {table} WHERE {hint} AND status = 'queued'
ORDER BY queue, priority DESC LIMIT 1

-- name: queued_level_next_queue
SELECT queue, priority FROM {table} WHERE {hint} AND status = 'queued' AND queue > ?
ORDER BY queue, priority DESC LIMIT 1

-- name: queued_level_below
SELECT priority FROM {table}
WHERE {hint} AND status = 'queued' AND queue = ? AND priority < ?
ORDER BY priority DESC LIMIT 1

-- name: queued_level_oldest
SELECT queued_at FROM {table}
WHERE {hint} AND status = 'queued' AND queue = ? AND priority = ? AND queued_at IS NOT NULL
ORDER BY queued_at LIMIT 1

-- name: count_running_by_worker
SELECT leased_by, COUNT(*) FROM {table}
WHERE {hint} AND status = 'running' AND leased_by IS NOT NULL
GROUP BY leased_by ORDER BY leased_by

-- name: stuck_undeclared
SELECT id, status, 'status ' || status || ' is not declared by the loaded specs' AS why
FROM {table} WHERE status NOT IN ({marks})

-- name: stuck_lease
-- Parameters: now - grace, grace. Expired that long before a live worker's heartbeat.
SELECT id, status, 'lease expired at ' || lease_expires_at || ' and was not reaped' AS why
FROM {table}
WHERE {hint} AND status = 'running' AND lease_expires_at < ?
  AND EXISTS (SELECT 1 FROM workers AS w WHERE w.last_heartbeat_at - ? >
              max(lease_expires_at, COALESCE(w.started_at, lease_expires_at)))

-- name: stuck_retry
SELECT id, status, 'retry due at ' || retry_due_at || ' was not promoted' AS why
FROM {table}
WHERE {hint} AND status = 'retry_wait' AND retry_due_at < ?
  AND EXISTS (SELECT 1 FROM workers AS w WHERE w.last_heartbeat_at - ? >
              max(retry_due_at, COALESCE(w.started_at, retry_due_at)))

-- name: stuck_waiting
SELECT id, status, 'depends_on is not valid JSON' AS why FROM {table}
WHERE {hint} AND status = 'waiting_dependency' AND NOT COALESCE(json_valid(depends_on), 0)

-- name: count_of
SELECT COUNT(*) FROM ({inner})

-- name: limited
{inner} LIMIT ?

-- ---------------------------------------------------------------- migrations
-- Spec evolution (store/migrate.py, store/sqlcatalog.py): the recorded specs, what a
-- plan asks of the data, and reading the schema back.

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

-- ------------------------------------------------------------ the archive
-- (ledgerq/queue/maintenance/archive.py; the listed entities are ledgerq_archive_batch's rows)

-- name: mark_ended
-- A row that never moved has no updated_at: its creation stands in. A terminal row's
-- last move is its terminal fact (a terminal state has no outgoing edge).
INSERT INTO ledgerq_archive_batch (entity_type, entity_id)
SELECT ?, id FROM {table}
WHERE status IN ({marks}) AND COALESCE(updated_at, created_at) < ?
ORDER BY COALESCE(updated_at, created_at), id LIMIT ?

-- name: unmark_referenced
DELETE FROM ledgerq_archive_batch
WHERE entity_type = ? AND entity_id IN (
  SELECT r.{column} FROM {table} AS r
  WHERE r.{column} IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM ledgerq_archive_batch AS b WHERE b.entity_type = ? AND b.entity_id = r.id))

-- name: unmark_dependencies
-- CASE: json_each must never see text that is not JSON (it would fail the statement).
DELETE FROM ledgerq_archive_batch
WHERE entity_type = ? AND entity_id IN (
  SELECT j.value FROM {table} AS r,
    json_each(CASE WHEN json_valid(r.depends_on) THEN r.depends_on ELSE '[]' END) AS j
  WHERE r.depends_on IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM ledgerq_archive_batch AS b WHERE b.entity_type = ? AND b.entity_id = r.id))

-- name: unmark_leased
DELETE FROM ledgerq_archive_batch
WHERE entity_type = ? AND entity_id IN (
  SELECT leased_run_id FROM workers WHERE leased_run_id IS NOT NULL)

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
