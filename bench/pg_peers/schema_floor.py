"""ledgerq's schema floor on PostgreSQL: ledgerq's rows and facts, written by the fewest
statements plain psycopg can write them with. A ceiling, not a system.

The batched floor (floor.py) writes a narrow job row and a log row of six columns. ledgerq
writes what its spec declares: a run row of 42 columns with its twelve indexes, and per
move a fact with the move's patch as JSON (the log that rebuilds every row), under a
unique (entity_type, entity_id, entity_version) index. This floor writes exactly those
rows and facts (the same columns, the same values, the same patch documents, checked
against what a ledgerq Worker writes by tests/project/test_bench_schema_floor.py), on ledgerq's
own schema, with none of ledgerq's Python and fewer statements than ledgerq sends:

  bulk    the rows and creation facts a submit_many of N writes (built first by
          ledgerq's own Python, untimed), written by two COPYs in one transaction: the
          least any statement can cost them, with no validation or row building at all.
          Its rate over PgQueuer's bulk enqueue bounds ledgerq's bulk submit
  fill    the same (untimed by the drains)
  drain   per pass, two transactions of one statement each: the claims of up to BATCH
          queued rows as one guarded ``UPDATE ... RETURNING`` (the next rows of the claim
          index's range after the worker's cursor, as ledgerq's claim_level reads them,
          ``FOR UPDATE SKIP LOCKED``, each row's lease token made by the server) with
          their facts inserted from its ``RETURNING`` in the same statement; then their
          terminal writes after exit 0, each row guarded by status, version and its own
          lease, with their facts, as one statement. No choice read, no heartbeat, no
          dependents check (ledgerq makes all three each pass): the floor only gets
          faster for it.

Whatever ledgerq's runtime did, a drain of ledgerq's rows and facts at ledgerq's
commits runs no faster than this on the same machine: its rate over PgQueuer's is the
bound of the PostgreSQL target for drains, and ledgerq over it the ratio that target asks
of the plain floor (>= 0.7x), against a floor that writes what ledgerq writes.
"""

from __future__ import annotations

import os
import time
from multiprocessing.synchronize import Barrier, Event

import psycopg

# At import, not in run_pass: a worker process imports this module before it waits on the
# harness's barrier, so ledgerq's import (~0.1 s) is not timed.
from ledgerq.lifecycle.engine import new_id
from pg_peers import ledgerq_units
from pg_peers.harness import BATCH, Peer

LEASE_TTL = ledgerq_units.LEASE_TTL
IDLE_SLEEP = 0.005
DONE_SQL = ledgerq_units.DONE_SQL
#: The drains only: its fill is ledgerq's submit_many, and a single submit's floor is
#: bench/postgres.py's ledgerq-sql (ledgerq's own statement).
SCENARIOS = ["submit bulk", "drain 1", "drain W"]
#: Non-NULL columns a submitted row leaves to their defaults: a creation fact's patch
#: names them with the values the database fills in.
DEFAULTED = {"lease_attempts": 0, "run_attempts": 0}
FACT_COLUMNS = ("id", "entity_type", "entity_id", "previous_status", "status",
                "reason_code", "reason_summary", "evidence_refs", "source", "actor",
                "created_at", "metadata", "entity_version", "patch", "idempotency_key")

_FACT_COLUMNS = ("id, entity_type, entity_id, previous_status, status, reason_code, "
                 "reason_summary, evidence_refs, source, actor, created_at, metadata, "
                 "entity_version, patch, idempotency_key")

