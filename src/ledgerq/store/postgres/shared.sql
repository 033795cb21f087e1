-- PostgreSQL's text of what more than one wing of the queue calls
-- (ledgerq/store/sqltx/shared.py).
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a %s (psycopg) parameter.

-- name: and_at_least
-- A row that never moved has no updated_at (nor ended_at): its creation stands in.
AND COALESCE({column}, created_at) >= %s

-- name: read_entity
SELECT * FROM {table} WHERE id = %s

-- name: read_statuses
SELECT id, status FROM {table} WHERE id IN ({marks})

-- name: ensure_schedule
INSERT INTO schedules (id, name, created_at) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING

-- name: list_waiting_runs
SELECT id, depends_on FROM {table} WHERE status = {waiting_dependency} AND id IN ({marks})

-- name: list_dependents
-- jsonb containment: a depends_on that is not an array contains no id.
SELECT id, depends_on FROM {table}
WHERE status = {waiting_dependency} AND EXISTS (
    SELECT 1 FROM unnest(ARRAY[{marks}]::text[]) AS ended (id)
    WHERE depends_on @> jsonb_build_array(ended.id))

-- name: list_all_waiting
SELECT id, depends_on FROM {table} WHERE {hint} AND status = {waiting_dependency}

-- name: count_rows
SELECT COUNT(*) FROM {table} {where}

-- name: read_page
SELECT {columns} FROM {table} {where} ORDER BY created_at DESC, id DESC LIMIT %s OFFSET %s

-- name: stuck_undeclared
SELECT id, status, 'status ' || status || ' is not declared by the loaded specs' AS why
FROM {table} WHERE status NOT IN ({marks})

-- name: stuck_lease
-- Parameters: now - grace, grace. Expired that long before a live worker's heartbeat.
SELECT id, status, 'lease expired at ' || lease_expires_at || ' and was not reaped' AS why
FROM {table}
WHERE status = {running} AND lease_expires_at < %s
  AND EXISTS (SELECT 1 FROM workers AS w WHERE w.last_heartbeat_at - %s >
              GREATEST(lease_expires_at, COALESCE(w.started_at, lease_expires_at)))

-- name: stuck_retry
SELECT id, status, 'retry due at ' || retry_due_at || ' was not promoted' AS why
FROM {table}
WHERE status = {retry_wait} AND retry_due_at < %s
  AND EXISTS (SELECT 1 FROM workers AS w WHERE w.last_heartbeat_at - %s >
              GREATEST(retry_due_at, COALESCE(w.started_at, retry_due_at)))

-- name: stuck_waiting
SELECT id, status, 'depends_on is not valid JSON' AS why FROM {table}
WHERE status = {waiting_dependency}
  AND (depends_on IS NULL OR jsonb_typeof(depends_on) <> 'array')

-- name: stuck_held
-- Queued, yet holding a lease: the move that queued it kept the lease columns, and no
-- claim takes a row another worker holds.
SELECT id, status, 'queued but still holds the lease of ' || leased_by
  || ': no claim takes it (the move that queued it kept the lease)' AS why
FROM {table} WHERE status = {queued} AND leased_by IS NOT NULL

-- name: count_of
SELECT COUNT(*) FROM ({inner}) AS inner_rows

-- name: limited
{inner} LIMIT %s
