"""Worker functions (record D4): heartbeat, reap, claim and execute under leases.

Every status change here is a guarded move through the transition engine, so every
move is one fact. Claims, renewals and terminal writes of concurrent runs share
commits through StateDB's group commit; each is still its own guarded transition.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledgerq.lifecycle.models import Actor
from ledgerq.lifecycle.registry import EntityPolicy, sql_literal
from ledgerq.queue.application import RetryPolicy
from ledgerq.queue.capabilities import affinity_score, capability_class, worker_can_serve
from ledgerq.queue.launcher import ExecuteFn, default_execute
from ledgerq.queue.leases import LeaseReads, until_next_check
from ledgerq.queue.locks import KeyLock
from ledgerq.queue.runs import (
    ENTITY,
    MalformedRow,
    decode_run,
    index_clause,
    move,
    resolve_dependents,
    row_dict,
)
from ledgerq.store.codec import dumps, loads

if TYPE_CHECKING:
    from ledgerq.store.db import StateDB

log = logging.getLogger("ledgerq.worker")

TASK_WORKER_ENABLED = True
DEFAULT_LEASE_TTL_SECONDS = 300.0
DEFAULT_HEARTBEAT_TTL_SECONDS = 90.0
MAX_LEASE_ATTEMPTS = 3
#: Candidates read per keyset page, rows scanned per pass, claims attempted per pass (D4).
PAGE_SIZE = 50
SCAN_CAP = 5000
DEFAULT_CLAIM_LIMIT = 20
#: How often an executing run checks that it still owns its lease (cancel / reap notice).
LEASE_CHECK_SECONDS = 0.5
#: A lease is renewed once this fraction of its TTL has passed.
RENEW_FRACTION = 1 / 3
#: exit_code recorded for a run killed at its deadline (the coreutils ``timeout`` convention).
TIMEOUT_EXIT_CODE = 124
#: What a run that goes back to waiting holds of a lease: nothing.
NO_LEASE: dict[str, Any] = {"leased_by": None, "lease_expires_at": None, "lease_token": None}
#: Longest error_detail kept on a row.
DETAIL_LIMIT = 4096

Authorize = Callable[[dict[str, Any]], "bool | str | Awaitable[bool | str]"]


@functools.lru_cache(maxsize=64)
def _actor(worker_id: str) -> Actor:
    # Actor is frozen: one per worker id, not a pydantic validation per move.
    return Actor(type="system", id=worker_id)


# ----------------------------------------------------------------- heartbeat


async def register_heartbeat(db: StateDB, *, worker_id: str,
                             advertised_capabilities: list[str] | None = None,
                             execution_targets: list[str] | None = None,
                             now: float | None = None) -> None:
    """Upsert this worker's row: what it serves and when it was last alive."""
    ts = time.time() if now is None else now
    caps = dumps(list(advertised_capabilities or []))
    targets = dumps(list(execution_targets or []))
    host = socket.gethostname()

    def unit(conn: sqlite3.Connection) -> None:
        conn.execute(
            "INSERT INTO workers (worker_id, advertised_capabilities, execution_targets, "
            "last_heartbeat_at, hostname, pid, started_at) VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(worker_id) DO UPDATE SET "
            "advertised_capabilities = excluded.advertised_capabilities, "
            "execution_targets = excluded.execution_targets, "
            "last_heartbeat_at = excluded.last_heartbeat_at, pid = excluded.pid",
            (worker_id, caps, targets, ts, host, os.getpid(), ts),
        )

    await db.write(unit)


# ----------------------------------------------------------------- reaper


def _expired_sql(policy: EntityPolicy, columns: str) -> str:
    return (f"SELECT {columns} FROM schedule_runs "
            f"WHERE {index_clause(policy, 'idx_schedule_runs_lease', 'running')} "
            "AND status = 'running' AND lease_expires_at IS NOT NULL "
            "AND lease_expires_at < ?")


