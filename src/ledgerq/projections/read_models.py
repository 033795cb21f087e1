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
class QueueStats:
    """Counts per status (every declared state, zeros included) and who is running what."""

    now: float
    counts: dict[str, int]
    total: int
    oldest_queued_at: float | None
    oldest_queued_age_seconds: float | None
    running_by_worker: dict[str, int]
    workers: list[WorkerInfo] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def queue_stats(db: StateDB, *, now: float | None = None) -> QueueStats:
    """One consistent snapshot of the queue: per-status counts, oldest queued age, workers."""
    states = list(db.registry.entity(RUN_ENTITY).states)
    ts = time.time() if now is None else now

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
        return QueueStats(
            now=ts, counts=counts, total=sum(counts.values()),
            oldest_queued_at=oldest,
            oldest_queued_age_seconds=None if oldest is None else max(0.0, ts - oldest),
            running_by_worker=running, workers=workers)

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
    "SUMMARY_COLUMNS",
    "QueueStats",
    "RunPage",
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
