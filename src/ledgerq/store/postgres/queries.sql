-- PostgreSQL's text of every named store operation (see ledgerq/store/queries.py).
-- {table}, {columns}, {hint} ... are filled with quoted, validated identifiers or with
-- other templates of this file; every value is a %s parameter (psycopg).

-- name: true
TRUE

-- name: status_in
status IN ({states})

-- name: assign
{column} = %s

-- name: guard_term
AND {column} IS NOT DISTINCT FROM %s

-- name: and_in_list
AND {column} IN ({marks})

-- name: and_at_least
-- A row that never moved has no updated_at (nor ended_at): its creation stands in.
AND COALESCE({column}, created_at) >= %s

-- name: where
WHERE TRUE {terms}

-- name: read_for_move
-- FOR UPDATE: a move reads the row it swaps under the row's lock, so two moves of one
-- row run one after the other, each checking the spec against the status the other left
-- (as under SQLite's single writer); the compare-and-swap stays as the second guard.
SELECT {columns} FROM {table} WHERE id = %s FOR UPDATE

-- name: read_for_move_skip_locked
-- A claimant's read: a row another transaction holds is skipped at once, never waited for.
SELECT {columns} FROM {table} WHERE id = %s FOR UPDATE SKIP LOCKED

-- name: update_entity
UPDATE {table} SET {assignments}
WHERE id = %s AND status = %s AND version = %s {guards}
RETURNING {returning}

-- name: update_entity_unread
-- A move whose caller named the state it expects, not read first: the swap is the read.
-- It waits for a row another transaction holds and then re-checks its WHERE against the
-- row as that one left it (READ COMMITTED), as the read FOR UPDATE would have.
UPDATE {table} SET version = version + 1, {assignments}
WHERE id = %s AND status = %s {guards}
RETURNING {returning}

-- name: update_entity_unread_skip_locked
-- A claimant's swap: a row another transaction holds matches nothing at once.
UPDATE {table} SET version = version + 1, {assignments}
WHERE id = (SELECT id FROM {table} WHERE id = %s FOR UPDATE SKIP LOCKED)
  AND status = %s {guards}
RETURNING {returning}

-- name: update_entity_with_fact
-- A move in one statement: {update} is one of the update_entity texts (RETURNING the
-- new version); the fact is inserted only if it matched, with that version.
WITH u AS ({update})
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
) SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, u.version, %s, %s FROM u
RETURNING entity_version

-- name: insert_entities_with_facts
-- A creation in one statement: the row, then its fact from the stored row, the patch
-- sent completed by {stored}: the columns whose stored form only the database knows.
WITH r AS (INSERT INTO {table} ({columns}) VALUES ({marks}) RETURNING *)
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
) SELECT %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,
         %s::jsonb || {stored}, %s FROM r

-- name: stored_object
-- At most 50 pairs each (a function takes at most 100 arguments).
jsonb_build_object({pairs})

-- name: stored_value
'{key}', r.{column}

-- name: stored_json_text
'{key}', r.{column}::text

-- name: claim_entities
-- Claimants' swaps of a pass's candidates in one statement. given: a JSON array of {id,
-- column: value}, one element a candidate in the given order, read back as the table's
-- row type; patches and guards: JSON objects of id -> {column: value}. pick locks the
-- candidates in the given order until the LIMIT is reached: a row another transaction
-- holds is skipped (SKIP LOCKED), and one that no longer has the status or a guard value
-- is dropped by the lock's re-check against its latest version without using a slot.
-- pick looks each candidate up by primary key, one after the other (a LATERAL subquery
-- that OFFSET 0 keeps from being merged into a join), and reads and locks no row past
-- the LIMIT, however deep the queue. The swap then finds the picked rows by key (= ANY
-- of their ids: no join to pick the planner could hash against the whole table), checks
-- status and guards once more, and takes each row's patch values from its own entry.
-- As joins, the planner read every row in the status (through its index, with
-- statistics taken while the queue was short: 21 ms a pass at 100k queued) or, while
-- the table was small, the whole table for every pass.
-- Parameters: given, observed, limit, to_state, the changes, patches (when the rows
-- patch a column: assign_from_doc), observed, guards (guard_from_doc).
WITH pick AS ({pick})
{swap}

