"""The schema floor: ledgerq's own statements in plain sqlite3, with ledgerq's commits.

Not a system but a ceiling for the benchmarks: the same schema and pragmas as a StateDB,
and per task the statements any implementation of ledgerq's schema runs: the row
(INSERT ... RETURNING the defaults it does not send) and its creation fact (the values
sent and those defaults), the guarded claim (UPDATE ... RETURNING *)
and its fact, the guarded terminal write and its fact, committed as ledgerq commits them.
No asyncio, no thread hop, no validation, no savepoints, no selection logic, no
dependents lookup, so nothing built on this schema runs these lifecycles faster.
Used by bench/queue.py (one commit per submit, two per pass) and bench/runtime.py
(submits grouped like the 64 concurrent submitters' group commits, written as ledgerq
writes submits joined in one turn: the rows and their facts by ``executemany``).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ledgerq.codec import dumps
from ledgerq.lifecycle import Registry, default_registry
from ledgerq.lifecycle.engine import new_id
from ledgerq.queue import TaskApplication
from ledgerq.queue.submission.application import digest
from ledgerq.store.sqlite.schema import schema_ddl
from ledgerq.store.sqlite.tx import SqliteTx
from ledgerq.store.timeouts import BUSY_TIMEOUT_MS

WORKER = "bench-worker"
#: The actor of a submit's creation fact (ledgerq.queue.submission.submit.SUBMITTER's id).
SUBMITTER = "ledgerq.submit"
#: A connection's execute, which the per-row functions below take.
Execute = Callable[..., sqlite3.Cursor]
APP = TaskApplication("command", {"argv": ["true"]}, "host")


def connect(path: str, sync: str) -> sqlite3.Connection:
    """ledgerq's pragmas on a plain connection (autocommit; BEGIN/COMMIT by hand)."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {sync}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA temp_store = MEMORY")
    return conn


RUN_COLUMNS = (
    "id", "schedule_id", "invocation_id", "trigger_context", "action_kind", "action_args",
    "status", "chain_depth", "fired_at", "created_at", "queued_at", "concurrency_key",
    "required_capabilities", "execution_target", "library_ref", "library_content_hash",
    "idempotency_key", "application_digest", "retry_policy", "timeout_seconds", "depends_on",
    "version", "status_reason_code", "status_reason_summary", "status_evidence_refs",
    "priority", "queue",
)
#: The columns a creation reads back, as ledgerq's does: those it leaves to their defaults.
_POLICY = default_registry().entity("schedule_run")
READ_BACK = tuple(c for c in _POLICY.columns if c in _POLICY.defaulted and c not in RUN_COLUMNS)
#: A creation fact's patch leaves these out (its own fields record them).
_NOT_IN_PATCH = ("status", "version")
RAW_RUN_INSERT = (f"INSERT INTO schedule_runs ({', '.join(RUN_COLUMNS)}) "
                  f"VALUES ({', '.join('?' * len(RUN_COLUMNS))})")
