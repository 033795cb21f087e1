"""Read models over the queue's projection: listing, lookup, statistics, waiting.

These are plain reads (no facts are written); the ``ledgerq`` command and
applications use them to answer "what is in the queue and what happened to it".
Every JSON column of a run comes back decoded.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ledgerq.store.codec import loads

if TYPE_CHECKING:
    from ledgerq.store.db import StateDB

RUN_ENTITY = "schedule_run"
RUN_TABLE = "schedule_runs"
#: JSON columns of status_transitions (a run's come from its spec), decoded on the way out.
FACT_JSON_COLUMNS = ("evidence_refs", "metadata", "patch")
#: The columns of a run summary (``ls``), in display order; a stable contract for --json.
SUMMARY_COLUMNS = (
    "id", "status", "action_kind", "execution_target", "created_at", "updated_at", "ended_at",
    "exit_code", "leased_by", "lease_attempts", "run_attempts", "status_reason_code",
)
#: Shortest id prefix (or suffix) accepted by :func:`resolve_run_id`.
MIN_PREFIX = 4
#: A lease expired (or a retry due) this long before a live worker's heartbeat, and not
#: yet moved, counts as stuck: a worker reaps and promotes every half second or so.
STUCK_AFTER_SECONDS = 60.0
#: Stuck runs listed by id in QueueStats (all of them are counted).
STUCK_SAMPLE = 20


def _decode(row: dict[str, Any], columns: Iterable[str]) -> dict[str, Any]:
    out = dict(row)
    for col in columns:
        value = out.get(col)
        if isinstance(value, str | bytes):
            try:
                out[col] = loads(value)
            except Exception:
                out[col] = value  # hand-written garbage stays visible as text
    return out


def decode_run_row(db: StateDB, row: dict[str, Any]) -> dict[str, Any]:
    """A schedule_runs row with its JSON columns decoded (invalid JSON is left as text)."""
    return _decode(row, db.registry.entity(RUN_ENTITY).json_columns)


def decode_fact(fact: dict[str, Any]) -> dict[str, Any]:
    """A status_transitions row with evidence_refs, metadata and patch decoded."""
    return _decode(fact, FACT_JSON_COLUMNS)


@dataclass
class RunPage:
    """One page of runs, newest first, and how many runs match the filter in total."""

    runs: list[dict[str, Any]]
    total: int
    limit: int
    offset: int


async def list_runs(db: StateDB, *, statuses: Iterable[str] | None = None,
                    kinds: Iterable[str] | None = None, targets: Iterable[str] | None = None,
                    limit: int = 50, offset: int = 0) -> RunPage:
    """Summaries of runs matching every given filter, newest first (created_at, then id)."""
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must be >= 0")
    where: list[str] = []
    params: list[Any] = []
    for col, values in (("status", statuses), ("action_kind", kinds),
                        ("execution_target", targets)):
        vals = list(values or [])
        if vals:
            where.append(f"{col} IN ({', '.join('?' * len(vals))})")
            params += vals
    clause = f"WHERE {' AND '.join(where)}" if where else ""

    def read(conn: sqlite3.Connection) -> RunPage:
        total = conn.execute(f"SELECT COUNT(*) FROM {RUN_TABLE} {clause}", params).fetchone()[0]
        rows = conn.execute(
            f"SELECT {', '.join(SUMMARY_COLUMNS)} FROM {RUN_TABLE} {clause} "
            "ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?", [*params, limit, offset],
        ).fetchall()
        return RunPage([dict(r) for r in rows], int(total), limit, offset)

    return await db.read(read)


async def resolve_run_id(db: StateDB, id_or_prefix: str) -> str:
    """The full id of the one run whose id is, starts with, or ends with ``id_or_prefix``.

    Run ids are time-ordered (UUIDv7): runs created minutes apart share their first
    eight characters and only the tail is random, so a short unique piece is easiest
    taken from the end. A prefix is tried first (it uses the primary key's index); only
    when no id starts with it is it tried as a suffix (a scan of the ids).
    LookupError when no run matches; ValueError when a piece is ambiguous.
    """
    exact = await db.fetch_one(f"SELECT id FROM {RUN_TABLE} WHERE id = ?", (id_or_prefix,))
    if exact is not None:
        return str(exact["id"])
    if len(id_or_prefix) >= MIN_PREFIX and "%" not in id_or_prefix and "_" not in id_or_prefix:
        for pattern, what in ((id_or_prefix + "%", "prefix"), ("%" + id_or_prefix, "suffix")):
            found = await db.fetch_all(
                f"SELECT id FROM {RUN_TABLE} WHERE id LIKE ? ORDER BY id LIMIT 3", (pattern,))
            if len(found) == 1:
                return str(found[0]["id"])
            if len(found) > 1:
                raise ValueError(f"id {what} {id_or_prefix!r} is ambiguous: matches "
                                 + ", ".join(r["id"] for r in found[:2])
                                 + (" and more" if len(found) > 2 else ""))
    raise LookupError(f"no run {id_or_prefix}")


async def get_run(db: StateDB, run_id: str) -> dict[str, Any]:
    """The full row of one run (JSON decoded); LookupError names the id when it is missing."""
    row = await db.fetch_one(f"SELECT * FROM {RUN_TABLE} WHERE id = ?", (run_id,))
    if row is None:
        raise LookupError(f"no run {run_id}")
    return decode_run_row(db, row)


async def run_history(db: StateDB, run_id: str) -> list[dict[str, Any]]:
    """Every fact of one run, oldest first, with its JSON columns decoded."""
    from ledgerq.projections.log import history

    return [decode_fact(f) for f in await history(db, RUN_ENTITY, run_id)]


@dataclass
class WorkerInfo:
    worker_id: str
    hostname: str | None
    pid: int | None
    last_heartbeat_at: float
    heartbeat_age_seconds: float
    running: int


@dataclass
class StuckRun:
    """A run the queue's passes cannot move (see :func:`queue_stats`)."""

    id: str
    status: str
    why: str


@dataclass
class QueueStats:
    """Counts per status (every declared state, zeros included) and who is running what.

    ``stuck`` counts runs no pass will move as things stand (see :func:`queue_stats`);
    ``stuck_runs`` names the first :data:`STUCK_SAMPLE` of them.
    """

    now: float
    counts: dict[str, int]
    total: int
    oldest_queued_at: float | None
    oldest_queued_age_seconds: float | None
    running_by_worker: dict[str, int]
    workers: list[WorkerInfo] = field(default_factory=list)
    stuck: int = 0
    stuck_runs: list[StuckRun] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _stuck_queries(db: StateDB) -> list[tuple[str, str]]:
    """(SQL selecting id, status, why; what it finds) per kind of stuck run.

    Parameters: ``:now``, ``:grace``. What a database shows on its own, whichever
    process asks: a status the loaded specs do not declare (no pass of this version
    moves it); a lease expired, or a retry due, ``grace`` seconds before the heartbeat
    of a worker already running then (its reaper or promotion should have moved the row
    and could not); a waiting run whose depends_on is not valid JSON (never released).
    Queued rows are not judged: an unclaimed row may simply have no worker to serve it.
    """
    from ledgerq.lifecycle.registry import sql_literal
    from ledgerq.queue.runs import index_clause

    policy = db.registry.entity(RUN_ENTITY)
    declared = ", ".join(sql_literal(s) for s in sorted(policy.states))
    live = ("EXISTS (SELECT 1 FROM workers AS w WHERE w.last_heartbeat_at - :grace > "
            "max({due}, COALESCE(w.started_at, {due})))")
    queries = [(f"SELECT id, status, 'status ' || status || ' is not declared by the loaded "
                f"specs' AS why FROM {RUN_TABLE} WHERE status NOT IN ({declared})",
                "undeclared")]
    if "running" in policy.states:
        queries.append((
            f"SELECT id, status, 'lease expired at ' || lease_expires_at || "
            f"' and was not reaped' AS why FROM {RUN_TABLE} "
            f"WHERE {index_clause(policy, 'idx_schedule_runs_lease', 'running')} "
            "AND status = 'running' AND lease_expires_at < :now - :grace "
            f"AND {live.format(due='lease_expires_at')}", "lease"))
    if "retry_wait" in policy.states:
        queries.append((
            f"SELECT id, status, 'retry due at ' || retry_due_at || ' was not promoted' "
            f"AS why FROM {RUN_TABLE} "
            f"WHERE {index_clause(policy, 'idx_schedule_runs_retry_due', 'retry_wait')} "
            "AND status = 'retry_wait' AND retry_due_at < :now - :grace "
            f"AND {live.format(due='retry_due_at')}", "retry"))
    if "waiting_dependency" in policy.states:
        queries.append((
            "SELECT id, status, 'depends_on is not valid JSON' AS why "
            f"FROM {RUN_TABLE} WHERE "
            f"{index_clause(policy, 'idx_schedule_runs_waiting', 'waiting_dependency')} "
            "AND status = 'waiting_dependency' AND NOT COALESCE(json_valid(depends_on), 0)",
            "waiting"))
    return queries


async def queue_stats(db: StateDB, *, now: float | None = None,
                      stuck_after: float = STUCK_AFTER_SECONDS) -> QueueStats:
    """One consistent snapshot of the queue: per-status counts, oldest queued age, workers,
    and the runs stuck where no pass will move them (see :func:`_stuck_queries`)."""
    states = list(db.registry.entity(RUN_ENTITY).states)
    ts = time.time() if now is None else now
    stuck_sql = _stuck_queries(db)

    declared = set(states)

    def read(conn: sqlite3.Connection) -> QueueStats:
        counts = dict.fromkeys(states, 0)
        for status, n in conn.execute(
                f"SELECT status, COUNT(*) FROM {RUN_TABLE} GROUP BY status"):
            counts[status] = int(n)
        oldest = conn.execute(
            f"SELECT MIN(queued_at) FROM {RUN_TABLE} WHERE status = 'queued'").fetchone()[0]
        running = {r[0]: int(r[1]) for r in conn.execute(
            f"SELECT leased_by, COUNT(*) FROM {RUN_TABLE} "
            "WHERE status = 'running' AND leased_by IS NOT NULL "
            "GROUP BY leased_by ORDER BY leased_by")}
        workers = [
            WorkerInfo(worker_id=w["worker_id"], hostname=w["hostname"], pid=w["pid"],
                       last_heartbeat_at=w["last_heartbeat_at"],
                       heartbeat_age_seconds=max(0.0, ts - w["last_heartbeat_at"]),
                       running=running.get(w["worker_id"], 0))
            for w in conn.execute(
                "SELECT worker_id, hostname, pid, last_heartbeat_at FROM workers "
                "ORDER BY worker_id")
        ]
        stuck_runs: list[StuckRun] = []
        stuck = 0
        undeclared = sum(n for s, n in counts.items() if s not in declared)
        for sql, kind in stuck_sql:
            if kind == "undeclared" and not undeclared:
                continue  # the counts already tell: skip a scan of the table
            params = {"now": ts, "grace": stuck_after}
            stuck += conn.execute(f"SELECT COUNT(*) FROM ({sql})", params).fetchone()[0]
            if len(stuck_runs) < STUCK_SAMPLE:
                stuck_runs += [StuckRun(r[0], r[1], r[2]) for r in conn.execute(
                    f"{sql} LIMIT {STUCK_SAMPLE - len(stuck_runs)}", params)]
        return QueueStats(
            now=ts, counts=counts, total=sum(counts.values()),
            oldest_queued_at=oldest,
            oldest_queued_age_seconds=None if oldest is None else max(0.0, ts - oldest),
            running_by_worker=running, workers=workers, stuck=stuck, stuck_runs=stuck_runs)

    return await db.read(read)


async def wait_for_runs(db: StateDB, run_ids: Iterable[str], *, timeout: float = 60.0,
                        interval: float = 0.05) -> dict[str, str]:
    """Poll until every run is in a terminal state; returns id -> final status.

    TimeoutError names the runs still unfinished. Reads only: someone else (a Worker in
    this or another process) must be running them.
    """
    ids = list(dict.fromkeys(run_ids))
    terminal = db.registry.entity(RUN_ENTITY).terminal
    deadline = time.monotonic() + timeout
    while True:
        rows = await db.fetch_all(
            f"SELECT id, status FROM {RUN_TABLE} WHERE id IN ({', '.join('?' * len(ids))})",
            ids) if ids else []
        status = {r["id"]: r["status"] for r in rows}
        missing = [i for i in ids if i not in status]
        if missing:
            raise LookupError(f"no run {missing[0]}")
        if all(s in terminal for s in status.values()):
            return {i: status[i] for i in ids}
        if time.monotonic() >= deadline:
            pending = [i for i in ids if status[i] not in terminal]
            raise TimeoutError(f"{len(pending)} run(s) still unfinished after {timeout:g}s: "
                               + ", ".join(pending[:5]))
        await asyncio.sleep(interval)


__all__ = [
    "STUCK_AFTER_SECONDS",
    "SUMMARY_COLUMNS",
    "QueueStats",
    "RunPage",
    "StuckRun",
    "WorkerInfo",
    "decode_fact",
    "decode_run_row",
    "get_run",
    "list_runs",
    "queue_stats",
    "resolve_run_id",
    "run_history",
    "wait_for_runs",
]
