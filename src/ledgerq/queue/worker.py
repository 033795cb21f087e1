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
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ledgerq.codec import dumps, loads
from ledgerq.errors import DatabaseDamaged, DatabaseGone, DatabaseUnavailable
from ledgerq.lifecycle.models import Actor
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.operations import Tx
from ledgerq.queue.application import RetryPolicy
from ledgerq.queue.capabilities import affinity_score, capability_class, worker_can_serve
from ledgerq.queue.launcher import ExecuteFn, default_execute
from ledgerq.queue.leases import LeaseReads, until_next_check
from ledgerq.queue.locks import KeyLock
from ledgerq.queue.runs import (
    ENTITY,
    MalformedRow,
    decode_run,
    move,
    resolve_dependents,
)

if TYPE_CHECKING:
    from ledgerq.store.db import StateDB

log = logging.getLogger("ledgerq.worker")
T = TypeVar("T")

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
#: A row whose move raised is left alone this long by every pass before one more try.
STUCK_RETRY_SECONDS = 60.0

Authorize = Callable[[dict[str, Any]], "bool | str | Awaitable[bool | str]"]


def check_interval_for(lease_ttl: float) -> float:
    """The lease-check interval a lease of ``lease_ttl`` seconds gets when none is given.

    A renewal falls due after a third of the TTL and is noticed within one check, so a
    check interval above a third of the lease could let it lapse on a healthy worker;
    the usual interval is kept for every lease long enough for it.
    """
    return min(LEASE_CHECK_SECONDS, lease_ttl / 3)


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

    def unit(tx: Tx) -> None:
        tx.upsert_worker(worker_id, caps, targets, ts, host, os.getpid())

    await db.write(unit)


# ----------------------------------------------------------------- stuck rows


@dataclass
class StuckRow:
    """One row a pass could not move: which pass, why, and when it is tried again."""

    run_id: str
    step: str
    reason: str
    #: ``time.monotonic()`` before which every pass leaves the row alone.
    retry_at: float


