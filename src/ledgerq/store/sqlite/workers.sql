-- SQLite's text of what a worker calls (ledgerq/store/sqltx/workers.py): heartbeats,
-- the claim scan, concurrency keys, leases, stop requests.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a ? parameter.

-- name: upsert_worker
INSERT INTO workers (worker_id, advertised_capabilities, execution_targets,
                     last_heartbeat_at, hostname, pid, started_at, queues, kinds)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (worker_id) DO UPDATE SET
  advertised_capabilities = excluded.advertised_capabilities,
  execution_targets = excluded.execution_targets, queues = excluded.queues,
  last_heartbeat_at = excluded.last_heartbeat_at, pid = excluded.pid,
  kinds = excluded.kinds

-- name: read_worker_heartbeat
SELECT last_heartbeat_at FROM workers WHERE worker_id = ?

-- name: request_worker_stop
UPDATE workers SET stop_requested_at = ? WHERE worker_id = ? RETURNING worker_id

-- name: read_worker_stop_request
SELECT stop_requested_at FROM workers WHERE worker_id = ?

-- name: kinds_excluded
AND action_kind NOT IN ({marks})

-- name: kinds_only
AND action_kind IN ({marks})

-- name: claimable_unscheduled
schedule_id IS NULL

-- name: claimable_scheduled
(schedule_id IS NULL OR slot_at IS NOT NULL)

-- name: claim_level
-- The rest of one priority level of one queue, after a (queued_at, id) cursor: one
-- range of idx_schedule_runs_claim_order, read in order.
SELECT {columns} FROM {table}
WHERE {hint} AND status = {queued} AND queue = ? AND priority = ?
  AND (queued_at, id) > (?, ?) AND {scope} {kinds}
ORDER BY queued_at, id LIMIT ?

-- name: claim_below
-- One queue's levels below a priority (none given: from the top), in claim order:
-- the index's own order, so no sort and no row past the LIMIT is read.
SELECT {columns} FROM {table}
WHERE {hint} AND status = {queued} AND queue = ? {bound}
  AND queued_at IS NOT NULL AND {scope} {kinds}
ORDER BY priority DESC, queued_at, id LIMIT ?

-- name: priority_below
AND priority < ?

-- name: claim_unqueued
-- Specs without queues or priorities: (queued_at, id) order.
SELECT {columns} FROM {table}
WHERE {hint} AND status = {queued} AND (queued_at, id) > (?, ?) AND {scope} {kinds}
ORDER BY queued_at, id LIMIT ?

-- name: list_running_keys
SELECT DISTINCT concurrency_key FROM {table}
WHERE {hint} AND status = {running} AND concurrency_key IS NOT NULL

-- name: is_key_running
SELECT 1 FROM {table}
WHERE {hint} AND concurrency_key = ? AND status = {running} LIMIT 1

-- name: read_leases
SELECT {columns} FROM {table} WHERE id IN ({marks})