-- name: claim_pick
-- claim_entities' pick: the candidates locked in order, up to the LIMIT.
SELECT l.id
FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb) WITH ORDINALITY AS c
CROSS JOIN LATERAL (
  SELECT t.id FROM {table} AS t WHERE t.id = c.id AND t.status = %s {pick_guards}
  OFFSET 0
) AS l
ORDER BY c.ordinality LIMIT %s
FOR UPDATE OF l SKIP LOCKED

-- name: claim_swap
-- claim_entities' swap of the picked rows.
UPDATE {table} AS t SET version = t.version + 1, status = %s, {assignments}
WHERE t.id = ANY(ARRAY(SELECT id FROM pick)) AND t.status IS NOT DISTINCT FROM %s
  AND {guard}
RETURNING t.*

-- name: claim_entities_with_facts
-- claim_entities, and the fact of each row it claimed, in one statement. The facts share
-- their fields but their id, the row's id, its new version and the patch's {stored}
-- part (stored_object's: the columns whose values differ from row to row, read from the
-- row as stored); the ids go to the claimed rows in any order (each is fresh).
-- Parameters: claim_entities', then the fact ids (an array), entity_type,
-- previous_status, status, reason_code, reason_summary, evidence_refs, source, actor,
-- created_at, metadata, the patch every fact shares, idempotency_key.
WITH pick AS ({pick}), s AS ({swap}), f AS (
  INSERT INTO status_transitions (
    id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
    evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
  ) SELECT (%s::text[])[row_number() OVER ()], %s, r.id, %s, %s, %s, %s, %s::jsonb, %s, %s,
           %s::double precision, %s::jsonb, r.version, %s::jsonb || {stored}, %s
  FROM s AS r
)
SELECT * FROM s

-- name: update_entities_with_facts
-- Several moves of one shape in one statement, each still its own guarded swap with its
-- own fact. Parameters: patches, ids, given, facts. patches: a JSON object of id ->
-- {status: the state moved to, column: value}; given: id -> {status: the state observed,
-- guard column: value}, both read back as the table's row type; ids: the rows' ids (one
-- primary-key lookup each, whatever the table's statistics say); facts: id -> its fact
-- as append_facts' array. Each row is swapped only where it still has the status and
-- guard values given; a row another transaction holds is waited for and re-checked
-- against its latest version, as a single UPDATE re-checks it. A fact is inserted only
-- for a row that moved, with the version it left. Returns each moved row's id and new
-- version.
WITH u AS (
  UPDATE {table} AS t SET version = t.version + 1, {assignment}
  WHERE t.id = ANY(%s::text[]) AND {guard}
  RETURNING t.id, t.version
), f AS (
  INSERT INTO status_transitions (
    id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
    evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
  ) SELECT {fields} FROM u CROSS JOIN LATERAL (SELECT %s::jsonb -> u.id AS f) AS a
)
SELECT id, version FROM u

-- name: guard_join
AND t.{column} IS NOT DISTINCT FROM {side}.{column}

-- name: assign_from_doc
-- Columns set from each row's own entry of a JSON object of id -> {column: value}, read
-- back as the table's row type (so every value gets its column's type).
({columns}) = (
  SELECT {values} FROM jsonb_populate_record(NULL::{table}, %s::jsonb -> t.id) AS p)

-- name: guard_from_doc
-- The row still has the values its own entry of a JSON object of id -> {column: value}
-- gives ({guards}: guard_join's, side g).
EXISTS (SELECT FROM jsonb_populate_record(NULL::{table}, %s::jsonb -> t.id) AS g
        WHERE true {guards})

-- name: find_fact_by_idempotency_key
SELECT id, previous_status, status FROM status_transitions
WHERE entity_type = %s AND entity_id = %s AND idempotency_key = %s

-- name: append_fact
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)

-- name: append_facts
-- Many facts in one statement, in order: one JSON array of them, each fact an array of
-- its fields in append_fact's order (the JSON columns as their text, so each is read as
-- append_fact reads it: text cast to jsonb, NULL as NULL).
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
) SELECT {fields}
FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS a (f, n)
ORDER BY n