def _reap(conn: sqlite3.Connection, policy: EntityPolicy, now: float) -> dict[str, int]:
    counts = {"requeued": 0, "failed": 0}
    expired = conn.execute(
        _expired_sql(policy, "id, leased_by, lease_expires_at, lease_token, lease_attempts"),
        (now,),
    ).fetchall()
    for row in expired:
        guard = {"leased_by": row["leased_by"], "lease_expires_at": row["lease_expires_at"],
                 "lease_token": row["lease_token"]}
        if row["lease_attempts"] < MAX_LEASE_ATTEMPTS:
            res = move(conn, policy, row["id"], "running", "queued", "run.queued.lease_expired",
                       summary=f"lease of {row['leased_by']} expired", guard=guard,
                       patch=dict(NO_LEASE), now=now,
                       metadata={"expired_worker": row["leased_by"]})
            counts["requeued"] += int(res.applied)
        else:
            detail = (f"lease expired {row['lease_attempts']} times "
                      f"(last holder {row['leased_by']})")
            res = move(conn, policy, row["id"], "running", "failed",
                       "run.failed.lease_attempts_exhausted", summary=detail, guard=guard,
                       patch={"ended_at": now, "error_detail": detail}, now=now,
                       metadata={"expired_worker": row["leased_by"]})
            if res.applied:
                counts["failed"] += 1
                resolve_dependents(conn, policy, [row["id"]], now=now)
    return counts


async def reap_expired_leases(db: StateDB, *, now: float | None = None) -> dict[str, int]:
    """Return expired leases to the queue, or fail rows whose leases expired 3 times."""
    policy = db.registry.entity(ENTITY)
    ts = time.time() if now is None else now
    if await db.fetch_one(_expired_sql(policy, "1") + " LIMIT 1", (ts,)) is None:
        return {"requeued": 0, "failed": 0}  # nothing expired: skip the write lock
    return await db.write(lambda conn: _reap(conn, policy, ts))


def _due_sql(policy: EntityPolicy, columns: str) -> str:
    return (f"SELECT {columns} FROM schedule_runs "
            f"WHERE {index_clause(policy, 'idx_schedule_runs_retry_due', 'retry_wait')} "
            "AND status = 'retry_wait' AND retry_due_at <= ?")


def _waiting_sql(policy: EntityPolicy, columns: str) -> str:
    return (f"SELECT {columns} FROM schedule_runs "
            f"WHERE {index_clause(policy, 'idx_schedule_runs_waiting', 'waiting_dependency')} "
            "AND status = 'waiting_dependency'")


def _settled_sql(policy: EntityPolicy) -> str:
    """Waiting runs that can move now: a dependency ended badly, or all of them completed.

    Lets the sweep skip the write lock while runs merely wait; terminal writes settle
    dependents themselves, so this sweep is only the safety net (e.g. for a dependency
    moved with ``transition()`` directly).
    """
    bad = ", ".join(sql_literal(s) for s in sorted(policy.terminal - {"completed"})) or "NULL"
    return (
        f"{_waiting_sql(policy, '1')} AND ("
        "EXISTS (SELECT 1 FROM json_each(schedule_runs.depends_on) AS j "
        f"JOIN schedule_runs AS d ON d.id = j.value WHERE d.status IN ({bad})) "
        "OR NOT EXISTS (SELECT 1 FROM json_each(schedule_runs.depends_on) AS j "
        "LEFT JOIN schedule_runs AS d ON d.id = j.value WHERE d.status IS NOT 'completed'))"
    )


def _promote(conn: sqlite3.Connection, policy: EntityPolicy, now: float) -> dict[str, int]:
    counts = {"retried": 0, "released": 0, "cancelled": 0}
    for row in conn.execute(_due_sql(policy, "id, retry_due_at"), (now,)).fetchall():
        res = move(conn, policy, row["id"], "retry_wait", "queued", "run.queued.retry_due",
                   guard={"retry_due_at": row["retry_due_at"]},
                   patch={"lease_attempts": 0, "retry_due_at": None, "queued_at": now}, now=now)
        counts["retried"] += int(res.applied)
    waiting = [r[0] for r in conn.execute(_waiting_sql(policy, "id"))]
    for i in range(0, len(waiting), 500):
        got = resolve_dependents(conn, policy, waiting[i:i + 500], waiting=True, now=now)
        counts["released"] += got["released"]
        counts["cancelled"] += got["cancelled"]
    return counts