RAW_FACT_INSERT = """
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
#: The floor's claim: ledgerq's guarded queued -> running move, as apply_move writes it.
FLOOR_CLAIM = (
    "UPDATE schedule_runs SET status = 'running', version = ?, updated_at = ?, "
    "status_reason_code = 'run.started.ok', status_reason_summary = ?, "
    "status_evidence_refs = '[]', leased_by = ?, lease_expires_at = ?, lease_token = ?, "
    "lease_attempts = ? WHERE id = ? AND status = 'queued' AND lease_attempts IS ? "
    "AND leased_by IS NULL RETURNING *")
#: The floor's terminal write: running -> completed, guarded on the lease.
FLOOR_END = (
    "UPDATE schedule_runs SET status = 'completed', version = ?, updated_at = ?, "
    "status_reason_code = 'run.completed.ok', status_reason_summary = '', "
    "status_evidence_refs = '[]', ended_at = ?, exit_code = ?, error_detail = ?, "
    "run_attempts = ?, stdout_tail = ?, stderr_tail = ? WHERE id = ? AND status = 'running' "
    "AND leased_by IS ? AND lease_expires_at IS ? AND lease_token IS ? "
    "RETURNING ended_at, exit_code, error_detail, run_attempts, stdout_tail, stderr_tail")
#: The next page of queued rows, as ledgerq's claim reads the default queue: its range of
#: the claim order's index (the index's WHERE, as the dialect adds it), in index order.
FLOOR_PAGE = ("SELECT id, lease_attempts, version FROM schedule_runs WHERE {claim_index} "
              "AND status = 'queued' AND queue = 'default' AND queued_at IS NOT NULL "
              "AND (schedule_id IS NULL OR slot_at IS NOT NULL) "
              "ORDER BY priority DESC, queued_at, id LIMIT ?")


#: The batched floor (a floor batches where the engine does): a pass's claims as one
#: guarded multi-row UPDATE (each row still guarded by status, lease and version; its
#: lease token made in SQL) and their facts as one multi-row INSERT; the terminal writes
#: likewise, each row guarded by its own lease through a VALUES list.
BATCH_CLAIM = (
    "WITH g(id, attempts, version) AS (VALUES {rows}) "
    "UPDATE schedule_runs SET status = 'running', version = schedule_runs.version + 1, "
    "updated_at = ?, status_reason_code = 'run.started.ok', status_reason_summary = ?, "
    "status_evidence_refs = '[]', leased_by = ?, lease_expires_at = ?, "
    "lease_token = lower(hex(randomblob(16))), lease_attempts = g.attempts + 1 "
    "FROM g WHERE schedule_runs.id = g.id "
    "AND status = 'queued' AND schedule_runs.version = g.version "
    "AND lease_attempts IS g.attempts AND leased_by IS NULL RETURNING *")
BATCH_END = (
    "WITH g(id, leased_by, expires, token) AS (VALUES {rows}) "
    "UPDATE schedule_runs SET status = 'completed', version = schedule_runs.version + 1, "
    "updated_at = ?, status_reason_code = 'run.completed.ok', status_reason_summary = '', "
    "status_evidence_refs = '[]', ended_at = ?, exit_code = 0, error_detail = NULL, "
    "run_attempts = 1, stdout_tail = NULL, stderr_tail = NULL FROM g "
    "WHERE schedule_runs.id = g.id AND status = 'running' "
    "AND schedule_runs.leased_by IS g.leased_by AND lease_expires_at IS g.expires "
    "AND lease_token IS g.token "
    "RETURNING schedule_runs.id, version, ended_at, exit_code, error_detail, run_attempts, "
    "stdout_tail, stderr_tail")


def claim_page(registry: Registry) -> str:
    """:data:`FLOOR_PAGE` with the partial-index term the dialect adds to its claim scan
    (see ``SqliteTx.hint``), so the floor's scan uses the index ledgerq's does."""
    return FLOOR_PAGE.format(claim_index=SqliteTx(sqlite3.connect(":memory:")).hint(
        registry.entity("schedule_run"), "queued", "queue"))


def schema_floor(path: str, registry: Registry, sync: str, n: int, limit: int,
                 submit_group: int = 1, batched: bool = False) -> dict[str, float]:
    """ledgerq's own statements in plain sqlite3, ledgerq's commits: a ceiling, not a system.

    Per task the row (INSERT ... RETURNING its defaults) and its creation fact, or ``submit_group``
    submits per commit, written together as ledgerq writes submits joined in one turn
    (:func:`submit_rows`); then passes of ``limit``: the guarded claims with their facts in
    one commit, the guarded terminal writes with theirs in another. ``batched``: each
    pass's claims and terminal writes as one multi-row statement each, and their facts
    as one multi-row INSERT each (:data:`BATCH_CLAIM`). Returns lifecycles/s with its
    submit-only and worker-only parts and CPU per lifecycle.
    """
    conn = connect(path, sync)
    conn.executescript(schema_ddl(registry))
    page = claim_page(registry)
    passes = _batched_passes if batched else _passes
    c0, t0 = time.process_time(), time.perf_counter()
    _submit_all(conn, n, submit_group)
    t1 = time.perf_counter()
    done = passes(conn, page, limit)
    t2, c2 = time.perf_counter(), time.process_time()
    (facts,) = conn.execute("SELECT count(*) FROM status_transitions").fetchone()
    conn.close()
    assert done == n and facts == 3 * n, (done, facts)
    return {"lifecycle": n / (t2 - t0), "submit": n / (t1 - t0), "worker": n / (t2 - t1),
            "cpu_us": (c2 - c0) / n * 1e6}


def _fact(rid: str, prev: str | None, status: str, code: str, summary: str, now: float,
          version: int, patch: dict[str, Any], actor: str = WORKER) -> tuple[Any, ...]:
    """A fact row in RAW_FACT_INSERT's column order, as the engine makes it."""
    return (new_id(), "schedule_run", rid, prev, status, code, summary, "[]", "system",
            actor, now, "{}", version, dumps(patch), None)