#: The claims and their facts: the queue's and priority's range of the claim index, in
#: its (queued_at, id) order, after the worker's cursor; fact ids are v7 UUIDs made here,
#: paired with the claimed rows in id order (any pairing is a valid one: each is fresh).
CLAIM = f"""
WITH c AS (
  UPDATE schedule_runs r SET status = 'running', version = r.version + 1,
    updated_at = %(now)s, status_reason_code = 'run.started.ok',
    status_reason_summary = %(summary)s, status_evidence_refs = '[]',
    leased_by = %(me)s, lease_expires_at = %(expires)s,
    lease_token = md5(random()::text), lease_attempts = r.lease_attempts + 1
  WHERE r.id IN (SELECT id FROM schedule_runs
                 WHERE status = 'queued' AND queue = %(queue)s AND priority = %(priority)s
                   AND (queued_at, id) > (%(after_at)s, %(after_id)s)
                 ORDER BY queued_at, id LIMIT %(limit)s FOR UPDATE SKIP LOCKED)
    AND r.status = 'queued'
  RETURNING r.id, r.version, r.lease_token, r.lease_attempts, r.queued_at),
n AS (SELECT c.*, row_number() OVER (ORDER BY c.id) AS k FROM c),
f AS (
  INSERT INTO status_transitions ({_FACT_COLUMNS})
  SELECT i.fid, 'schedule_run', n.id, 'queued', 'running', 'run.started.ok', %(summary)s,
    '[]', 'system', %(me)s, %(now)s, '{{}}', n.version,
    jsonb_build_object('leased_by', %(me)s::text, 'updated_at', %(now)s::float8,
      'lease_token', n.lease_token, 'lease_attempts', n.lease_attempts,
      'lease_expires_at', %(expires)s::float8, 'status_reason_code', 'run.started.ok',
      'status_evidence_refs', '[]', 'status_reason_summary', %(summary)s::text), NULL
  FROM n JOIN unnest(%(fids)s::text[]) WITH ORDINALITY AS i(fid, k) USING (k))
SELECT id, version, lease_token, queued_at FROM n ORDER BY queued_at, id
"""

#: The terminal writes after exit 0 and their facts: each row guarded by its status,
#: version and lease (holder, token), as ledgerq's outcome is.
COMPLETE = f"""
WITH d AS (
  UPDATE schedule_runs r SET status = 'completed', version = r.version + 1,
    updated_at = %(now)s, status_reason_code = 'run.completed.ok',
    status_reason_summary = '', status_evidence_refs = '[]', ended_at = %(now)s,
    exit_code = 0, error_detail = NULL, run_attempts = r.run_attempts + 1,
    stdout_tail = NULL, stderr_tail = NULL
  FROM unnest(%(ids)s::text[], %(versions)s::bigint[], %(tokens)s::text[],
              %(fids)s::text[]) AS g(id, version, token, fid)
  WHERE r.id = g.id AND r.status = 'running' AND r.version = g.version
    AND r.leased_by = %(me)s AND r.lease_token = g.token
  RETURNING r.id, r.version, r.run_attempts, g.fid)
INSERT INTO status_transitions ({_FACT_COLUMNS})
SELECT d.fid, 'schedule_run', d.id, 'running', 'completed', 'run.completed.ok', '', '[]',
  'system', %(me)s, %(now)s, '{{}}', d.version,
  jsonb_build_object('ended_at', %(now)s::float8, 'exit_code', 0,
    'updated_at', %(now)s::float8, 'stderr_tail', NULL, 'stdout_tail', NULL,
    'error_detail', NULL, 'run_attempts', d.run_attempts,
    'status_reason_code', 'run.completed.ok', 'status_evidence_refs', '[]',
    'status_reason_summary', ''), NULL
FROM d RETURNING entity_id
"""


#: The fill's one queue and priority level: a claim reads one range of the claim index,
#: (queued_at, id) after the worker's cursor, as ledgerq's claim_level does.
QUEUE, PRIORITY = "default", 0
START = (float("-inf"), "")


class Cursor:
    """Where a worker's next claim starts: past the rows it has already claimed, so no
    claim walks the index entries of rows claimed before (ledgerq keeps one per pass)."""

    def __init__(self) -> None:
        self.after: tuple[float, str] = START