async def promote_due(db: StateDB, *, now: float | None = None) -> dict[str, int]:
    """Move due retries back to queued and settle waiting runs whose dependencies ended."""
    policy = db.registry.entity(ENTITY)
    ts = time.time() if now is None else now
    due = await db.fetch_one(
        f"SELECT EXISTS ({_due_sql(policy, '1')}) OR EXISTS ({_settled_sql(policy)}) "
        "AS due", (ts,))
    if due is None or not due["due"]:
        return {"retried": 0, "released": 0, "cancelled": 0}
    return await db.write(lambda conn: _promote(conn, policy, ts))


# ----------------------------------------------------------------- claim


@dataclass
class ClaimPass:
    """What a claim pass saw: rows claimed, plus rows it had to skip and why."""

    claimed: list[dict[str, Any]] = field(default_factory=list)
    scanned: int = 0
    malformed: list[str] = field(default_factory=list)
    lost: int = 0


def _candidates_sql(policy: EntityPolicy, excluded: int) -> str:
    """One keyset page of claimable rows; parameters: the excluded kinds, cursor, page size."""
    kinds_clause = (f"AND action_kind NOT IN ({', '.join('?' * excluded)})" if excluded else "")
    return (
        "SELECT id, queued_at, required_capabilities, execution_target, concurrency_key, "
        "lease_attempts FROM schedule_runs "
        f"WHERE {index_clause(policy, 'idx_schedule_runs_claim', 'queued')} "
        f"AND status = 'queued' AND schedule_id IS NULL {kinds_clause} "
        "AND (queued_at, id) > (?, ?) ORDER BY queued_at, id LIMIT ?"
    )


def _candidates(conn: sqlite3.Connection, policy: EntityPolicy, excluded_kinds: list[str],
                advertised: list[str], targets: set[str], result: ClaimPass,
                enough: Callable[[dict[str, Any]], bool] | None = None
                ) -> list[dict[str, Any]]:
    """Eligible queued rows in (queued_at, id) order, read in keyset pages up to the scan cap.

    ``enough`` is offered each eligible row as it is found; when it returns True the
    scan stops there (the caller has all it can use).
    """
    eligible: list[dict[str, Any]] = []
    cursor: tuple[float, str] = (float("-inf"), "")
    sql = _candidates_sql(policy, len(excluded_kinds))
    while result.scanned < SCAN_CAP:
        page = conn.execute(sql, (*excluded_kinds, *cursor,
                                  min(PAGE_SIZE, SCAN_CAP - result.scanned))).fetchall()
        if not page:
            break
        result.scanned += len(page)
        cursor = (page[-1]["queued_at"], page[-1]["id"])
        for row in page:
            try:
                caps = loads(row["required_capabilities"]) or []
                if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
                    raise ValueError("not a list of strings")
            except Exception:
                result.malformed.append(row["id"])
                log.warning("skipping run %s: required_capabilities is malformed", row["id"])
                continue
            target = row["execution_target"]
            if target and target not in targets:
                continue
            if not worker_can_serve(caps, advertised):
                continue
            cand = {**row_dict(row), "required_capabilities": caps}
            eligible.append(cand)
            if enough is not None and enough(cand):
                return eligible
        if len(page) < PAGE_SIZE:
            break
    return eligible