class StuckRows:
    """Rows a worker's passes could not move, so one bad row never stops the others.

    A row whose move raised (a state the loaded specs do not know, a hand-edited column,
    a trigger refusing it) is skipped by every pass for ``retry_after`` seconds, then
    tried once more: an operator may have repaired it meanwhile. Each row is logged once
    per tracker, however often it fails again (a Worker has one tracker, so a worker
    process reports a stuck row once, not once per tick), and once more when it moves.

    Only the event loop's side touches a tracker; the passes' units, which run in the
    database thread, get a snapshot of :meth:`skipping` and return what failed.
    """

    def __init__(self, retry_after: float = STUCK_RETRY_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if retry_after < 0:
            raise ValueError(f"retry_after must be >= 0, not {retry_after}")
        self.retry_after = retry_after
        self.clock = clock
        self.rows: dict[str, StuckRow] = {}
        self._notes: set[str] = set()

    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self.rows

    def skipping(self) -> frozenset[str]:
        """Ids every pass leaves alone right now (their retry time has not come)."""
        if not self.rows:
            return frozenset()
        now = self.clock()
        return frozenset(rid for rid, r in self.rows.items() if r.retry_at > now)

    def report(self, run_id: str, step: str, reason: str) -> None:
        """Record that ``step`` could not move ``run_id``; logs only the first time."""
        first = run_id not in self.rows
        self.rows[run_id] = StuckRow(run_id, step, reason, self.clock() + self.retry_after)
        if first:
            log.warning("run %s is stuck: the %s pass cannot move it (%s); skipping it, "
                        "every other row proceeds; retried every %gs", run_id, step, reason,
                        self.retry_after)

    def tried(self, run_ids: Iterable[str]) -> None:
        """These rows went through a pass without raising: they are stuck no more."""
        if not self.rows:
            return
        for rid in run_ids:
            if self.rows.pop(rid, None) is not None:
                log.info("run %s is no longer stuck", rid)

    def note_once(self, key: str, message: str, *args: Any) -> None:
        """Log a condition of a whole pass (e.g. a state the specs lack) once per tracker."""
        if key not in self._notes:
            self._notes.add(key)
            log.warning(message, *args)


#: What the record's plain functions (worker_tick and friends) use when given no tracker.
PROCESS_STUCK = StuckRows()


def _is_database_failure(exc: BaseException) -> bool:
    """A failure of the database or the connection (already translated by the store):
    no row's fault, so a pass that meets one fails as a whole and is retried."""
    return isinstance(exc, DatabaseUnavailable | DatabaseDamaged | DatabaseGone)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _isolated(tx: Tx, fn: Callable[..., T], *args: Any) -> tuple[T | None, str | None]:
    """``fn(*args)`` in its own savepoint: what it wrote vanishes alone if it raises.

    Returns (its value, None), or (None, the failure's description). A failure of the
    database itself (busy, I/O, full, corrupt, a lost connection) is no row's fault: it
    propagates and fails the whole pass.
    """
    try:
        with tx.savepoint():
            value = fn(*args)
    except Exception as exc:
        if tx.database_failure(exc):
            raise
        return None, _describe(exc)
    return value, None


@dataclass
class _Swept:
    """What a maintenance unit did, and which rows it could not move (id -> reason)."""

    counts: dict[str, int]
    failures: dict[str, str] = field(default_factory=dict)
    tried: list[str] = field(default_factory=list)


def _settle_dependents(tx: Tx, policy: EntityPolicy, run_ids: list[str],
                       now: float) -> None:
    """Release or cancel the dependents of runs that just ended, never failing the end.

    A dependent that cannot be moved must not undo its dependency's terminal write
    (the run would stay running until its lease expired and then run again): its part
    is rolled back alone, and the dependency sweep retries it row by row.
    """
    _, err = _isolated(tx, functools.partial(resolve_dependents, now=now), tx, policy, run_ids)
    if err is not None:
        log.warning("dependents of %s not settled (%s); the dependency sweep retries them",
                    ", ".join(run_ids), err)


def _tracked(stuck: StuckRows | None) -> StuckRows:
    return PROCESS_STUCK if stuck is None else stuck


def _record(stuck: StuckRows, step: str, swept: _Swept) -> dict[str, int]:
    for rid, reason in swept.failures.items():
        stuck.report(rid, step, reason)
    stuck.tried(swept.tried)
    return swept.counts


# ----------------------------------------------------------------- reaper


def _reap(tx: Tx, policy: EntityPolicy, now: float,
          skip: frozenset[str] = frozenset()) -> _Swept:
    swept = _Swept({"requeued": 0, "failed": 0})
    for row in tx.expired_leases(policy, now):
        if row["id"] in skip:
            continue
        counted, err = _isolated(tx, _reap_one, tx, policy, row, now)
        if err is not None:
            swept.failures[row["id"]] = err
            continue
        swept.tried.append(row["id"])
        if counted:
            swept.counts[counted] += 1
    return swept


def _reap_one(tx: Tx, policy: EntityPolicy, row: dict[str, Any], now: float) -> str:
    """Requeue or fail one expired lease; returns the count it adds to ("" if none)."""
    guard = {"leased_by": row["leased_by"], "lease_expires_at": row["lease_expires_at"],
             "lease_token": row["lease_token"]}
    if row["lease_attempts"] < MAX_LEASE_ATTEMPTS:
        res = move(tx, policy, row["id"], "running", "queued", "run.queued.lease_expired",
                   summary=f"lease of {row['leased_by']} expired", guard=guard,
                   patch=dict(NO_LEASE), now=now,
                   metadata={"expired_worker": row["leased_by"]})
        return "requeued" if res.applied else ""
    detail = (f"lease expired {row['lease_attempts']} times "
              f"(last holder {row['leased_by']})")
    res = move(tx, policy, row["id"], "running", "failed",
               "run.failed.lease_attempts_exhausted", summary=detail, guard=guard,
               patch={"ended_at": now, "error_detail": detail}, now=now,
               metadata={"expired_worker": row["leased_by"]})
    if not res.applied:
        return ""
    _settle_dependents(tx, policy, [row["id"]], now)
    return "failed"


def _unskipped(ids: Iterable[str], skip: frozenset[str]) -> bool:
    """Whether any of ``ids`` (read with a limit of len(skip)+1) is outside ``skip``.

    A stuck row must not make every pass take the write lock only to skip the row
    again, and an empty tracker costs what ``LIMIT 1`` did.
    """
    return any(i not in skip for i in ids)


async def reap_expired_leases(db: StateDB, *, now: float | None = None,
                              stuck: StuckRows | None = None) -> dict[str, int]:
    """Return expired leases to the queue, or fail rows whose leases expired 3 times.

    A row whose move raises is skipped and reported through ``stuck`` (default: the
    process-wide tracker); the other expired rows are reaped all the same.
    """
    policy = db.registry.entity(ENTITY)
    ts = time.time() if now is None else now
    tracker = _tracked(stuck)
    skip = tracker.skipping()
    expired = await db.read(lambda tx: [r["id"] for r in tx.expired_leases(
        policy, ts, limit=len(skip) + 1)])
    if not _unskipped(expired, skip):
        return {"requeued": 0, "failed": 0}  # nothing expired: skip the write lock
    return _record(tracker, "reaper", await db.write(lambda tx: _reap(tx, policy, ts, skip)))


#: Waiting rows settled per resolve_dependents call (bound parameters stay under the limit).
SWEEP_CHUNK = 500


def _retry_one(tx: Tx, policy: EntityPolicy, row: dict[str, Any], now: float) -> bool:
    return move(tx, policy, row["id"], "retry_wait", "queued", "run.queued.retry_due",
                guard={"retry_due_at": row["retry_due_at"]},
                patch={"lease_attempts": 0, "retry_due_at": None, "queued_at": now},
                now=now).applied


def _promote(tx: Tx, policy: EntityPolicy, now: float,
             skip: frozenset[str] = frozenset(), *, retries: bool = True,
             dependencies: bool = True) -> _Swept:
    swept = _Swept({"retried": 0, "released": 0, "cancelled": 0})
    if retries:
        for row in tx.due_retries(policy, now):
            if row["id"] in skip:
                continue
            applied, err = _isolated(tx, _retry_one, tx, policy, row, now)
            if err is not None:
                swept.failures[row["id"]] = err
                continue
            swept.tried.append(row["id"])
            swept.counts["retried"] += int(bool(applied))
    if dependencies:
        settled = [r for r in tx.settled_waiting(policy) if r not in skip]
        for i in range(0, len(settled), SWEEP_CHUNK):
            _sweep(tx, policy, settled[i:i + SWEEP_CHUNK], now, swept)
    return swept


def _sweep(tx: Tx, policy: EntityPolicy, ids: list[str], now: float,
           swept: _Swept) -> None:
    """Settle waiting rows together; when that raises, row by row, so one row fails alone.

    A row settles with its own cascade (cancelling a run cancels its dependents), so a
    row whose cascade meets an unmovable dependent is the one reported.
    """
    def settle(part: list[str]) -> None:
        got = resolve_dependents(tx, policy, part, waiting=True, now=now)
        swept.counts["released"] += got["released"]
        swept.counts["cancelled"] += got["cancelled"]

    if _isolated(tx, settle, ids)[1] is None:
        swept.tried += ids
        return
    for rid in ids:
        _, err = _isolated(tx, settle, [rid])
        if err is None:
            swept.tried.append(rid)
        else:
            swept.failures[rid] = err


def _due_ids(tx: Tx, policy: EntityPolicy, now: float, limit: int, retries: bool,
             dependencies: bool) -> list[str]:
    """Up to ``limit`` ids of each kind a promotion pass would move (a cheap read first)."""
    ids = [r["id"] for r in tx.due_retries(policy, now, limit=limit)] if retries else []
    return ids + (tx.settled_waiting(policy, limit=limit) if dependencies else [])


async def promote_due(db: StateDB, *, now: float | None = None,
                      stuck: StuckRows | None = None) -> dict[str, int]:
    """Move due retries back to queued and settle waiting runs whose dependencies ended.

    Specs that do not declare ``retry_wait`` (or ``waiting_dependency``) are an older
    version of the queue's: their rows in that state are left alone (see DESIGN, spec
    evolution). A row whose move raises is skipped and reported through ``stuck``.
    """
    policy = db.registry.entity(ENTITY)
    ts = time.time() if now is None else now
    tracker = _tracked(stuck)
    retries = "retry_wait" in policy.states
    dependencies = "waiting_dependency" in policy.states
    for state, ok in (("retry_wait", retries), ("waiting_dependency", dependencies)):
        if not ok:
            tracker.note_once(f"undeclared:{state}",
                              "the loaded specs do not declare %s: its rows are left alone "
                              "(ledgerq stats counts them as stuck)", state)
    if not (retries or dependencies):
        return {"retried": 0, "released": 0, "cancelled": 0}
    skip = tracker.skipping()
    due = await db.read(lambda tx: _due_ids(tx, policy, ts, len(skip) + 1, retries,
                                            dependencies))
    if not _unskipped(due, skip):
        return {"retried": 0, "released": 0, "cancelled": 0}
    return _record(tracker, "promotion", await db.write(lambda tx: _promote(
        tx, policy, ts, skip, retries=retries, dependencies=dependencies)))


# ----------------------------------------------------------------- claim


@dataclass
class ClaimPass:
    """What a claim pass saw: rows claimed, plus rows it had to skip and why."""

    claimed: list[dict[str, Any]] = field(default_factory=list)
    scanned: int = 0
    malformed: list[str] = field(default_factory=list)
    #: Chosen rows not claimed: another claimant won, or the claim raised.
    lost: int = 0
    #: Chosen rows whose claim raised (id -> reason); each is also counted in ``lost``.
    failures: dict[str, str] = field(default_factory=dict)


def _candidates(tx: Tx, policy: EntityPolicy, excluded_kinds: list[str],
                advertised: list[str], targets: set[str], result: ClaimPass,
                enough: Callable[[dict[str, Any]], bool] | None = None,
                skip: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Eligible queued rows in (queued_at, id) order, read in keyset pages up to the scan cap.

    ``enough`` is offered each eligible row as it is found; when it returns True the
    scan stops there (the caller has all it can use). Rows in ``skip`` (stuck: their
    claim raised recently) are passed over, so they cannot take a pass's every slot.
    """
    eligible: list[dict[str, Any]] = []
    cursor: tuple[float, str] = (float("-inf"), "")
    while result.scanned < SCAN_CAP:
        page = tx.claim_page(policy, excluded_kinds, cursor,
                             min(PAGE_SIZE, SCAN_CAP - result.scanned))
        if not page:
            break
        result.scanned += len(page)
        cursor = (page[-1]["queued_at"], page[-1]["id"])
        for row in page:
            if skip and row["id"] in skip:
                continue
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
            cand = {**row, "required_capabilities": caps}
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


def _select(tx: Tx, policy: EntityPolicy, worker_id: str, now: float,
            heartbeat_ttl: float, excluded_kinds: list[str], advertised: list[str],
            targets: set[str], limit: int, result: ClaimPass,
            skip: frozenset[str] = frozenset()) -> list[dict[str, Any]] | None:
    """The rows a pass will try to claim, read in one snapshot; None if the worker is stale."""
    hb = tx.worker_heartbeat(worker_id)
    if hb is not None and now - hb > heartbeat_ttl:
        return None
    # Every running row is in the lease index (NULL expiries included), and there are
    # only as many as workers run at once: cheap however deep the queue is.
    picker = _Picker(tx.running_keys(policy), limit)
    if not any(capability_class(t) == "affinity" for t in advertised):
        # Every candidate scores 0, so the stable affinity sort keeps scan order and the
        # choice is the first ``limit`` unblocked eligible rows: stop scanning there.
        # Same rows as sorting the whole scan, without reading up to SCAN_CAP of them.
        _candidates(tx, policy, excluded_kinds, advertised, targets, result,
                    enough=picker.offer, skip=skip)
        return picker.chosen
    eligible = _candidates(tx, policy, excluded_kinds, advertised, targets, result,
                           skip=skip)
    # Stable: equal scores keep the oldest-first order of the scan.
    eligible.sort(key=lambda c: -affinity_score(c["required_capabilities"], advertised))
    for cand in eligible:
        if picker.offer(cand):
            break
    return picker.chosen


def _claim_one(tx: Tx, policy: EntityPolicy, cand: dict[str, Any],
               worker_id: str, now: float, lease_ttl: float) -> dict[str, Any] | None:
    # Another claimant's row is skipped, not waited for (PostgreSQL: SKIP LOCKED).
    if not tx.try_lock_row(policy, cand["id"]):
        return None
    key = cand["concurrency_key"]
    if key is not None:
        tx.lock_key(key)  # two claims of one key cannot both see it free
        if tx.key_running(policy, key):
            return None
    attempts = cand["lease_attempts"]
    res = move(tx, policy, cand["id"], "queued", "running", "run.started.ok",
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
                     excluded_kinds: Iterable[str] = ("workflow",),
                     stuck: StuckRows | None = None) -> ClaimPass:
    """One claim pass (D4): scan, filter, order by affinity, claim up to ``limit`` rows.

    Each claim is its own guarded queued -> running move; all of a pass's claims
    commit together. A concurrency key already running (checked inside the claim's
    own transaction, so across workers too) or claimed earlier in this pass blocks a
    candidate for the rest of the pass. The heartbeat check, the running keys and the
    scan read one snapshot. When the worker advertises no affinity token every score
    is equal, so the scan stops once ``limit`` rows are chosen (the same rows the full
    sort would pick); a pass then costs the same at any queue depth.

    A claim that raises is logged, counted in ``lost`` and reported to ``stuck``
    (default: the process-wide tracker), which keeps the row out of the next passes for
    a while; the pass's other claims complete all the same.
    """
    ts = time.time() if now is None else now
    tracker = _tracked(stuck)
    skip = tracker.skipping()
    result = ClaimPass()
    if limit <= 0:
        return result
    advertised = list(advertised_capabilities or [])
    targets = set(execution_targets or ["host"])
    excluded = sorted(set(excluded_kinds))
    policy = db.registry.entity(ENTITY)
    chosen = await db.read(lambda tx: _select(
        tx, policy, worker_id, ts, heartbeat_ttl, excluded, advertised, targets, limit,
        result, skip))
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
    tried: list[str] = []
    for cand, got in zip(chosen, outcomes, strict=True):
        if isinstance(got, BaseException):
            result.lost += 1
            if _is_database_failure(got) or not isinstance(got, Exception):
                log.warning("claim of run %s failed: %s", cand["id"], got)
            else:
                result.failures[cand["id"]] = _describe(got)
                tracker.report(cand["id"], "claim", _describe(got))
        else:
            tried.append(cand["id"])
            if got is None:
                result.lost += 1
            else:
                result.claimed.append(got)
    tracker.tried(tried)
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

    def __init__(self, message: str, outcome: str = "lost") -> None:
        super().__init__(message)
        #: How the run counts: ``cancelled`` or ``lost`` (see _lost_outcome).
        self.outcome = outcome


def _lost_outcome(row: dict[str, Any] | None, lease: dict[str, Any]) -> str:
    """What a run whose lease went away counts as in a worker's outcomes.

    A cancel of the run under our lease (a cancel keeps the lease columns, so the token
    tells) ends it where it stands: that is its real outcome. Anything else (reaped,
    reclaimed, deleted; or cancelled under a later lease) is ``lost``: whatever the row
    says now was not done to this run.
    """
    if row is not None and row["status"] == "cancelled" \
            and row["lease_token"] == lease["lease_token"]:
        return "cancelled"
    return "lost"


def _finish(tx: Tx, policy: EntityPolicy, run: dict[str, Any], to_state: str,
            code: str, guard: dict[str, Any], patch: dict[str, Any], now: float,
            worker_id: str, summary: str = "") -> bool:
    res = move(tx, policy, run["id"], "running", to_state, code, actor=_actor(worker_id),
               summary=summary, guard=guard, patch=patch, now=now)
    if res.applied and to_state in policy.terminal:
        _settle_dependents(tx, policy, [run["id"]], now)
    return res.applied


async def execute_claimed(db: StateDB, run: dict[str, Any], ctx: RunContext) -> str:
    """Run one claimed row to an end and write its outcome, guarded on our lease.

    Returns the state written (``completed``, ``failed``, ``retry_wait``,
    ``timed_out``, ``queued`` on shutdown), ``cancelled`` when an operator cancelled it
    meanwhile, or ``lost`` when the lease went away otherwise; in those two cases the
    child is stopped and nothing is written.
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
        return exc.outcome
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
        raise LeaseLost("row changed under us: " + (row["status"] if row else "deleted"),
                        _lost_outcome(row, lease))
    now = ctx.clock()
    if now < lease["lease_expires_at"] - ctx.lease_ttl * (1 - RENEW_FRACTION):
        return
    new_expiry = now + ctx.lease_ttl
    applied = await db.write(lambda tx: move(
        tx, policy, run["id"], "running", "running", "run.running.lease_renewed",
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
        applied = await _write_outcome(db, lambda tx: _finish(
            tx, policy, run, "retry_wait", "run.retry_wait.backoff", dict(lease), patch, now,
            ctx.worker_id, summary=f"attempt {runs_done} of {policy_.max_attempts} failed"))
        return "retry_wait" if applied else await _conflicted(db, run, lease, "retry_wait")
    return await _end(db, policy, run, lease, ctx, "failed", code, exit_code, detail)


async def _write_outcome(db: StateDB, unit: Callable[[Tx], bool],
                         attempts: int = 3) -> bool:
    """Write a run's outcome, retrying a transient database error a few times.

    Giving up leaves the row running until its lease expires and the reaper requeues
    it, i.e. the task runs again: worth a short wait here. The write is guarded, so a
    retry after a commit that did land simply conflicts.
    """
    for attempt in range(attempts):
        try:
            return await db.write(unit)
        except DatabaseUnavailable as exc:
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
    applied = await _write_outcome(db, lambda tx: _finish(
        tx, policy, run, to_state, code, dict(lease), patch, now, ctx.worker_id,
        summary=detail or ""))
    if not applied:
        return await _conflicted(db, run, lease, to_state)
    return to_state


async def _conflicted(db: StateDB, run: dict[str, Any], lease: dict[str, Any],
                      to_state: str) -> str:
    """The outcome of a run whose final write found the lease gone (see _lost_outcome)."""
    log.info("run %s: write of %s conflicted (lease no longer ours)", run["id"], to_state)
    try:
        policy = db.registry.entity(ENTITY)
        rows = await db.read(lambda tx: tx.lease_rows(policy, [run["id"]]))
        row = rows[0] if rows else None
    except Exception:  # only the count depends on it: lost is the safe answer
        return "lost"
    return _lost_outcome(row, lease)


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
                            lock_dir: str | Path | None = None,
                            stuck: StuckRows | None = None) -> int:
    """One claim pass, then run every claimed row concurrently to its end; returns claims.

    Past the record: claimed rows run concurrently (not one after another), leases
    are renewed while they run, and terminal writes record ended_at/exit_code/error_detail.
    Leases are checked every :func:`check_interval_for` ``lease_ttl`` seconds.
    """
    executors = Executors(execute=execute, adapters=dict(adapters or {}))
    claimed = await claim_runs(
        db, worker_id=worker_id, now=now, lease_ttl=lease_ttl, limit=limit,
        advertised_capabilities=advertised_capabilities, execution_targets=execution_targets,
        heartbeat_ttl=heartbeat_ttl, excluded_kinds=executors.excluded_kinds(), stuck=stuck)
    ctx = RunContext(worker_id=worker_id, lease_ttl=lease_ttl, clock=_fixed_clock(now),
                     executors=executors, authorize=authorize,
                     lock_dir=Path(lock_dir) if lock_dir is not None else None,
                     check_interval=check_interval_for(lease_ttl))
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
                      lock_dir: str | Path | None = None,
                      stuck: StuckRows | None = None) -> dict[str, int]:
    """Heartbeat, reap, then claim and execute: the record's tick, in that order.

    Rows a pass cannot move are skipped and reported through ``stuck`` (default: the
    process-wide tracker), so they never stop the tick's other rows.
    """
    targets = execution_targets if execution_targets is not None else ["host"]
    await register_heartbeat(db, worker_id=worker_id,
                             advertised_capabilities=advertised_capabilities,
                             execution_targets=targets, now=now)
    reaped = await reap_expired_leases(db, now=now, stuck=stuck)
    await promote_due(db, now=now, stuck=stuck)
    claimed = await claim_and_execute(
        db, worker_id=worker_id, execute=execute, now=now, lease_ttl=lease_ttl, limit=limit,
        advertised_capabilities=advertised_capabilities, execution_targets=targets,
        heartbeat_ttl=heartbeat_ttl, adapters=adapters, authorize=authorize, lock_dir=lock_dir,
        stuck=stuck)
    return {"requeued": reaped["requeued"], "failed": reaped["failed"], "claimed": claimed}
