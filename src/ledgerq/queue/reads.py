"""Read models over the queue's projection: listing, lookup, statistics, waiting.

These are plain reads (no facts are written); the ``ledgerq`` command and
applications use them to answer "what is in the queue and what happened to it".
Every JSON column of a run comes back decoded.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from ledgerq.codec import loads
from ledgerq.errors import InvalidInput
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.rows import decode_cursor, decode_json, encode_cursor
from ledgerq.queue import moves
from ledgerq.queue.dependencies import waiting_on_cycles
from ledgerq.queue.moves import ENTITY, PRIORITY_COLUMN, QUEUE_COLUMN
from ledgerq.queue.store import STUCK_KINDS
from ledgerq.queue.worker.config import DEFAULT_HEARTBEAT_TTL_SECONDS

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.store import ReadsTx

#: The entity whose rows these read models show (the queue's runs).
RUN_ENTITY = ENTITY
#: JSON columns of status_transitions (a run's come from its spec), decoded on the way out.
FACT_JSON_COLUMNS = ("evidence_refs", "metadata", "patch")
#: The columns of a run summary (``ls``), in display order; a stable contract for --json.
SUMMARY_COLUMNS = (
    "id", "status", "action_kind", "execution_target", "created_at", "updated_at", "ended_at",
    "exit_code", "leased_by", "lease_attempts", "run_attempts", "status_reason_code",
    "priority", "queue",
)
#: Summary columns specs that predate them may lack (they are then left out).
_OPTIONAL_SUMMARY = frozenset({PRIORITY_COLUMN, QUEUE_COLUMN})


def summary_columns(policy: EntityPolicy, columns: Iterable[str] = SUMMARY_COLUMNS
                    ) -> tuple[str, ...]:
    """``columns`` without the optional ones ``policy``'s table lacks."""
    return tuple(c for c in columns if c in policy.columns or c not in _OPTIONAL_SUMMARY)


def stored_run_policy(db: Database[ReadsTx]) -> EntityPolicy:
    """The run entity as the database's table has it: a read-only open of a database
    not yet migrated to this release's specs lacks the columns they add."""
    return next((p for p in db.log_policies() if p.name == RUN_ENTITY),
                db.registry.entity(RUN_ENTITY))


def _run_filters(policy: EntityPolicy, statuses: Iterable[str] | None,
                 kinds: Iterable[str] | None, targets: Iterable[str] | None,
                 queues: Iterable[str] | None) -> dict[str, list[Any]]:
    """The run filters; ``policy`` is the table as stored (:func:`stored_run_policy`)."""
    filters = {col: list(values or []) for col, values in (
        ("status", statuses), ("action_kind", kinds), ("execution_target", targets),
        (QUEUE_COLUMN, queues))}
    if filters[QUEUE_COLUMN] and QUEUE_COLUMN not in policy.columns:
        raise InvalidInput(f"the loaded specs declare no {QUEUE_COLUMN!r} column on "
                           f"{policy.table} to filter by")
    return filters
#: Shortest id prefix (or suffix) accepted by :func:`resolve_run_id`.
MIN_PREFIX = 4
#: A lease expired (or a retry due) this long before a live worker's heartbeat, and not
#: yet moved, counts as stuck: a worker reaps and promotes every half second or so.
STUCK_AFTER_SECONDS = 60.0
#: Stuck runs listed by id in QueueStats (all of them are counted).
STUCK_SAMPLE = 20


def decode_run_row(db: Database[ReadsTx], row: dict[str, Any]) -> dict[str, Any]:
    """A schedule_runs row with its JSON columns decoded (invalid JSON is left as text)."""
    return decode_json(row, db.registry.entity(RUN_ENTITY).json_columns)


def decode_row(policy: EntityPolicy, row: dict[str, Any]) -> dict[str, Any]:
    """A projection row with its JSON columns (the policy's) decoded, read from anywhere
    (an archive file too)."""
    return decode_json(row, policy.json_columns)


def decode_fact(fact: dict[str, Any]) -> dict[str, Any]:
    """A status_transitions row with evidence_refs, metadata and patch decoded."""
    return decode_json(fact, FACT_JSON_COLUMNS)


@dataclass
class RunPage:
    """One page of runs, newest first, and how many runs match the filter in total."""

    runs: list[dict[str, Any]]
    total: int
    limit: int
    offset: int
    #: The columns each summary has (the optional ones only where the table has them).
    columns: tuple[str, ...] = SUMMARY_COLUMNS