class _Picker:
    """A pass's choice: candidates in the order offered, up to ``limit``, skipping any whose
    concurrency key is already running or was picked earlier in the pass."""

    def __init__(self, running_keys: set[str], limit: int) -> None:
        self.blocked = set(running_keys)
        self.limit = limit
        self.chosen: list[dict[str, Any]] = []

    def offer(self, cand: dict[str, Any]) -> bool:
        """Consider one candidate; True once ``limit`` are chosen."""
        if len(self.chosen) >= self.limit:
            return True
        key = cand["concurrency_key"]
        if key is not None:
            if key in self.blocked:
                return False
            self.blocked.add(key)
        self.chosen.append(cand)
        return len(self.chosen) >= self.limit


def _running_keys(conn: sqlite3.Connection, policy: EntityPolicy) -> set[str]:
    # Every running row is in the lease index (NULL expiries included), and there are
    # only as many as workers run at once: cheap however deep the queue is.
    return {r[0] for r in conn.execute(_running_keys_sql(policy))}


def _running_keys_sql(policy: EntityPolicy) -> str:
    return ("SELECT DISTINCT concurrency_key FROM schedule_runs "
            f"WHERE {index_clause(policy, 'idx_schedule_runs_lease', 'running')} "
            "AND status = 'running' AND concurrency_key IS NOT NULL")


def _key_running_sql(policy: EntityPolicy) -> str:
    """Is a run with this concurrency key running? (parameter: the key)"""
    return ("SELECT 1 FROM schedule_runs WHERE "
            f"{index_clause(policy, 'idx_schedule_runs_concurrency', 'running')} "
            "AND status = 'running' AND concurrency_key = ? LIMIT 1")


def _select(conn: sqlite3.Connection, policy: EntityPolicy, worker_id: str, now: float,
            heartbeat_ttl: float, excluded_kinds: list[str], advertised: list[str],
            targets: set[str], limit: int, result: ClaimPass) -> list[dict[str, Any]] | None:
    """The rows a pass will try to claim, read in one snapshot; None if the worker is stale."""
    hb = conn.execute("SELECT last_heartbeat_at FROM workers WHERE worker_id = ?",
                      (worker_id,)).fetchone()
    if hb is not None and now - hb[0] > heartbeat_ttl:
        return None
    picker = _Picker(_running_keys(conn, policy), limit)
    if not any(capability_class(t) == "affinity" for t in advertised):
        # Every candidate scores 0, so the stable affinity sort keeps scan order and the
        # choice is the first ``limit`` unblocked eligible rows: stop scanning there.
        # Same rows as sorting the whole scan, without reading up to SCAN_CAP of them.
        _candidates(conn, policy, excluded_kinds, advertised, targets, result,
                    enough=picker.offer)
        return picker.chosen
    eligible = _candidates(conn, policy, excluded_kinds, advertised, targets, result)
    # Stable: equal scores keep the oldest-first order of the scan.
    eligible.sort(key=lambda c: -affinity_score(c["required_capabilities"], advertised))
    for cand in eligible:
        if picker.offer(cand):
            break
    return picker.chosen


def _claim_one(conn: sqlite3.Connection, policy: EntityPolicy, cand: dict[str, Any],
               worker_id: str, now: float, lease_ttl: float) -> dict[str, Any] | None:
    key = cand["concurrency_key"]
    if key is not None and conn.execute(_key_running_sql(policy), (key,)).fetchone():
        return None
    attempts = cand["lease_attempts"]
    res = move(conn, policy, cand["id"], "queued", "running", "run.started.ok",
               actor=_actor(worker_id), summary=f"claimed by {worker_id}",
               guard={"lease_attempts": attempts, "leased_by": None},
               patch={"leased_by": worker_id, "lease_expires_at": now + lease_ttl,
                      "lease_token": uuid.uuid4().hex,
                      "lease_attempts": attempts + 1}, now=now, whole_row=True)
    return res.row if res.applied else None


