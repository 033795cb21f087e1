-- PostgreSQL's text of what the read models call (ledgerq/store/sqltx/reads.py).
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a %s (psycopg) parameter.

-- name: list_workers
SELECT worker_id, hostname, pid, last_heartbeat_at FROM workers ORDER BY worker_id

-- name: list_worker_rows
SELECT * FROM workers ORDER BY worker_id

-- name: read_facts_after
-- Fact ids are time-ordered (UUIDv7): the primary key's index reads them in log order.
SELECT * FROM status_transitions WHERE id > %s AND entity_type = %s ORDER BY id LIMIT %s

-- name: count_facts
SELECT COUNT(*) FROM status_transitions

-- name: and_before
AND (created_at, id) < (%s, %s)

-- name: read_page_before
SELECT {columns} FROM {table} {where} ORDER BY created_at DESC, id DESC LIMIT %s

-- name: count_facts_by_reason
SELECT entity_type, reason_code, COUNT(*) FROM status_transitions
GROUP BY entity_type, reason_code ORDER BY entity_type, reason_code

-- name: wait_bucket
, SUM(CASE WHEN waited <= %s THEN 1 ELSE 0 END)

-- name: read_wait_histogram
-- Each fact joined to the entity's previous one through the log's unique
-- (entity_type, entity_id, entity_version) index. Parameters: the bounds, then
-- entity_type and reason_code.
SELECT COUNT(*), SUM(waited) {buckets} FROM (
  SELECT f.created_at - p.created_at AS waited
  FROM status_transitions AS f
  JOIN status_transitions AS p ON p.entity_type = f.entity_type
    AND p.entity_id = f.entity_id AND p.entity_version = f.entity_version - 1
  WHERE f.entity_type = %s AND f.reason_code = %s
) AS w

-- name: ids_like
SELECT id FROM {table} WHERE id LIKE %s ORDER BY id LIMIT %s

-- name: count_statuses
SELECT status, COUNT(*) FROM {table} GROUP BY status

-- name: list_queued_kinds
SELECT DISTINCT action_kind FROM {table} WHERE status = {queued}

-- name: find_oldest_queued_at
-- Specs without queues and priorities: one step into their (queued_at) index.
SELECT MIN(queued_at) FROM {table} WHERE status = {queued}

-- name: queued_level_first
-- The oldest queued run, found without an index of its own: a loose scan of the claim
-- order's index, one (queue, priority) level at a time (a handful of probes, each one
-- step into the index), then each level's oldest row.
SELECT queue, priority FROM {table} WHERE status = {queued}
ORDER BY queue, priority DESC LIMIT 1

-- name: queued_level_next_queue
SELECT queue, priority FROM {table} WHERE status = {queued} AND queue > %s
ORDER BY queue, priority DESC LIMIT 1

-- name: queued_level_below
SELECT priority FROM {table}
WHERE status = {queued} AND queue = %s AND priority < %s
ORDER BY priority DESC LIMIT 1

-- name: queued_level_oldest
SELECT queued_at FROM {table}
WHERE status = {queued} AND queue = %s AND priority = %s AND queued_at IS NOT NULL
ORDER BY queued_at LIMIT 1

-- name: count_running_by_worker
SELECT leased_by, COUNT(*) FROM {table}
WHERE status = {running} AND leased_by IS NOT NULL
GROUP BY leased_by ORDER BY leased_by
