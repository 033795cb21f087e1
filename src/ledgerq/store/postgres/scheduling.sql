-- PostgreSQL's text of what the scheduler calls (ledgerq/store/sqltx/scheduling.py).
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a %s (psycopg) parameter.

-- name: read_latest_fire
-- The unique (schedule_id, slot_at) index answers it: one entry, read backwards.
SELECT id, status, slot_at, ended_at, exit_code FROM {table}
WHERE schedule_id = %s AND slot_at IS NOT NULL
ORDER BY slot_at DESC LIMIT 1

-- name: find_run_for_slot
SELECT id FROM {table} WHERE schedule_id = %s AND slot_at = %s

-- name: find_fire_in_progress
SELECT id FROM {table}
WHERE schedule_id = %s AND slot_at IS NOT NULL AND status NOT IN ({marks})
ORDER BY slot_at LIMIT 1