def _run_values(now: float, args: str, fingerprint: str) -> tuple[Any, ...]:
    """A fresh run's row in RAW_RUN_INSERT's column order, as a plain submit makes it."""
    return (new_id(), None, None, "{}", APP.action_kind, args, "queued", 0, now, now, now,
            None, "[]", APP.execution_target, None, None, None, fingerprint, None, None,
            None, 1, "run.queued.submitted", "", "[]", 0, "default")


def _creation_fact(values: Sequence[Any], read: Sequence[Any], now: float
                   ) -> tuple[Any, ...]:
    """The creation fact of a row from the values sent and the defaults read back: its
    non-NULL columns as the patch."""
    patch = {k: v for k, v in zip(RUN_COLUMNS, values, strict=True)
             if v is not None and k not in _NOT_IN_PATCH}
    patch.update(zip(READ_BACK, read, strict=True))
    return _fact(patch["id"], None, "queued", "run.queued.submitted", "", now, 1, patch,
                 SUBMITTER)


def submit_row(x: Execute, args: str, fingerprint: str) -> str:
    """One row (INSERT ... RETURNING its defaults) and its creation fact, in the caller's
    transaction; its id."""
    now = time.time()
    values = _run_values(now, args, fingerprint)
    cur = x(RAW_RUN_INSERT + f" RETURNING {', '.join(READ_BACK)}", values)
    x(RAW_FACT_INSERT, _creation_fact(values, cur.fetchone(), now))
    return str(values[0])


def submit_rows(conn: sqlite3.Connection, args: str, fingerprint: str, count: int
                ) -> list[str]:
    """``count`` rows and their creation facts in the caller's transaction, as ledgerq
    writes submits joined in one turn of its loop (ledgerq.queue.submission.joined, through
    ``create_entities``): one ``executemany`` of the rows, one read-back of their
    defaults by id, one ``executemany`` of the facts; their ids."""
    now = time.time()
    rows = [_run_values(now, args, fingerprint) for _ in range(count)]
    conn.executemany(RAW_RUN_INSERT, rows)
    ids = [str(r[0]) for r in rows]
    read = {r[0]: r[1:] for r in conn.execute(
        f"SELECT id, {', '.join(READ_BACK)} FROM schedule_runs "
        f"WHERE id IN ({', '.join('?' * count)})", ids)}
    conn.executemany(RAW_FACT_INSERT, [_creation_fact(r, read[r[0]], now) for r in rows])
    return ids


def _submit_all(conn: sqlite3.Connection, n: int, submit_group: int) -> None:
    """N rows and their creation facts, ``submit_group`` per commit: one at a time as a
    lone submit writes its own (:func:`submit_row`), or, grouped, as submits joined in one
    turn are written together (:func:`submit_rows`)."""
    x = conn.execute
    args = dumps(APP.args)
    fingerprint = digest(APP)
    for first in range(0, n, submit_group):
        size = min(submit_group, n - first)
        x("BEGIN IMMEDIATE")
        if size == 1:
            submit_row(x, args, fingerprint)
        else:
            submit_rows(conn, args, fingerprint, size)
        x("COMMIT")


def _claim_patch(now: float, summary: str, row: dict[str, Any]) -> dict[str, Any]:
    return {"updated_at": now, "status_reason_code": "run.started.ok",
            "status_reason_summary": summary, "status_evidence_refs": "[]",
            "leased_by": row["leased_by"], "lease_expires_at": row["lease_expires_at"],
            "lease_token": row["lease_token"], "lease_attempts": row["lease_attempts"]}