-- name: fact_fields
-- A fact's fields from its JSON array f, in append_fact's order; {version} its
-- entity_version.
f->>0, f->>1, f->>2, f->>3, f->>4, f->>5, f->>6, (f->>7)::jsonb, f->>8, f->>9,
(f->>10)::double precision, (f->>11)::jsonb, {version}, (f->>13)::jsonb, f->>14

-- name: insert_entity
INSERT INTO {table} ({columns}) VALUES ({marks}){returning}

-- name: insert_entities
INSERT INTO {table} ({columns}) VALUES ({marks})

-- name: read_entities
SELECT {columns} FROM {table} WHERE id IN ({marks})

-- name: read_entity
SELECT * FROM {table} WHERE id = %s

-- name: read_statuses
SELECT id, status FROM {table} WHERE id IN ({marks})

-- name: savepoint
SAVEPOINT ledgerq_scope

-- name: rollback_to_savepoint
ROLLBACK TO SAVEPOINT ledgerq_scope

-- name: release_savepoint
RELEASE SAVEPOINT ledgerq_scope

-- name: find_run_by_idempotency_key
SELECT id, application_digest FROM {table} WHERE idempotency_key = %s

-- name: ensure_schedule
INSERT INTO schedules (id, name, created_at) VALUES (%s, %s, %s) ON CONFLICT (id) DO NOTHING

-- name: list_waiting_runs
SELECT id, depends_on FROM {table} WHERE status = 'waiting_dependency' AND id IN ({marks})

-- name: list_dependents
-- jsonb containment: a depends_on that is not an array contains no id.
SELECT id, depends_on FROM {table}
WHERE status = 'waiting_dependency' AND EXISTS (
    SELECT 1 FROM unnest(ARRAY[{marks}]::text[]) AS ended (id)
    WHERE depends_on @> jsonb_build_array(ended.id))

-- name: notify_claimable
-- Delivered at commit, once per transaction (PostgreSQL folds equal notifications).
SELECT pg_notify('ledgerq_claimable', '')

-- name: listen
LISTEN ledgerq_claimable

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

-- name: upsert_worker
INSERT INTO workers (worker_id, advertised_capabilities, execution_targets,
                     last_heartbeat_at, hostname, pid, started_at, queues)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT (worker_id) DO UPDATE SET
  advertised_capabilities = excluded.advertised_capabilities,
  execution_targets = excluded.execution_targets, queues = excluded.queues,
  last_heartbeat_at = excluded.last_heartbeat_at, pid = excluded.pid

-- name: read_worker_heartbeat
SELECT last_heartbeat_at FROM workers WHERE worker_id = %s

-- name: list_workers
SELECT worker_id, hostname, pid, last_heartbeat_at FROM workers ORDER BY worker_id

-- name: list_worker_rows
SELECT * FROM workers ORDER BY worker_id

-- name: request_worker_stop
UPDATE workers SET stop_requested_at = %s WHERE worker_id = %s RETURNING worker_id

-- name: read_worker_stop_request
SELECT stop_requested_at FROM workers WHERE worker_id = %s

-- name: list_expired_leases
SELECT {columns} FROM {table}
WHERE status = 'running' AND lease_expires_at IS NOT NULL AND lease_expires_at < %s
LIMIT %s

-- name: list_due_retries
SELECT id, retry_due_at FROM {table}
WHERE status = 'retry_wait' AND retry_due_at <= %s
LIMIT %s

-- name: list_due_starts
SELECT id, not_before FROM {table}
WHERE status = 'delayed' AND not_before <= %s
LIMIT %s

-- name: list_settled_waiting
-- CASE: jsonb_array_elements_text must never see a depends_on that is not an array.
SELECT w.id FROM {table} AS w
WHERE w.status = 'waiting_dependency'
  AND CASE WHEN jsonb_typeof(w.depends_on) = 'array'
      THEN (EXISTS (SELECT 1 FROM jsonb_array_elements_text(w.depends_on) AS j(value)
                    JOIN {table} AS d ON d.id = j.value WHERE d.status IN ({bad}))
            OR NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(w.depends_on) AS j(value)
                           LEFT JOIN {table} AS d ON d.id = j.value
                           WHERE NOT COALESCE(d.status IN ({met}), FALSE)))
      ELSE FALSE END
