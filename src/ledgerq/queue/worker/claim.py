"""Which queued rows a worker takes, and the guarded move that gives it their leases.

The choice (scan of the worker's queues in claim order, capability and target filter,
affinity order among equal priorities, one run per concurrency key) reads one
snapshot; each claim is then its own guarded move, so a row another claimant took
meanwhile is simply not claimed. Where writers run one at a time (SQLite), a pass
whose choice needs no more than each queue's first page chooses inside the claims'
own transaction instead (:func:`_choose_and_claim`): the same rows, with no read
transaction of its own and no hop to the read connection's thread.

A pass claims its chosen rows in order in one transaction, each claim its own move
and fact (a claim that raises is rolled back alone). Where writers run one at a time
(SQLite) it chooses ``limit`` rows. Where they run at once (PostgreSQL) every worker's
snapshot shows the same oldest rows: the pass chooses spares as well (``CLAIM_SPARES``
times the limit) and claims them in order until ``limit`` are claimed; a row another
claimant holds is skipped at once (``SKIP LOCKED``), one it took already fails its
compare-and-swap, and the next spare is tried. Only rows a pass claims are ever locked,
so a worker never hides rows it cannot serve from one that can, and a pass that finds
nothing to claim writes nothing.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledgerq.codec import loads
from ledgerq.lifecycle.claims import apply_claims
from ledgerq.lifecycle.ids import new_token
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.capabilities import affinity_score, capability_class, worker_can_serve
from ledgerq.queue.maintenance.stuck import StuckRows, describe, is_database_failure, tracked
from ledgerq.queue.runs import claim_reason, perform, run_policy, worker_actor
from ledgerq.queue.worker.config import (
    DEFAULT_CLAIM_LIMIT,
    DEFAULT_HEARTBEAT_TTL_SECONDS,
    DEFAULT_LEASE_TTL_SECONDS,
    WorkerConfig,
)
from ledgerq.queue.worker.store import Kinds

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.worker.store import WorkerTx

log = logging.getLogger("ledgerq.worker")

#: Candidates read per keyset page and rows scanned per pass (the ADR-0071 queue's values).
PAGE_SIZE = 50
SCAN_CAP = 5000
#: Where writers run at once: candidates chosen per slot, for the claims others win.
CLAIM_SPARES = 4
#: Candidates one claim statement carries per slot the pass has yet to fill: the chosen
#: spares past them go in a further statement only when others won enough of these, so a
#: pass that meets no other claimant checks and sends half of them, which measured
#: faster with one PostgreSQL worker and no slower with four (bench/postgres.py).
CLAIM_STEP = 2
#: An outcome slot of a spare the pass did not need to try.
_UNTRIED = object()


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
    #: Whether the scan stopped at its cap with rows of some queue left unread.
    capped: bool = False


def claim_order(row: dict[str, Any]) -> tuple[int, float, str]:
    """A candidate's place in the claim order: higher priority first, then oldest, then id."""
    return (-row["priority"], row["queued_at"], row["id"])


class _QueueScan:
    """One queue's candidates in claim order, read a keyset page at a time on demand (the
    first page ``first_page`` rows long, the others PAGE_SIZE)."""

    def __init__(self, tx: WorkerTx, policy: EntityPolicy, kinds: Kinds,
                 queue: str, first_page: int) -> None:
        self.tx, self.policy, self.kinds, self.queue = tx, policy, kinds, queue
        self.size = first_page
        self.cursor: tuple[int, float, str] | None = None
        self.buffer: list[dict[str, Any]] = []
        self.done = False

    def fill(self, budget: int) -> int:
        """Read the next page (at most ``budget`` rows); the number read."""
        size = min(self.size, budget)
        self.size = PAGE_SIZE
        page = self.tx.read_claim_page(self.policy, self.kinds, self.queue, self.cursor, size,
                                      columns=moves.CANDIDATE_COLUMNS,
                                      default_queue=moves.DEFAULT_QUEUE)
        self.done = len(page) < size
        if page:
            last = page[-1]
            self.cursor = (last["priority"], last["queued_at"], last["id"])
            self.buffer = page[::-1]  # popped from the end: claim order
        return len(page)


