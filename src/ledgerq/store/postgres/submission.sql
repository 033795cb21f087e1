-- PostgreSQL's text of what submission calls (ledgerq/store/sqltx/submission.py).
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a %s (psycopg) parameter.

-- name: find_run_by_idempotency_key
SELECT id, application_digest FROM {table} WHERE idempotency_key = %s

-- name: notify_claimable
-- Delivered at commit, once per transaction (PostgreSQL folds equal notifications).
SELECT pg_notify('ledgerq_claimable', '')