LIMIT %s

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
WHERE status = 'queued' AND queue = %s AND priority = %s
  AND (queued_at, id) > (%s, %s) AND {scope} {kinds}
ORDER BY queued_at, id LIMIT %s

-- name: claim_below
-- One queue's levels below a priority (none given: from the top), in claim order:
-- the index's own order, so no sort and no row past the LIMIT is read.
SELECT {columns} FROM {table}
WHERE status = 'queued' AND queue = %s {bound}
  AND queued_at IS NOT NULL AND {scope} {kinds}
ORDER BY priority DESC, queued_at, id LIMIT %s

-- name: priority_below
AND priority < %s

-- name: claim_unqueued
-- Specs without queues or priorities: (queued_at, id) order.
SELECT {columns} FROM {table}
WHERE status = 'queued' AND (queued_at, id) > (%s, %s) AND {scope} {kinds}
ORDER BY queued_at, id LIMIT %s

-- name: list_running_keys
SELECT DISTINCT concurrency_key FROM {table}
WHERE status = 'running' AND concurrency_key IS NOT NULL

-- name: is_key_running
SELECT 1 FROM {table} WHERE concurrency_key = %s AND status = 'running' LIMIT 1

-- name: lock_key
SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))

-- name: read_leases
SELECT {columns} FROM {table} WHERE id IN ({marks})

-- name: read_facts
SELECT * FROM status_transitions WHERE entity_type = %s AND entity_id = %s
ORDER BY entity_version

-- name: read_facts_after
-- Fact ids are time-ordered (UUIDv7): the primary key's index reads them in log order.
SELECT * FROM status_transitions WHERE id > %s AND entity_type = %s ORDER BY id LIMIT %s

-- name: stream_facts
SELECT entity_id, status, entity_version, patch FROM status_transitions
WHERE entity_type = %s ORDER BY entity_id, entity_version

-- name: stream_entities
SELECT * FROM {table} ORDER BY id

-- name: count_facts
SELECT COUNT(*) FROM status_transitions

-- name: defer_constraints
SET CONSTRAINTS ALL DEFERRED

-- name: delete_entities
DELETE FROM {table}

-- name: count_rows
SELECT COUNT(*) FROM {table} {where}

-- name: read_page
SELECT {columns} FROM {table} {where} ORDER BY created_at DESC, id DESC LIMIT %s OFFSET %s

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

-- name: find_oldest_queued_at
-- Specs without queues and priorities: one step into their (queued_at) index.
SELECT MIN(queued_at) FROM {table} WHERE status = 'queued'

-- name: queued_level_first
-- The oldest queued run, found without an index of its own: a loose scan of the claim
-- order's index, one (queue, priority) level at a time (a handful of probes, each one
-- step into the index), then each level's oldest row.
SELECT queue, priority FROM {table} WHERE status = 'queued'
ORDER BY queue, priority DESC LIMIT 1

-- name: queued_level_next_queue
SELECT queue, priority FROM {table} WHERE status = 'queued' AND queue > %s
ORDER BY queue, priority DESC LIMIT 1

-- name: queued_level_below
SELECT priority FROM {table}
WHERE status = 'queued' AND queue = %s AND priority < %s
ORDER BY priority DESC LIMIT 1

-- name: queued_level_oldest
SELECT queued_at FROM {table}
WHERE status = 'queued' AND queue = %s AND priority = %s AND queued_at IS NOT NULL
ORDER BY queued_at LIMIT 1

-- name: count_running_by_worker
SELECT leased_by, COUNT(*) FROM {table}
WHERE status = 'running' AND leased_by IS NOT NULL
GROUP BY leased_by ORDER BY leased_by

-- name: stuck_undeclared
SELECT id, status, 'status ' || status || ' is not declared by the loaded specs' AS why
FROM {table} WHERE status NOT IN ({marks})