#: What a terminal write returns of its row: the columns its fact's patch records.
END_RETURNS = ("ended_at", "exit_code", "error_detail", "run_attempts", "stdout_tail",
               "stderr_tail")


def _end_patch(now: float, stored: Sequence[Any]) -> dict[str, Any]:
    return {"updated_at": now, "status_reason_code": "run.completed.ok",
            "status_reason_summary": "", "status_evidence_refs": "[]",
            **dict(zip(END_RETURNS, stored, strict=True))}


def claim_rows(x: Execute, page: str, limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` queued rows claimed, each its own guarded statement and fact, in the
    caller's transaction; the rows as stored."""
    now = time.time()
    summary = f"claimed by {WORKER}"
    claimed = []
    for rid, attempts, version in x(page, (limit,)).fetchall():
        lease = (WORKER, now + 300, uuid.uuid4().hex)
        cur = x(FLOOR_CLAIM, (version + 1, now, summary, *lease, attempts + 1, rid, attempts))
        row = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
        x(RAW_FACT_INSERT, _fact(rid, "queued", "running", "run.started.ok", summary, now,
                                 version + 1, _claim_patch(now, summary, row)))
        claimed.append(row)
    return claimed


def end_row(x: Execute, row: dict[str, Any]) -> None:
    """A claimed row's terminal write after exit 0, guarded on its lease, and its fact."""
    now = time.time()
    version = row["version"] + 1
    cur = x(FLOOR_END, (version, now, now, 0, None, 1, None, None, row["id"],
                        row["leased_by"], row["lease_expires_at"], row["lease_token"]))
    x(RAW_FACT_INSERT, _fact(row["id"], "running", "completed", "run.completed.ok", "", now,
                             version, _end_patch(now, cur.fetchone())))


def _passes(conn: sqlite3.Connection, page: str, limit: int) -> int:
    """Passes of ``limit`` until the queue is empty, each row its own guarded statement and
    fact; the number completed."""
    x = conn.execute
    done = 0
    while True:
        x("BEGIN IMMEDIATE")
        claimed = claim_rows(x, page, limit)
        x("COMMIT")
        if not claimed:
            return done
        x("BEGIN IMMEDIATE")
        for row in claimed:  # the no-op executor: exit 0
            end_row(x, row)
            done += 1
        x("COMMIT")


def _facts_insert(count: int) -> str:
    head, _, values = RAW_FACT_INSERT.partition("VALUES")
    return f"{head}VALUES {', '.join([values.strip()] * count)}"


def _batched_passes(conn: sqlite3.Connection, page: str, limit: int) -> int:
    """The same passes, each pass's claims and terminal writes one statement each and
    their facts one multi-row INSERT each; the number completed."""
    x = conn.execute

    def append(facts: list[tuple[Any, ...]]) -> None:
        x(_facts_insert(len(facts)), [v for f in facts for v in f])

    done = 0
    summary = f"claimed by {WORKER}"
    while True:
        x("BEGIN IMMEDIATE")
        now = time.time()
        chosen = x(page, (limit,)).fetchall()
        claimed: list[dict[str, Any]] = []
        if chosen:
            cur = x(BATCH_CLAIM.format(rows=", ".join(["(?, ?, ?)"] * len(chosen))),
                    [*(v for row in chosen for v in row), now, summary, WORKER, now + 300])
            names = [d[0] for d in cur.description]
            claimed = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
            append([_fact(r["id"], "queued", "running", "run.started.ok", summary, now,
                          r["version"], _claim_patch(now, summary, r)) for r in claimed])
        x("COMMIT")
        if not claimed:
            return done
        x("BEGIN IMMEDIATE")
        now = time.time()
        cur = x(BATCH_END.format(rows=", ".join(["(?, ?, ?, ?)"] * len(claimed))),
                [*(v for r in claimed for v in (r["id"], r["leased_by"],
                                                r["lease_expires_at"], r["lease_token"])),
                 now, now])
        ended = cur.fetchall()
        append([_fact(rid, "running", "completed", "run.completed.ok", "", now, version,
                      _end_patch(now, stored)) for rid, version, *stored in ended])
        done += len(ended)
        x("COMMIT")