def _scan(tx: WorkerTx, policy: EntityPolicy, kinds: Kinds, queues: Sequence[str],
          result: ClaimPass, first_page: int, cap: int) -> Iterator[dict[str, Any]]:
    """The queued rows of ``queues`` in claim order, up to ``cap`` rows read.

    Each queue is its own range of the claim index, read in order a page at a time; the
    merge takes the best head of all. Rows of other queues, and rows below those the
    pass uses, are never read. When the cap stops a queue's reading, the merge stops
    too: everything yielded so far is then exactly the head of the claim order.
    """
    scans = [_QueueScan(tx, policy, kinds, q, first_page) for q in queues]

    def topped_up(scan: _QueueScan) -> bool:
        """Read ``scan``'s next page if it has no row left; False when the cap left it
        unread (the scan stops)."""
        if not scan.buffer and not scan.done:
            if result.scanned >= cap:
                result.capped = True
                return False
            result.scanned += scan.fill(cap - result.scanned)
        return True

    if len(scans) == 1:
        # One queue (most workers): its pages are already in claim order, nothing to
        # merge; the same rows, the same reads and the same cap as the merge below.
        (scan,) = scans
        while topped_up(scan) and scan.buffer:
            yield scan.buffer.pop()
        return
    heads: list[tuple[tuple[int, float, str], int]] = []

    def refill(i: int) -> bool:
        """Give scan ``i`` a head; False when the cap left it unread (the merge stops)."""
        if not topped_up(scans[i]):
            return False
        if scans[i].buffer:
            heapq.heappush(heads, (claim_order(scans[i].buffer[-1]), i))
        return True

    for i in range(len(scans)):
        if not refill(i):
            return
    while heads:
        _, i = heapq.heappop(heads)
        yield scans[i].buffer.pop()
        if not refill(i):
            return


def _candidates(tx: WorkerTx, policy: EntityPolicy, kinds: Kinds,
                advertised: list[str], targets: set[str], queues: Sequence[str],
                result: ClaimPass, enough: Callable[[dict[str, Any]], bool] | None = None,
                skip: frozenset[str] = frozenset(), first_page: int = PAGE_SIZE,
                cap: int = SCAN_CAP) -> list[dict[str, Any]]:
    """Eligible queued rows of ``queues`` in claim order (priority descending, then
    (queued_at, id)), read in keyset pages up to the scan cap.

    ``enough`` is offered each eligible row as it is found; when it returns True the
    scan stops there (the caller has all it can use). Rows in ``skip`` (stuck: their
    claim raised recently) are passed over, so they cannot take a pass's every slot.
    """
    eligible: list[dict[str, Any]] = []
    for row in _scan(tx, policy, kinds, queues, result, first_page, cap):
        if skip and row["id"] in skip:
            continue
        raw = row["required_capabilities"]
        if raw == "[]":  # most runs ask for no capability: nothing to decode or match
            caps: list[str] = []
        else:
            try:
                caps = loads(raw) or []
                if not isinstance(caps, list) or not all(isinstance(c, str) for c in caps):
                    raise ValueError("not a list of strings")
            except Exception:
                result.malformed.append(row["id"])
                log.warning("skipping run %s: required_capabilities is malformed", row["id"])
                continue
            if not worker_can_serve(caps, advertised):
                continue
        target = row["execution_target"]
        if target and target not in targets:
            continue
        row["required_capabilities"] = caps  # (the page's own dict: decoded in place)
        eligible.append(row)
        if enough is not None and enough(row):
            return eligible
    return eligible


class _Picker:
    """A pass's choice: candidates in the order offered, up to ``limit``, skipping any whose
    concurrency key is already running or was picked earlier in the pass.

    The running keys are read when the first candidate with a key is offered, in the
    same snapshot as the candidates, so most passes (no candidate has a key) never read
    them: one statement less a pass (a round trip on PostgreSQL)."""

    def __init__(self, running_keys: Callable[[], set[str]], limit: int) -> None:
        self.running_keys = running_keys
        self.blocked: set[str] | None = None
        self.limit = limit
        self.chosen: list[dict[str, Any]] = []

    def offer(self, cand: dict[str, Any]) -> bool:
        """Consider one candidate; True once ``limit`` are chosen."""
        if len(self.chosen) >= self.limit:
            return True
        key = cand["concurrency_key"]
        if key is not None:
            if self.blocked is None:
                self.blocked = set(self.running_keys())
            if key in self.blocked:
                return False
            self.blocked.add(key)
        self.chosen.append(cand)
        return len(self.chosen) >= self.limit