-- name: stuck_lease
-- Parameters: now - grace, grace. Expired that long before a live worker's heartbeat.
SELECT id, status, 'lease expired at ' || lease_expires_at || ' and was not reaped' AS why
FROM {table}
WHERE status = 'running' AND lease_expires_at < %s
  AND EXISTS (SELECT 1 FROM workers AS w WHERE w.last_heartbeat_at - %s >
              GREATEST(lease_expires_at, COALESCE(w.started_at, lease_expires_at)))

-- name: stuck_retry
SELECT id, status, 'retry due at ' || retry_due_at || ' was not promoted' AS why
FROM {table}
WHERE status = 'retry_wait' AND retry_due_at < %s
  AND EXISTS (SELECT 1 FROM workers AS w WHERE w.last_heartbeat_at - %s >
              GREATEST(retry_due_at, COALESCE(w.started_at, retry_due_at)))

-- name: stuck_waiting
SELECT id, status, 'depends_on is not valid JSON' AS why FROM {table}
WHERE status = 'waiting_dependency'
  AND (depends_on IS NULL OR jsonb_typeof(depends_on) <> 'array')

-- name: count_of
SELECT COUNT(*) FROM ({inner}) AS inner_rows

-- name: limited
{inner} LIMIT %s

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

-- name: durability
SHOW synchronous_commit

-- ---------------------------------------------------------------- migrations
-- Spec evolution (store/migrate.py, store/sqlcatalog.py): the recorded specs, what a
-- plan asks of the data, and reading the schema back.

-- name: recorded_specs
SELECT entity, spec FROM ledgerq_specs

-- name: record_spec
INSERT INTO ledgerq_specs (entity, table_name, spec_hash, spec, migrated_at)
VALUES (%s, %s, %s, %s, %s) ON CONFLICT (entity) DO UPDATE SET
  table_name = excluded.table_name, spec_hash = excluded.spec_hash,
  spec = excluded.spec, migrated_at = excluded.migrated_at

-- name: record_spec_version
INSERT INTO ledgerq_spec_versions (entity, spec_hash, spec, recorded_at)
VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING

-- name: forget_spec
DELETE FROM ledgerq_specs WHERE entity = %s

-- name: count_where
SELECT count(*) FROM {table} WHERE {where}

-- name: ids_where
SELECT id FROM {table} WHERE {where} ORDER BY id {limit}

-- name: tables
SELECT tablename FROM pg_tables WHERE schemaname = current_schema()

-- name: status_check
-- The status column's CHECK (PostgreSQL names it; a long table name truncates it).
SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
WHERE conrelid = to_regclass(%s) AND contype = 'c' AND pg_get_constraintdef(oid) LIKE %s

-- name: table_columns
SELECT column_name FROM information_schema.columns
WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position

-- name: table_indexes
SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = %s

-- name: forget_prepared
-- Every prepared statement of this connection (psycopg clears its cache on it too).
DEALLOCATE ALL

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

-- name: unmark_referenced
DELETE FROM ledgerq_archive_batch
WHERE entity_type = %s AND entity_id IN (
  SELECT r.{column} FROM {table} AS r
  WHERE r.{column} IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM ledgerq_archive_batch AS b WHERE b.entity_type = %s AND b.entity_id = r.id))

-- name: unmark_dependencies
-- A depends_on that is not an array names no run.
DELETE FROM ledgerq_archive_batch
WHERE entity_type = %s AND entity_id IN (
  SELECT j.value FROM {table} AS r, jsonb_array_elements_text(CASE
    WHEN jsonb_typeof(r.depends_on) = 'array' THEN r.depends_on ELSE '[]'::jsonb END) AS j
  WHERE r.depends_on IS NOT NULL AND NOT EXISTS (
    SELECT 1 FROM ledgerq_archive_batch AS b WHERE b.entity_type = %s AND b.entity_id = r.id))

-- name: unmark_leased
DELETE FROM ledgerq_archive_batch
WHERE entity_type = %s AND entity_id IN (
  SELECT leased_run_id FROM workers WHERE leased_run_id IS NOT NULL)

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