async def claim_runs(db: StateDB, *, worker_id: str, now: float | None = None,
                     lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
                     limit: int = DEFAULT_CLAIM_LIMIT,
                     advertised_capabilities: Iterable[str] | None = None,
                     execution_targets: Iterable[str] | None = None,
                     heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
                     excluded_kinds: Iterable[str] = ("workflow",)) -> ClaimPass:
    """One claim pass (D4): scan, filter, order by affinity, claim up to ``limit`` rows.

    Each claim is its own guarded queued -> running move; all of a pass's claims
    commit together. A concurrency key already running (checked inside the claim's
    own transaction, so across workers too) or claimed earlier in this pass blocks a
    candidate for the rest of the pass. The heartbeat check, the running keys and the
    scan read one snapshot. When the worker advertises no affinity token every score
    is equal, so the scan stops once ``limit`` rows are chosen (the same rows the full
    sort would pick); a pass then costs the same at any queue depth.
    """
    ts = time.time() if now is None else now
    result = ClaimPass()
    if limit <= 0:
        return result
    advertised = list(advertised_capabilities or [])
    targets = set(execution_targets or ["host"])
    excluded = sorted(set(excluded_kinds))
    policy = db.registry.entity(ENTITY)
    chosen = await db.read(lambda conn: _select(
        conn, policy, worker_id, ts, heartbeat_ttl, excluded, advertised, targets, limit,
        result))
    if chosen is None:
        log.warning("worker %s heartbeat is stale; claiming nothing", worker_id)
        return result
    if not chosen:
        return result
    outcomes = await asyncio.gather(*(
        db.write(functools.partial(_claim_one, policy=policy, cand=c, worker_id=worker_id,
                                   now=ts, lease_ttl=lease_ttl))
        for c in chosen
    ), return_exceptions=True)
    for cand, got in zip(chosen, outcomes, strict=True):
        if isinstance(got, BaseException):
            log.warning("claim of run %s failed: %s", cand["id"], got)
            result.lost += 1
        elif got is None:
            result.lost += 1
        else:
            result.claimed.append(got)
    return result


# ----------------------------------------------------------------- execution


@dataclass
class Executors:
    """Which callable runs which action kind: adapters first, then ``execute``, then default.

    ``workflow`` has no default: without an adapter its rows are never claimed.
    """

    execute: ExecuteFn | None = None
    adapters: Mapping[str, ExecuteFn] = field(default_factory=dict)

    def for_kind(self, kind: str) -> ExecuteFn | None:
        if kind in self.adapters:
            return self.adapters[kind]
        if kind == "workflow":
            return None
        return self.execute or default_execute

    def excluded_kinds(self) -> list[str]:
        return [] if "workflow" in self.adapters else ["workflow"]


@dataclass
class RunContext:
    """How one claimed run is supervised while it executes."""

    worker_id: str
    lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS
    clock: Callable[[], float] = time.time
    executors: Executors = field(default_factory=Executors)
    authorize: Authorize | None = None
    lock_dir: Path | None = None
    check_interval: float = LEASE_CHECK_SECONDS
    stopping: asyncio.Event | None = None
    #: Shared by the runs of one worker (or one pass): their checks become one read.
    lease_reads: LeaseReads = field(default_factory=LeaseReads)


class LeaseLost(Exception):
    """The run's lease is no longer ours (reaped, cancelled, reclaimed)."""


def _finish(conn: sqlite3.Connection, policy: EntityPolicy, run: dict[str, Any], to_state: str,
            code: str, guard: dict[str, Any], patch: dict[str, Any], now: float,
            worker_id: str, summary: str = "") -> bool:
    res = move(conn, policy, run["id"], "running", to_state, code, actor=_actor(worker_id),
               summary=summary, guard=guard, patch=patch, now=now)
    if res.applied and to_state in policy.terminal:
        resolve_dependents(conn, policy, [run["id"]], now=now)
    return res.applied


