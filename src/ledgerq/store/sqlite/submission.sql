-- SQLite's text of what submission calls (ledgerq/store/sqltx/submission.py).
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a ? parameter.

-- name: find_run_by_idempotency_key
SELECT id, application_digest FROM {table} WHERE idempotency_key = ?

-- name: read_task_kinds
SELECT * FROM task_kinds
WHERE name IN ({marks}) ORDER BY name

-- name: read_all_task_kinds
SELECT * FROM task_kinds ORDER BY name

-- name: record_task_kind
INSERT INTO task_kinds (name, parameters, returns, queue, recorded_at, defaults)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (name) DO UPDATE SET parameters = excluded.parameters,
  returns = excluded.returns, queue = excluded.queue, recorded_at = excluded.recorded_at,
  defaults = excluded.defaults