def _select(tx: WorkerTx, policy: EntityPolicy, worker_id: str, now: float,
            heartbeat_ttl: float, kinds: Kinds, advertised: list[str],
            targets: set[str], queues: Sequence[str], limit: int, result: ClaimPass,
            skip: frozenset[str] = frozenset(), cap: int = SCAN_CAP
            ) -> list[dict[str, Any]] | None:
    """The rows a pass will try to claim, read in one snapshot, reading at most ``cap``
    rows (``result.capped`` says whether that cut the scan short); None if the worker is
    stale."""
    hb = tx.read_worker_heartbeat(worker_id)
    if hb is not None and now - hb > heartbeat_ttl:
        return None
    # Every running row is in the lease index (NULL expiries included), and there are
    # only as many as workers run at once: cheap however deep the queue is.
    picker = _Picker(lambda: tx.list_running_keys(policy), limit)
    if not _ranks_by_affinity(advertised):
        # Every candidate scores 0, so the stable affinity sort keeps scan order and the
        # choice is the first ``limit`` unblocked eligible rows: stop scanning there.
        # Same rows as sorting the whole scan, without reading up to SCAN_CAP of them;
        # the first page is as long as the pass could use (most passes need no more),
        # spares included: one statement, where PAGE_SIZE pages took two for a pass of
        # 25 slots with its spares on PostgreSQL.
        _candidates(tx, policy, kinds, advertised, targets, queues, result,
                    enough=picker.offer, skip=skip, first_page=min(limit, SCAN_CAP),
                    cap=cap)
        return picker.chosen
    eligible = _candidates(tx, policy, kinds, advertised, targets, queues, result,
                           skip=skip, cap=cap)
    # Priority first; affinity orders runs of equal priority. Stable: equal both keep
    # the oldest-first order of the scan.
    eligible.sort(key=lambda c: (-c["priority"],
                                 -affinity_score(c["required_capabilities"], advertised)))
    for cand in eligible:
        if picker.offer(cand):
            break
    return picker.chosen


def _together(chosen: list[dict[str, Any]]) -> bool:
    """Whether a pass's chosen rows are claimed together (:func:`_claim_together`: the
    checks once, PostgreSQL's swaps in one statement, the facts in one insert; SQLite's
    swaps stay one per row, each its own guarded move, ~14 us a row less than one
    :func:`_claim_one` per row, bench/parts.py's claim): none has a concurrency key,
    whose claim must check it under its lock first."""
    return all(c["concurrency_key"] is None for c in chosen)


def _ranks_by_affinity(advertised: Sequence[str]) -> bool:
    """Whether a worker advertising ``advertised`` orders candidates by affinity, so its
    pass scans every candidate up to the cap instead of stopping at its limit."""
    return any(capability_class(t) == "affinity" for t in advertised)


def _claim_one(tx: WorkerTx, policy: EntityPolicy, cand: dict[str, Any],
               worker_id: str, now: float, lease_ttl: float) -> dict[str, Any] | None:
    key = cand["concurrency_key"]
    if key is not None:
        tx.lock_key(key)  # two claims of one key cannot both see it free
        if tx.is_key_running(policy, key):
            return None
    guard, patch = _lease_terms(cand, worker_id, now, lease_ttl)
    res = perform(tx, policy, cand["id"], moves.CLAIM,
                  actor=worker_actor(worker_id), summary=f"claimed by {worker_id}",
                  guard=guard, patch=patch, now=now, whole_row=True,
                  # Another claimant's row is skipped, not waited for (PostgreSQL: SKIP
                  # LOCKED).
                  skip_locked=True)
    return res.row if res.applied else None