async def execute_claimed(db: StateDB, run: dict[str, Any], ctx: RunContext) -> str:
    """Run one claimed row to an end and write its outcome, guarded on our lease.

    Returns the state written (``completed``, ``failed``, ``retry_wait``,
    ``timed_out``, ``queued`` on shutdown) or ``lost`` when the lease went away, in
    which case the child is stopped and nothing terminal is written.
    """
    policy = db.registry.entity(ENTITY)
    lease = {"leased_by": ctx.worker_id, "lease_expires_at": run["lease_expires_at"],
             "lease_token": run["lease_token"]}
    try:
        decoded = decode_run(policy, run)
    except MalformedRow as exc:
        return await _end(db, policy, run, lease, ctx, "failed", "run.failed.exception", 1,
                          str(exc))
    if ctx.authorize is not None:
        try:
            verdict = ctx.authorize(decoded)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception as exc:  # fail closed: a broken hook denies, it does not strand the row
            verdict = f"authorize hook raised {type(exc).__name__}: {exc}"
        if verdict is not True:
            why = verdict if isinstance(verdict, str) and verdict else "denied by authorize hook"
            return await _end(db, policy, run, lease, ctx, "failed", "run.failed.unauthorized",
                              None, f"unauthorized: {why}")
    executor = ctx.executors.for_kind(run["action_kind"])
    if executor is None:
        return await _end(db, policy, run, lease, ctx, "failed", "run.failed.exception", 1,
                          f"no executor for action kind {run['action_kind']!r}")
    key = run.get("concurrency_key")
    lock = KeyLock(ctx.lock_dir, key) if key and ctx.lock_dir is not None else None
    try:
        if lock is not None:
            next_check = 0.0
            while not lock.try_acquire():
                if ctx.stopping is not None and ctx.stopping.is_set():
                    return await _end(db, policy, run, lease, ctx, "queued",
                                      "run.queued.worker_shutdown", None, None)
                if time.monotonic() >= next_check:
                    await _supervise_once(db, policy, run, lease, ctx)
                    next_check = time.monotonic() + ctx.check_interval
                await asyncio.sleep(0.05)
        return await _run_supervised(db, policy, run, decoded, lease, executor, ctx)
    except LeaseLost as exc:
        log.info("run %s: lease lost (%s); child stopped, nothing written", run["id"], exc)
        return "lost"
    finally:
        if lock is not None:
            lock.release()


async def _run_supervised(db: StateDB, policy: EntityPolicy, run: dict[str, Any],
                          decoded: dict[str, Any], lease: dict[str, Any], executor: ExecuteFn,
                          ctx: RunContext) -> str:
    started = ctx.clock()
    timeout = run.get("timeout_seconds")
    deadline = started + timeout if timeout else None
    task: asyncio.Task[tuple[int, str]] = asyncio.ensure_future(_call(executor, decoded))
    try:
        while True:
            wait = until_next_check(ctx.check_interval)
            if deadline is not None:
                wait = max(0.0, min(wait, deadline - ctx.clock()))
            done, _ = await asyncio.wait({task}, timeout=wait)
            if done:
                break
            if deadline is not None and ctx.clock() >= deadline:
                await _stop(task)
                return await _end(db, policy, run, lease, ctx, "timed_out",
                                  "run.timed_out.deadline", TIMEOUT_EXIT_CODE,
                                  f"timed out after {timeout:g}s; process group killed")
            if ctx.stopping is not None and ctx.stopping.is_set():
                await _stop(task)
                return await _end(db, policy, run, lease, ctx, "queued",
                                  "run.queued.worker_shutdown", None, None)
            try:
                await _supervise_once(db, policy, run, lease, ctx)
            except LeaseLost:
                raise
            except Exception as exc:  # e.g. a busy database: the lease may still be ours
                log.warning("run %s: lease check failed (%s); retrying at the next check",
                            run["id"], exc)
    except BaseException:
        await _stop(task)
        raise
    try:
        code, detail = task.result()
    except Exception as exc:
        return await _fail(db, policy, run, lease, ctx, "run.failed.exception", 1,
                           f"{type(exc).__name__}: {exc}")
    if code == 0:
        return await _end(db, policy, run, lease, ctx, "completed", "run.completed.ok", 0, None)
    return await _fail(db, policy, run, lease, ctx, "run.failed.exit_nonzero", code,
                       detail or f"exit code {code}")


