-- PostgreSQL's text of the engine's operations (ledgerq/store/sqltx/events.py): moves,
-- claims, creation, the log, and what verify and rebuild read and write.
-- Named templates (see ledgerq/store/queries.py): {table}, {columns}, {hint} ... are
-- filled with quoted, validated identifiers or with other templates of the dialect;
-- every value is a %s (psycopg) parameter.

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

-- name: copy_entities
-- Many creations' rows (insert_entities_with_facts), then copy_facts their facts.
COPY {table} ({columns}) FROM STDIN

-- name: copy_facts
COPY status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
) FROM STDIN

-- name: jsonb_spellings
-- Each JSON text as a jsonb column stores and prints it (keys sorted and unique,
-- PostgreSQL's own spacing and numbers): what a creation fact's patch records.
SELECT t, t::jsonb::text FROM unnest(%s::text[]) AS t

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
-- entity_version, {patch} its patch.
f->>0, f->>1, f->>2, f->>3, f->>4, f->>5, f->>6, (f->>7)::jsonb, f->>8, f->>9,
(f->>10)::double precision, (f->>11)::jsonb, {version}, {patch}, f->>14

-- name: insert_entity
INSERT INTO {table} ({columns}) VALUES ({marks}){returning}

-- name: insert_entities
INSERT INTO {table} ({columns}) VALUES ({marks})

-- name: read_entities
SELECT {columns} FROM {table} WHERE id IN ({marks})

-- name: savepoint
SAVEPOINT ledgerq_scope

-- name: rollback_to_savepoint
ROLLBACK TO SAVEPOINT ledgerq_scope

-- name: release_savepoint
RELEASE SAVEPOINT ledgerq_scope

-- name: lock_key
SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))

-- name: read_facts
SELECT * FROM status_transitions WHERE entity_type = %s AND entity_id = %s
ORDER BY entity_version

-- name: read_facts_of
SELECT * FROM status_transitions WHERE entity_type = %s AND entity_id IN ({marks})
ORDER BY entity_id, entity_version

-- name: stream_facts
SELECT entity_id, status, entity_version, patch FROM status_transitions
WHERE entity_type = %s ORDER BY entity_id, entity_version

-- name: stream_entities
SELECT * FROM {table} ORDER BY id

-- name: defer_constraints
SET CONSTRAINTS ALL DEFERRED

-- name: delete_entities
DELETE FROM {table}