def _lease_terms(cand: dict[str, Any], worker_id: str, now: float,
                 lease_ttl: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """A claim's guard (the row as the scan saw it: no lease, its attempts) and patch
    (the lease it takes), whether it is claimed alone or with the pass's others."""
    attempts = cand["lease_attempts"]
    return ({"lease_attempts": attempts, "leased_by": None},
            {"leased_by": worker_id, "lease_expires_at": now + lease_ttl,
             "lease_token": new_token(), "lease_attempts": attempts + 1})


def _claim_together(tx: WorkerTx, policy: EntityPolicy, chosen: list[dict[str, Any]], limit: int,
                    worker_id: str, now: float, lease_ttl: float) -> list[Any]:
    """:func:`_claim_in_order` for candidates without a concurrency key, together (each
    row still its own guarded move with its own fact, :data:`CLAIM_STEP` candidates a
    slot to a statement, in order); the outcome per candidate.

    A candidate after the ``limit``-th claim was not tried (as in order); one before it
    that was not claimed was lost to another claimant.
    """
    got: dict[str, dict[str, Any]] = {}
    sent = 0
    while len(got) < limit and sent < len(chosen):
        need = limit - len(got)
        chunk = chosen[sent:sent + need * CLAIM_STEP]
        sent += len(chunk)
        rows = [(c["id"], *_lease_terms(c, worker_id, now, lease_ttl)) for c in chunk]
        stored = apply_claims(tx, policy, rows, moves.CLAIM.source or "", moves.CLAIM.target,
                              claim_reason(worker_id), worker_actor(worker_id),
                              limit=need, now=now)
        got.update((r["id"], r) for r in stored)
    out: list[Any] = []
    claimed = 0
    for cand in chosen:
        if claimed >= limit:
            out.append(_UNTRIED)
            continue
        row = got.get(cand["id"])
        claimed += row is not None
        out.append(row)
    return out


def _claim_in_order(tx: WorkerTx, chosen: list[dict[str, Any]], limit: int,
                    claim: Callable[..., dict[str, Any] | None]) -> list[Any]:
    """Claim candidates in order until ``limit`` slots are used, each in its own savepoint;
    the outcome per candidate.

    A claim another claimant won frees its slot for the next spare; one that raises uses
    its slot (it is that row's failure alone, as where writers run one at a time). Claims
    rarely raise, so they first run together in one savepoint; only when one raises are
    they run again, each in its own.
    """
    try:
        with tx.savepoint():
            return _claims(tx, chosen, limit, claim, isolate=False)
    except Exception as exc:
        if tx.is_database_failure(exc):
            raise
    return _claims(tx, chosen, limit, claim, isolate=True)


def _claims(tx: WorkerTx, chosen: list[dict[str, Any]], limit: int,
            claim: Callable[..., dict[str, Any] | None], *, isolate: bool) -> list[Any]:
    got: list[Any] = []
    used = 0
    for cand in chosen:
        if used >= limit:
            got.append(_UNTRIED)
            continue
        if not isolate:
            row = claim(tx, cand=cand)
        else:
            try:
                with tx.savepoint():
                    row = claim(tx, cand=cand)
            except Exception as exc:
                if tx.is_database_failure(exc):
                    raise
                got.append(exc)
                used += 1
                continue
        used += row is not None
        got.append(row)
    return got


#: What a pass picked: what it saw, the rows it chose (None: its worker is stale) and
#: each one's outcome.
_Picked = tuple[ClaimPass, list[dict[str, Any]] | None, list[Any]]
#: What a pass chose, before its claims: what it saw and the rows (None: stale worker).
_Chosen = tuple[ClaimPass, list[dict[str, Any]] | None]


class _Pass:
    """One claim pass: its terms fixed when it starts, its steps as methods.

    How it reads and claims is chosen once, from what the worker advertises: a worker
    that ranks by affinity scans every candidate from a snapshot and then claims in a
    write of its own; any other chooses and claims in one write (one hop and one BEGIN
    and COMMIT fewer; PostgreSQL's drains measured faster), falling back to the snapshot
    when the choice needs more rows than the write may read.
    """

    def __init__(self, db: Database[WorkerTx], config: WorkerConfig, *, limit: int,
                 now: float, kinds: Kinds, skip: frozenset[str]) -> None:
        self.db, self.config, self.limit, self.now = db, config, limit, now
        self.kinds, self.skip = kinds, skip
        self.policy = run_policy(db)
        self.advertised = list(config.advertised_capabilities)
        self.targets = set(config.execution_targets or ["host"])
        #: Rows chosen per pass: spares where writers run at once, for the claims others win.
        self.wanted = limit * CLAIM_SPARES if db.many_writers else limit
        self.in_one_write = not _ranks_by_affinity(self.advertised)

    def choose(self, tx: WorkerTx, into: ClaimPass, cap: int = SCAN_CAP
               ) -> list[dict[str, Any]] | None:
        c = self.config
        return _select(tx, self.policy, c.worker_id, self.now, c.heartbeat_ttl,
                       self.kinds, self.advertised, self.targets, c.queues, self.wanted,
                       into, self.skip, cap)

    def claim_one(self, tx: WorkerTx, *, cand: dict[str, Any]) -> dict[str, Any] | None:
        return _claim_one(tx, policy=self.policy, cand=cand, worker_id=self.config.worker_id,
                          now=self.now, lease_ttl=self.config.lease_ttl)

    def claim_all(self, tx: WorkerTx, chosen: list[dict[str, Any]]) -> list[Any]:
        """Each chosen row's outcome: claimed together where none has a concurrency key,
        else in order, each under its key's lock."""
        if _together(chosen):
            return _claim_together(tx, self.policy, chosen, self.limit, self.config.worker_id,
                                   self.now, self.config.lease_ttl)
        return _claim_in_order(tx, chosen, self.limit, self.claim_one)

    def choose_and_claim(self, tx: WorkerTx, cap: int, choices: list[_Chosen]
                         ) -> _Picked | None:
        """The choice and its claims in one write transaction; None, having written
        nothing, when the choice needs more than ``cap`` rows read. Each choice made is
        added to ``choices`` before its rows are claimed, so a caller whose claims raised
        (and rolled back) still knows which rows they were.

        Where writers run one at a time (SQLite), its claims commit only if nobody wrote
        between its first read and its first claim (SQLite refuses that write, and the
        unit runs again under the lock), so it claims the rows a snapshot would have
        chosen, none of them taken meanwhile. Where they run at once (PostgreSQL, READ
        COMMITTED), each read sees the latest commits and the claims skip or lose, as
        always, the rows others hold or took meanwhile (their swaps re-check every guard).
        Its reading is bounded (each queue's first page) because the unit may hold the
        lock and, on SQLite, usually runs in the event loop's thread: a choice that needs
        more (rows filtered out, for capabilities, targets or running keys) is read from a
        snapshot instead.
        """
        seen = ClaimPass()  # (afresh: a unit may run more than once before its commit)
        chosen = self.choose(tx, seen, cap)
        if seen.capped:
            return None
        choices.append((seen, chosen))
        return seen, chosen, self.claim_all(tx, chosen) if chosen else []

    async def claim_one_by_one(self, chosen: list[dict[str, Any]]) -> list[Any]:
        """Claims that raised together, again one by one, each in its own savepoint, so a
        row that cannot be claimed fails alone; each one's outcome."""
        return await self.db.write(
            lambda tx: _claim_in_order(tx, chosen, self.limit, self.claim_one))

    async def claim_chosen(self, chosen: list[dict[str, Any]]) -> list[Any]:
        """The claims of rows chosen from a snapshot, in a write of their own."""
        try:
            return await self.db.write(lambda tx: self.claim_all(tx, chosen))
        except Exception as exc:
            if is_database_failure(exc) or not _together(chosen):
                raise
        return await self.claim_one_by_one(chosen)  # (it wrote nothing)

    async def pick(self) -> _Picked:
        """What the pass saw, chose and got, by the strategy chosen for it."""
        if self.in_one_write:
            cap = min(min(self.wanted, SCAN_CAP) * len(self.config.queues), SCAN_CAP)
            choices: list[_Chosen] = []
            try:
                picked = await self.db.write(
                    lambda tx: self.choose_and_claim(tx, cap, choices), reads_first=True)
            except Exception as exc:
                if is_database_failure(exc) or not choices \
                        or not _together(choices[-1][1] or []):
                    raise
                seen, chosen = choices[-1]  # (its claims raised together, writing nothing)
                return seen, chosen, await self.claim_one_by_one(chosen or [])
            if picked is not None:
                return picked
        seen = ClaimPass()
        chosen = await self.db.read(lambda tx: self.choose(tx, seen))
        return seen, chosen, await self.claim_chosen(chosen) if chosen else []


async def claim_pass(db: Database[WorkerTx], config: WorkerConfig, *, limit: int | None = None,
                     now: float | None = None, excluded_kinds: Iterable[str] | None = None,
                     stuck: StuckRows | None = None) -> ClaimPass:
    """One claim pass for ``config``'s worker: up to ``limit`` (default: its claim limit)
    rows of the kinds it has code for (:attr:`Executors.served_kinds`), or, given
    ``excluded_kinds``, of every kind but those.

    See :func:`claim_runs` for what a pass does.
    """
    limit = config.claim_limit if limit is None else limit
    if limit <= 0:
        return ClaimPass()
    tracker = tracked(stuck)
    kinds = Kinds(config.executors.served_kinds, only=True) if excluded_kinds is None \
        else Kinds(tuple(sorted(set(excluded_kinds))), only=False)
    one = _Pass(db, config, limit=limit, now=time.time() if now is None else now,
                kinds=kinds, skip=tracker.skipping())
    result, chosen, outcomes = await one.pick()
    if chosen is None:
        log.warning("worker %s heartbeat is stale; claiming nothing", config.worker_id)
        return result
    tried: list[str] = []
    for cand, got in zip(chosen, outcomes, strict=True):
        if got is _UNTRIED:
            continue
        if isinstance(got, BaseException):
            result.lost += 1
            if is_database_failure(got) or not isinstance(got, Exception):
                log.warning("claim of run %s failed: %s", cand["id"], got)
            else:
                result.failures[cand["id"]] = describe(got)
                tracker.report(cand["id"], "claim", describe(got))
        else:
            tried.append(cand["id"])
            if got is None:
                result.lost += 1
            else:
                result.claimed.append(got)
    tracker.tried(tried)
    return result


async def claim_runs(db: Database[WorkerTx], *, worker_id: str, now: float | None = None,
                     lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
                     limit: int = DEFAULT_CLAIM_LIMIT,
                     advertised_capabilities: Iterable[str] | None = None,
                     execution_targets: Iterable[str] | None = None,
                     heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
                     excluded_kinds: Iterable[str] = ("workflow",),
                     stuck: StuckRows | None = None,
                     queues: Iterable[str] | None = None) -> ClaimPass:
    """One claim pass: scan, filter, order by affinity, claim up to ``limit`` rows.

    Each claim is its own guarded queued -> running move; all of a pass's claims
    commit together. A concurrency key already running (checked inside the claim's
    own transaction, so across workers too) or claimed earlier in this pass blocks a
    candidate for the rest of the pass. The heartbeat check, the running keys and the
    scan read one snapshot (on PostgreSQL, where a pass's first page is read in its
    claims' READ COMMITTED transaction, each its own: every claim re-checks its row as
    it swaps it). When the worker advertises no affinity token every score
    is equal, so the scan stops once ``limit`` rows are chosen (the same rows the full
    sort would pick); a pass then costs the same at any queue depth.

    A claim that raises is logged, counted in ``lost`` and reported to ``stuck``
    (default: the process-wide tracker), which keeps the row out of the next passes for
    a while; the pass's other claims complete all the same.

    Only runs in ``queues`` (default: the default queue) are claimed, in claim order:
    higher priority first, then oldest; affinity orders runs of equal priority.
    """
    config = WorkerConfig.build(
        worker_id=worker_id, lease_ttl=lease_ttl, heartbeat_ttl=heartbeat_ttl,
        claim_limit=limit, advertised_capabilities=advertised_capabilities,
        execution_targets=execution_targets, queues=queues)
    return await claim_pass(db, config, now=now, excluded_kinds=excluded_kinds, stuck=stuck)