async def _call(executor: ExecuteFn, decoded: dict[str, Any]) -> tuple[int, str]:
    """Call inside the task, so an executor raising before it awaits is a failed run too."""
    return await executor(decoded)


async def _stop(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def _supervise_once(db: StateDB, policy: EntityPolicy, run: dict[str, Any],
                          lease: dict[str, Any], ctx: RunContext) -> None:
    """Raise LeaseLost if the row is no longer ours; renew the lease when it is due."""
    row = await ctx.lease_reads.lease_row(db, run["id"])
    if (row is None or row["status"] != "running" or row["leased_by"] != lease["leased_by"]
            or row["lease_expires_at"] != lease["lease_expires_at"]
            or row["lease_token"] != lease["lease_token"]):
        raise LeaseLost("row changed under us: " + (row["status"] if row else "deleted"))
    now = ctx.clock()
    if now < lease["lease_expires_at"] - ctx.lease_ttl * (1 - RENEW_FRACTION):
        return
    new_expiry = now + ctx.lease_ttl
    applied = await db.write(lambda conn: move(
        conn, policy, run["id"], "running", "running", "run.running.lease_renewed",
        actor=_actor(ctx.worker_id), guard=dict(lease),
        patch={"lease_expires_at": new_expiry}, now=now).applied)
    if not applied:
        raise LeaseLost("renewal conflicted")
    lease["lease_expires_at"] = new_expiry


async def _fail(db: StateDB, policy: EntityPolicy, run: dict[str, Any], lease: dict[str, Any],
                ctx: RunContext, code: str, exit_code: int | None, detail: str) -> str:
    """A failed run goes to retry_wait while its retry policy has attempts left."""
    raw = run.get("retry_policy")
    try:
        policy_ = RetryPolicy.from_dict(loads(raw)) if raw else None
    except Exception as exc:  # a hand-edited row: fail it plainly rather than strand it
        policy_ = None
        detail = f"{detail} (retry_policy unreadable: {exc})"
    runs_done = int(run.get("run_attempts") or 0) + 1
    if policy_ is not None and runs_done < policy_.max_attempts:
        now = ctx.clock()
        due = now + policy_.delay(runs_done)
        patch = {**NO_LEASE, "retry_due_at": due,
                 "run_attempts": runs_done, "exit_code": exit_code,
                 "error_detail": detail[-DETAIL_LIMIT:]}
        applied = await _write_outcome(db, lambda conn: _finish(
            conn, policy, run, "retry_wait", "run.retry_wait.backoff", dict(lease), patch, now,
            ctx.worker_id, summary=f"attempt {runs_done} of {policy_.max_attempts} failed"))
        return "retry_wait" if applied else "lost"
    return await _end(db, policy, run, lease, ctx, "failed", code, exit_code, detail)


async def _write_outcome(db: StateDB, unit: Callable[[sqlite3.Connection], bool],
                         attempts: int = 3) -> bool:
    """Write a run's outcome, retrying a transient database error a few times.

    Giving up leaves the row running until its lease expires and the reaper requeues
    it, i.e. the task runs again: worth a short wait here. The write is guarded, so a
    retry after a commit that did land simply conflicts.
    """
    for attempt in range(attempts):
        try:
            return await db.write(unit)
        except sqlite3.OperationalError as exc:
            if attempt == attempts - 1:
                raise
            log.warning("outcome write failed (%s); retrying", exc)
            await asyncio.sleep(0.2 * 2 ** attempt)
    raise AssertionError("unreachable")


async def _end(db: StateDB, policy: EntityPolicy, run: dict[str, Any], lease: dict[str, Any],
               ctx: RunContext, to_state: str, code: str, exit_code: int | None,
               detail: str | None) -> str:
    now = ctx.clock()
    if to_state not in policy.terminal:  # graceful shutdown: not a failed attempt, give it back
        patch: dict[str, Any] = {**NO_LEASE,
                                 "lease_attempts": max(0, int(run["lease_attempts"]) - 1)}
    else:
        patch = {"ended_at": now, "exit_code": exit_code,
                 "error_detail": detail[-DETAIL_LIMIT:] if detail else None,
                 "run_attempts": int(run.get("run_attempts") or 0) + 1}
    applied = await _write_outcome(db, lambda conn: _finish(
        conn, policy, run, to_state, code, dict(lease), patch, now, ctx.worker_id,
        summary=detail or ""))
    if not applied:
        log.info("run %s: terminal write %s conflicted (lease no longer ours)", run["id"], to_state)
        return "lost"
    return to_state


# ----------------------------------------------------------------- passes


def _fixed_clock(now: float | None) -> Callable[[], float]:
    if now is None:
        return time.time
    start = time.monotonic()
    return lambda: now + (time.monotonic() - start)


async def claim_and_execute(db: StateDB, *, worker_id: str, execute: ExecuteFn | None = None,
                            now: float | None = None,
                            lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
                            limit: int = DEFAULT_CLAIM_LIMIT,
                            advertised_capabilities: list[str] | None = None,
                            execution_targets: list[str] | None = None,
                            heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
                            adapters: Mapping[str, ExecuteFn] | None = None,
                            authorize: Authorize | None = None,
                            lock_dir: str | Path | None = None) -> int:
    """One claim pass, then run every claimed row concurrently to its end; returns claims.

    Past the record: claimed rows run concurrently (not one after another), leases
    are renewed while they run, and terminal writes record ended_at/exit_code/error_detail.
    """
    executors = Executors(execute=execute, adapters=dict(adapters or {}))
    claimed = await claim_runs(
        db, worker_id=worker_id, now=now, lease_ttl=lease_ttl, limit=limit,
        advertised_capabilities=advertised_capabilities, execution_targets=execution_targets,
        heartbeat_ttl=heartbeat_ttl, excluded_kinds=executors.excluded_kinds())
    ctx = RunContext(worker_id=worker_id, lease_ttl=lease_ttl, clock=_fixed_clock(now),
                     executors=executors, authorize=authorize,
                     lock_dir=Path(lock_dir) if lock_dir is not None else None)
    outcomes = await asyncio.gather(*(execute_claimed(db, run, ctx) for run in claimed.claimed),
                                    return_exceptions=True)
    for run, outcome in zip(claimed.claimed, outcomes, strict=True):
        if isinstance(outcome, BaseException):  # the others still ran to their end
            log.error("run %s: supervisor failed: %r", run["id"], outcome)
    return len(claimed.claimed)


async def worker_tick(db: StateDB, *, worker_id: str, execute: ExecuteFn | None = None,
                      now: float | None = None, lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
                      limit: int = DEFAULT_CLAIM_LIMIT,
                      advertised_capabilities: list[str] | None = None,
                      execution_targets: list[str] | None = None,
                      heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
                      adapters: Mapping[str, ExecuteFn] | None = None,
                      authorize: Authorize | None = None,
                      lock_dir: str | Path | None = None) -> dict[str, int]:
    """Heartbeat, reap, then claim and execute: the record's tick, in that order."""
    targets = execution_targets if execution_targets is not None else ["host"]
    await register_heartbeat(db, worker_id=worker_id,
                             advertised_capabilities=advertised_capabilities,
                             execution_targets=targets, now=now)
    reaped = await reap_expired_leases(db, now=now)
    await promote_due(db, now=now)
    claimed = await claim_and_execute(
        db, worker_id=worker_id, execute=execute, now=now, lease_ttl=lease_ttl, limit=limit,
        advertised_capabilities=advertised_capabilities, execution_targets=targets,
        heartbeat_ttl=heartbeat_ttl, adapters=adapters, authorize=authorize, lock_dir=lock_dir)
    return {"requeued": reaped["requeued"], "failed": reaped["failed"], "claimed": claimed}