async def list_runs(db: Database[ReadsTx], *, statuses: Iterable[str] | None = None,
                    kinds: Iterable[str] | None = None, targets: Iterable[str] | None = None,
                    limit: int = 50, offset: int = 0, since: float | None = None,
                    since_column: str = "updated_at",
                    queues: Iterable[str] | None = None) -> RunPage:
    """Summaries of runs matching every given filter, newest first (created_at, then id).

    ``since``: only runs whose ``since_column`` (a timestamp column: ``updated_at``, the
    last move; ``ended_at``; ``created_at``) is at least that epoch time."""
    if limit < 0 or offset < 0:
        raise ValueError("limit and offset must be >= 0")
    policy = db.registry.entity(RUN_ENTITY)
    stored = stored_run_policy(db)
    filters = _run_filters(stored, statuses, kinds, targets, queues)
    if since_column not in policy.columns:
        raise ValueError(f"no run column {since_column!r}")
    bound = None if since is None else (since_column, since)
    columns = summary_columns(stored)

    def read(tx: ReadsTx) -> RunPage:
        total, rows = tx.read_page(policy, filters, columns, limit, offset, since=bound)
        return RunPage(rows, total, limit, offset, columns)

    return await db.read(read)


async def resolve_run_id(db: Database[ReadsTx], id_or_prefix: str) -> str:
    """The full id of the one run whose id is, starts with, or ends with ``id_or_prefix``.

    Run ids are time-ordered (UUIDv7): runs created minutes apart share their first
    eight characters and only the tail is random, so a short unique piece is easiest
    taken from the end. A prefix is tried first (it uses the primary key's index); only
    when no id starts with it is it tried as a suffix (a scan of the ids).
    LookupError when no run matches; ValueError when a piece is ambiguous.
    """
    policy = db.registry.entity(RUN_ENTITY)
    if await db.read(lambda tx: tx.read_statuses(policy, [id_or_prefix])):
        return id_or_prefix
    if len(id_or_prefix) >= MIN_PREFIX and "%" not in id_or_prefix and "_" not in id_or_prefix \
            and "\\" not in id_or_prefix:
        for suffix, what in ((False, "prefix"), (True, "suffix")):
            found = await db.read(functools.partial(
                _ids_matching, policy=policy, piece=id_or_prefix, suffix=suffix))
            if len(found) == 1:
                return str(found[0])
            if len(found) > 1:
                raise ValueError(f"id {what} {id_or_prefix!r} is ambiguous: matches "
                                 + ", ".join(found[:2])
                                 + (" and more" if len(found) > 2 else ""))
    raise LookupError(f"no run {id_or_prefix}")


def _ids_matching(tx: ReadsTx, *, policy: EntityPolicy, piece: str, suffix: bool) -> list[str]:
    return tx.list_ids_matching(policy, piece, suffix=suffix, limit=3)


async def get_run(db: Database[ReadsTx], run_id: str) -> dict[str, Any]:
    """The full row of one run (JSON decoded); LookupError names the id when it is missing."""
    policy = db.registry.entity(RUN_ENTITY)
    row = await db.read(lambda tx: tx.read_entity(policy, run_id))
    if row is None:
        raise LookupError(f"no run {run_id}")
    return decode_run_row(db, row)


