-- SQLite's text of what submission calls (ledgerq/store/sqltx/submission.py).
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a ? parameter.

-- name: find_run_by_idempotency_key
SELECT id, application_digest FROM {table} WHERE idempotency_key = ?
