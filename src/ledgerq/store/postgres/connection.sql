-- PostgreSQL's text of the connection's own statements (store/postgres/backend.py): the
-- schema's creation and version, the wake-up channel, what a commit waits for,
-- forgetting prepared statements.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a %s (psycopg) parameter.

-- name: listen
LISTEN ledgerq_claimable

-- name: listen_ended
LISTEN ledgerq_ended

-- name: schema_lock
-- One creator at a time, however many hosts start at once (released at commit).
SELECT pg_advisory_xact_lock(hashtextextended('ledgerq schema', 0))

-- name: lock_for_migration
-- The tables a migration's DDL locks, taken at its start in the order every writer takes
-- them (a projection, then the log, then workers), in the mode that stops writers and
-- lets readers finish: DDL that took them in its own order (the log's triggers first)
-- would deadlock with a submit holding its projection and waiting for the log.
LOCK TABLE {tables} IN SHARE ROW EXCLUSIVE MODE

-- name: record_schema_version
-- Never lowered: a newer release's tables stay recorded as the newer version.
INSERT INTO ledgerq_schema (key, value) VALUES ('schema_version', %s)
ON CONFLICT (key) DO UPDATE SET value = excluded.value
WHERE ledgerq_schema.value::bigint < excluded.value::bigint

-- name: tables_present
SELECT table_name FROM information_schema.tables
WHERE table_schema = current_schema() AND table_name = ANY(%s)

-- name: set_timeouts
-- How long a statement waits for a lock before it fails (SQLite's busy timeout), and how
-- long this session may sit idle inside a transaction before the server ends it: a
-- client cut off mid-transaction (a network partition, a stopped process) then holds
-- its row locks no longer than others wait for them, instead of until TCP gives up.
SELECT set_config('lock_timeout', %s, false),
       set_config('idle_in_transaction_session_timeout', %s, false)

-- name: set_local_timeouts
-- The same for one transaction: behind a pooler in transaction mode, where a session's
-- settings stay on a server connection the next transaction may not get.
SELECT set_config('lock_timeout', %s, true),
       set_config('idle_in_transaction_session_timeout', %s, true)

-- name: durability
SHOW synchronous_commit

-- name: forget_prepared
-- Every prepared statement of this connection (psycopg clears its cache on it too).
DEALLOCATE ALL

-- name: in_recovery
-- Whether the server is a standby (a streaming replica): it takes no writes.
SELECT pg_is_in_recovery()

-- name: replica_as_of
-- A standby's reads are as of the last commit it replayed: now while it has replayed all
-- it received (an idle primary sends nothing), else that commit's time. NULL on a primary.
SELECT CASE WHEN NOT pg_is_in_recovery() THEN NULL
            WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn()
              THEN extract(epoch FROM now())::double precision
            ELSE extract(epoch FROM pg_last_xact_replay_timestamp())::double precision END