def run_pass(conn: psycopg.Connection[tuple[object, ...]], me: str, batch: int,
             cursor: Cursor) -> int:
    """One pass: up to ``batch`` claimed, then completed (two transactions); how many."""
    now = time.time()
    with conn.transaction():
        claimed = conn.execute(CLAIM, {
            "now": now, "summary": f"claimed by {me}", "me": me, "expires": now + LEASE_TTL,
            "queue": QUEUE, "priority": PRIORITY, "after_at": cursor.after[0],
            "after_id": cursor.after[1], "limit": batch,
            "fids": [new_id() for _ in range(batch)]}).fetchall()
    if not claimed:
        if cursor.after == START:
            return 0
        # Rows another worker held when this one passed them: look again from the head.
        cursor.after = START
        return run_pass(conn, me, batch, cursor)
    cursor.after = (claimed[-1][3], claimed[-1][0])
    # The tasks themselves are no-ops.
    now = time.time()
    with conn.transaction():
        done = conn.execute(COMPLETE, {
            "now": now, "me": me, "ids": [r[0] for r in claimed],
            "versions": [r[1] for r in claimed], "tokens": [r[2] for r in claimed],
            "fids": [new_id() for _ in claimed]}).fetchall()
    if len(done) != len(claimed):
        raise RuntimeError(f"lost the lease on {len(claimed) - len(done)} run(s)")
    return len(done)


def worker(dsn: str, idx: int, barrier: Barrier, stop: Event) -> None:
    me = f"schema-floor-{idx}-{os.getpid()}"
    cursor = Cursor()
    with psycopg.connect(dsn, autocommit=True) as conn:
        barrier.wait()
        while not stop.is_set():
            if not run_pass(conn, me, BATCH, cursor):
                time.sleep(IDLE_SLEEP)


def _no_submit(dsn: str, n: int) -> float:
    raise NotImplementedError("the schema floor measures bulk submits and drains only")


def submit_bulk(dsn: str, n: int) -> float:
    """Seconds for two COPYs of the rows and creation facts submit_many(n) writes."""
    import socket

    from ledgerq.codec import dumps
    from ledgerq.lifecycle.creation import _creation_row, _initial_patch
    from ledgerq.lifecycle.models import StateReason
    from ledgerq.lifecycle.registry import default_registry
    from ledgerq.queue import moves
    from ledgerq.queue.submission.application import DEFAULT_LIMITS, digest, validate
    from ledgerq.queue.submission.submit import SUBMITTER, run_row

    policy = default_registry().entity("schedule_run")
    reason = StateReason(code=moves.SUBMITTED.code)
    now, host = time.time(), socket.gethostname()
    app = validate(ledgerq_units._app(), limits=DEFAULT_LIMITS)
    rows = [_creation_row(policy, run_row(app, now, host, moves.SUBMITTED.target, [],
                                          digest(app), policy=policy), reason, now)
            for _ in range(n)]
    json = set(policy.json_columns)
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        # A fact's patch records a JSON column as the text the row stores (jsonb's own
        # spelling), as ledgerq's statement reads it back: asked of the server once per
        # distinct text, before the clock starts.
        stored = {text: cur.execute("SELECT %s::jsonb::text", (text,)).fetchone()[0]
                  for text in {v for r in rows for c, v in r.items()
                               if c in json and v is not None}}
        facts = [(new_id(), policy.name, r["id"], None, r["status"], reason.code,
                  reason.summary, "[]", SUBMITTER.type, SUBMITTER.id, now, "{}", 1,
                  dumps({**{c: stored[v] if c in json and v is not None else v
                            for c, v in _initial_patch(r, policy).items()}, **DEFAULTED}),
                  None) for r in rows]
        columns = ", ".join(rows[0])
        conn.commit()
        t0 = time.perf_counter()
        with cur.copy(f"COPY {policy.table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(tuple(row.values()))
        with cur.copy(f"COPY status_transitions ({', '.join(FACT_COLUMNS)}) FROM STDIN"
                      ) as copy:
            for fact in facts:
                copy.write_row(fact)
        conn.commit()
        return time.perf_counter() - t0


def peer() -> Peer:
    return Peer(name="schema floor", install=ledgerq_units.install,
                submit_single=_no_submit, submit_bulk=submit_bulk,
                worker=worker, done_sql=DONE_SQL)