async def get_runs(db: Database[ReadsTx], run_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """id -> full row (JSON decoded) of the runs that exist among ``run_ids``, in one read."""
    policy = db.registry.entity(RUN_ENTITY)
    ids = list(dict.fromkeys(run_ids))
    rows = await db.read(lambda tx: tx.read_entities(policy, ids)) if ids else []
    return {r["id"]: decode_run_row(db, r) for r in rows}


async def run_status(db: Database[ReadsTx], run_id: str) -> str | None:
    """The run's status now, or None when there is no such run."""
    policy = db.registry.entity(RUN_ENTITY)
    return (await db.read(lambda tx: tx.read_statuses(policy, [run_id]))).get(run_id)


async def fact_count(db: Database[ReadsTx]) -> int:
    """Facts in the log (every entity)."""
    return await db.read(lambda tx: tx.count_facts())


async def run_history(db: Database[ReadsTx], run_id: str) -> list[dict[str, Any]]:
    """Every fact of one run, oldest first, with its JSON columns decoded."""
    from ledgerq.projections.log import history

    return [decode_fact(f) for f in await history(db, RUN_ENTITY, run_id)]


@dataclass
class CursorPage:
    """One page of runs, newest first, and the cursor of the next (None: this is the last)."""

    items: list[dict[str, Any]]
    next_cursor: str | None


async def page_runs(db: Database[ReadsTx], *, statuses: Iterable[str] | None = None,
                    kinds: Iterable[str] | None = None, targets: Iterable[str] | None = None,
                    cursor: str | None = None, limit: int = 50,
                    columns: tuple[str, ...] = SUMMARY_COLUMNS,
                    queues: Iterable[str] | None = None) -> CursorPage:
    """Runs matching every given filter, newest first, one keyset page after ``cursor``.

    Unlike :func:`list_runs`' offsets, a cursor page neither repeats nor skips a run
    when new runs arrive between two pages. ``columns`` must include ``created_at``
    and ``id`` (the cursor is made of them); JSON columns come back decoded.
    """
    if limit < 1:
        raise InvalidInput("limit must be >= 1")
    policy = db.registry.entity(RUN_ENTITY)
    stored = stored_run_policy(db)
    cols = summary_columns(stored, dict.fromkeys((*columns, "created_at", "id")))
    unknown = [c for c in cols if c not in policy.columns and c not in SUMMARY_COLUMNS]
    if unknown:
        raise InvalidInput(f"no column {unknown[0]!r} in {policy.table}")
    before = decode_cursor(cursor) if cursor is not None else None
    filters = _run_filters(stored, statuses, kinds, targets, queues)
    rows = await db.read(lambda tx: tx.read_page_before(policy, filters, cols, before,
                                                        limit + 1))
    items = [decode_run_row(db, r) for r in rows[:limit]]
    last = items[-1] if len(rows) > limit else None
    return CursorPage(items, None if last is None else
                      encode_cursor(float(last["created_at"]), str(last["id"])))


async def fact_counts(db: Database[ReadsTx]) -> list[tuple[str, str, int]]:
    """(entity_type, reason_code, facts) for every pair in the log: how many times each
    transition happened since the database began (the log is append-only)."""
    return await db.read(lambda tx: tx.count_facts_by_reason())


@dataclass
class WaitHistogram:
    """Cumulative counts of waits at or below each bound (Prometheus' histogram shape)."""

    bounds: list[float]
    cumulative: list[int]
    count: int
    sum: float


async def claim_wait_histogram(db: Database[ReadsTx], bounds: Iterable[float]) -> WaitHistogram:
    """How long each claim waited in queued: from the fact that queued the run (its
    submission, a requeue, a retry falling due) to the fact of the claim, for every claim
    in the log."""
    from ledgerq.queue.moves import CLAIM

    claim_code = CLAIM.code
    edges = sorted(float(b) for b in bounds)
    cumulative, count, total = await db.read(
        lambda tx: tx.read_wait_histogram(RUN_ENTITY, claim_code, edges))
    return WaitHistogram(edges, cumulative, count, total)


@dataclass
class WorkerInfo:
    worker_id: str
    hostname: str | None
    pid: int | None
    last_heartbeat_at: float
    heartbeat_age_seconds: float
    running: int


@dataclass
class WorkerStatus:
    """One worker as ``ledgerq workers`` shows it: what it serves, when it was last alive,
    whether it was asked to stop, and the runs it holds now."""

    worker_id: str
    hostname: str | None
    pid: int | None
    advertised_capabilities: list[str]
    execution_targets: list[str]
    #: The queues it claims from; None for a worker of an older release (it claims from
    #: every queue, having no notion of one).
    queues: list[str] | None
    #: The action kinds it claims (the ones it has code for); None for a worker of an
    #: older release, which did not say.
    kinds: list[str] | None
    started_at: float | None
    last_heartbeat_at: float
    heartbeat_age_seconds: float
    stop_requested_at: float | None
    stop_requested_age_seconds: float | None
    running: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def worker_statuses(db: Database[ReadsTx], *, now: float | None = None) -> list[WorkerStatus]:
    """Every worker (by id) and the running runs each holds, from one snapshot.

    A database an older release made has no ``stop_requested_at`` until a writer opens it;
    a read-only open cannot add it, so its absence reads as "no request"."""
    policy = db.registry.entity(RUN_ENTITY)
    ts = time.time() if now is None else now

    def read(tx: ReadsTx) -> list[WorkerStatus]:
        held: dict[str, list[str]] = {}
        offset, page = 0, 1000
        while True:
            _, rows = tx.read_page(policy, {"status": ["running"]}, ("id", "leased_by"),
                                   page, offset)
            for r in rows:
                if r["leased_by"] is not None:
                    held.setdefault(r["leased_by"], []).append(r["id"])
            if len(rows) < page:
                break
            offset += page
        out: list[WorkerStatus] = []
        for w in tx.list_worker_rows():
            w = decode_json(w, ("advertised_capabilities", "execution_targets", "queues", "kinds"))
            asked = w.get("stop_requested_at")
            out.append(WorkerStatus(
                worker_id=w["worker_id"], hostname=w["hostname"], pid=w["pid"],
                advertised_capabilities=list(w["advertised_capabilities"] or []),
                execution_targets=list(w["execution_targets"] or []),
                queues=None if w.get("queues") is None else list(w["queues"]),
                kinds=None if w.get("kinds") is None else list(w["kinds"]),
                started_at=w.get("started_at"), last_heartbeat_at=w["last_heartbeat_at"],
                heartbeat_age_seconds=max(0.0, ts - w["last_heartbeat_at"]),
                stop_requested_at=asked,
                stop_requested_age_seconds=None if asked is None else max(0.0, ts - asked),
                running=sorted(held.get(w["worker_id"], []))))
        return out

    return await db.read(read)


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
    #: Kinds of queued runs that no live worker claims (none has their code): they wait
    #: until one that does starts.
    unserved_kinds: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _unserved(tx: ReadsTx, policy: EntityPolicy, now: float) -> list[str]:
    """Kinds of queued runs no live worker claims. A live worker of an older release
    (its kinds not said) may claim any: then none is reported."""
    served: set[str] = set()
    for w in tx.list_worker_rows():
        if now - w["last_heartbeat_at"] > DEFAULT_HEARTBEAT_TTL_SECONDS:
            continue
        kinds = w.get("kinds")
        if kinds is None:
            return []
        served.update(loads(kinds) if isinstance(kinds, str) else kinds)
    return [k for k in tx.list_queued_kinds(policy) if k not in served]


async def queue_stats(db: Database[ReadsTx], *, now: float | None = None,
                      stuck_after: float = STUCK_AFTER_SECONDS) -> QueueStats:
    """One consistent snapshot of the queue: per-status counts, oldest queued age, workers,
    and the runs stuck where no pass will move them (see :func:`_stuck_queries`)."""
    policy = db.registry.entity(RUN_ENTITY)
    states = list(policy.states)
    ts = time.time() if now is None else now
    # The kinds of stuck run the loaded specs can have (see SharedTx.find_stuck_runs): a
    # status the loaded specs do not declare (no pass of this version moves it); a lease
    # expired, or a retry due, ``stuck_after`` seconds before the heartbeat of a worker
    # already running then (its reaper or promotion should have moved the row and could
    # not); a waiting run whose depends_on is not valid JSON (never released); a queued
    # run that still holds a lease (no claim takes it). Other queued rows are not judged:
    # an unclaimed row may simply have no worker to serve it.
    needs = {"lease": "running", "retry": "retry_wait", "waiting": "waiting_dependency",
             "held": "queued"}
    kinds = [k for k in STUCK_KINDS if k not in needs or needs[k] in policy.states]

    def read(tx: ReadsTx) -> QueueStats:
        counts = dict.fromkeys(states, 0)
        counts.update(tx.count_statuses(policy))
        oldest = tx.find_oldest_queued_at(policy)
        running = tx.count_running_by_worker(policy)
        workers = [
            WorkerInfo(worker_id=w["worker_id"], hostname=w["hostname"], pid=w["pid"],
                       last_heartbeat_at=w["last_heartbeat_at"],
                       heartbeat_age_seconds=max(0.0, ts - w["last_heartbeat_at"]),
                       running=running.get(w["worker_id"], 0))
            for w in tx.list_workers()
        ]
        stuck_runs: list[StuckRun] = []
        stuck = 0
        undeclared = sum(n for s, n in counts.items() if s not in policy.states)
        for kind in kinds:
            if kind == "undeclared" and not undeclared:
                continue  # the counts already tell: skip a scan of the table
            n, sample = tx.find_stuck_runs(policy, kind, ts, stuck_after,
                                           STUCK_SAMPLE - len(stuck_runs))
            stuck += n
            stuck_runs += [StuckRun(*r) for r in sample]
        waiting = moves.DEPENDENCIES_MET.source
        if waiting is not None and counts.get(waiting):
            cycles = waiting_on_cycles(tx.list_all_waiting(policy))
            stuck += len(cycles)
            stuck_runs += [StuckRun(rid, waiting, "waits on a dependency cycle: "
                                    + " -> ".join([*cycle, cycle[0]]))
                           for rid, cycle in list(cycles.items())[
                               :max(0, STUCK_SAMPLE - len(stuck_runs))]]
        return QueueStats(
            now=ts, counts=counts, total=sum(counts.values()),
            oldest_queued_at=oldest,
            oldest_queued_age_seconds=None if oldest is None else max(0.0, ts - oldest),
            running_by_worker=running, workers=workers, stuck=stuck, stuck_runs=stuck_runs,
            unserved_kinds=_unserved(tx, policy, ts) if counts.get("queued") else [])

    return await db.read(read)


async def wait_for_runs(db: Database[ReadsTx], run_ids: Iterable[str], *, timeout: float = 60.0,
                        interval: float = 0.05) -> dict[str, str]:
    """Poll until every run is in a terminal state; returns id -> final status.

    TimeoutError names the runs still unfinished. Reads only: someone else (a Worker in
    this or another process) must be running them.
    """
    ids = list(dict.fromkeys(run_ids))
    policy = db.registry.entity(RUN_ENTITY)
    terminal = policy.terminal
    deadline = time.monotonic() + timeout
    while True:
        status = await db.read(lambda tx: tx.read_statuses(policy, ids)) if ids else {}
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


#: How late a fact may commit after its id was made and still be seen by a
#: :class:`FactFollower` (a write waiting for the lock, a slow group commit, clock skew
#: between hosts): each poll reads this far back and drops what it already returned.
FOLLOW_SETTLE_SECONDS = 5.0
#: Facts read per statement while following.
FOLLOW_PAGE = 500


def id_floor(ts: float) -> str:
    """The smallest time-ordered fact id (UUIDv7) made at or after epoch time ``ts``: ids
    sort by the millisecond they were made in (see ``lifecycle.ids.new_id``)."""
    h = f"{max(0, int(ts * 1000)) << 80:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class FactFollower:
    """The facts of one entity type as they are appended, each returned once.

    A cursor over fact ids alone would miss a fact whose id was made before another's
    but committed after it (writers run at once on PostgreSQL; on SQLite a unit's ids
    are made before its group commit). So each :meth:`poll` re-reads the last
    :data:`FOLLOW_SETTLE_SECONDS` and skips the ids it has returned; only a fact
    committed later than that after its id was made is missed. Reads only.
    """

    def __init__(self, db: Database[ReadsTx], entity_type: str = RUN_ENTITY, *,
                 since: float | None = None, settle: float = FOLLOW_SETTLE_SECONDS,
                 clock: Any = time.time) -> None:
        self.db = db
        self.entity_type = entity_type
        self.settle = settle
        self.clock = clock
        #: Where the next poll starts reading: at first ``since`` (default: now).
        self._start = id_floor(clock() if since is None else since)
        #: Ids returned whose fact may still be re-read (within the settle window).
        self._seen: set[str] = set()

    async def poll(self) -> list[dict[str, Any]]:
        """The facts appended since the last poll (JSON decoded), in id order."""
        start = self._start
        found: list[dict[str, Any]] = []
        after = start
        while True:
            page = await self.db.read(functools.partial(
                _facts_after, entity_type=self.entity_type, after=after))
            found += [f for f in page if f["id"] not in self._seen]
            if len(page) < FOLLOW_PAGE:
                break
            after = page[-1]["id"]
        self._seen.update(f["id"] for f in found)
        # The next poll re-reads the settle window, never before where this one started.
        self._start = max(start, id_floor(self.clock() - self.settle))
        self._seen = {i for i in self._seen if i > self._start}
        return [decode_fact(f) for f in found]


def _facts_after(tx: ReadsTx, *, entity_type: str, after: str) -> list[dict[str, Any]]:
    return tx.read_facts_after(entity_type, after, FOLLOW_PAGE)


__all__ = [
    "FOLLOW_SETTLE_SECONDS",
    "STUCK_AFTER_SECONDS",
    "SUMMARY_COLUMNS",
    "CursorPage",
    "FactFollower",
    "QueueStats",
    "RunPage",
    "StuckRun",
    "WaitHistogram",
    "WorkerInfo",
    "WorkerStatus",
    "claim_wait_histogram",
    "decode_cursor",
    "decode_fact",
    "decode_run_row",
    "encode_cursor",
    "fact_count",
    "fact_counts",
    "get_run",
    "get_runs",
    "list_runs",
    "page_runs",
    "queue_stats",
    "resolve_run_id",
    "run_history",
    "run_status",
    "stored_run_policy",
    "summary_columns",
    "wait_for_runs",
    "worker_statuses",
]
