"""Rows a pass cannot move, and the savepoint that keeps one such row from failing the rest.

A worker's maintenance and claim passes each touch many rows in one transaction; a
row whose move raises (a state the loaded specs do not know, a hand-edited column, a
trigger refusing it) must neither undo the others' moves nor be retried on every tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ledgerq.errors import DatabaseDamaged, DatabaseGone, DatabaseUnavailable

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import EventStore

log = logging.getLogger("ledgerq.worker")
T = TypeVar("T")

#: A row whose move raised is left alone this long by every pass before one more try.
STUCK_RETRY_SECONDS = 60.0


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
                 clock: Callable[[], float] = time.monotonic, *, what: str = "run") -> None:
        if retry_after < 0:
            raise ValueError(f"retry_after must be >= 0, not {retry_after}")
        #: What the rows are, as the log names them ("run", "schedule").
        self.what = what
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
            log.warning("%s %s is stuck: the %s pass cannot move it (%s); skipping it, "
                        "every other row proceeds; retried every %gs", self.what, run_id,
                        step, reason, self.retry_after)

    def tried(self, run_ids: Iterable[str]) -> None:
        """These rows went through a pass without raising: they are stuck no more."""
        if not self.rows:
            return
        for rid in run_ids:
            if self.rows.pop(rid, None) is not None:
                log.info("%s %s is no longer stuck", self.what, rid)

    def note_once(self, key: str, message: str, *args: Any) -> None:
        """Log a condition of a whole pass (e.g. a state the specs lack) once per tracker."""
        if key not in self._notes:
            self._notes.add(key)
            log.warning(message, *args)


#: What the plain worker functions (worker_tick and friends) use when given no tracker.
PROCESS_STUCK = StuckRows()


def tracked(stuck: StuckRows | None) -> StuckRows:
    return PROCESS_STUCK if stuck is None else stuck


def is_database_failure(exc: BaseException) -> bool:
    """A failure of the database or the connection (already translated by the store):
    no row's fault, so a pass that meets one fails as a whole and is retried."""
    return isinstance(exc, DatabaseUnavailable | DatabaseDamaged | DatabaseGone)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def isolated(tx: EventStore, fn: Callable[..., T], *args: Any) -> tuple[T | None, str | None]:
    """``fn(*args)`` in its own savepoint: what it wrote vanishes alone if it raises.

    Returns (its value, None), or (None, the failure's description). A failure of the
    database itself (busy, I/O, full, corrupt, a lost connection) is no row's fault: it
    propagates and fails the whole pass.
    """
    try:
        with tx.savepoint():
            value = fn(*args)
    except Exception as exc:
        if tx.is_database_failure(exc):
            raise
        return None, describe(exc)
    return value, None


@dataclass
class Swept:
    """What a maintenance unit did, and which rows it could not move (id -> reason)."""

    counts: dict[str, int]
    failures: dict[str, str] = field(default_factory=dict)
    tried: list[str] = field(default_factory=list)
    #: The unit stopped at its bound with rows left to move (see promotion.promote_due).
    more: bool = False


def record(stuck: StuckRows, step: str, swept: Swept) -> dict[str, int]:
    """Hand a unit's failures and successes to the tracker, on the event loop's side."""
    for rid, reason in swept.failures.items():
        stuck.report(rid, step, reason)
    stuck.tried(swept.tried)
    return swept.counts


def unskipped(ids: Iterable[str], skip: frozenset[str]) -> bool:
    """Whether any of ``ids`` (read with a limit of len(skip)+1) is outside ``skip``.

    A stuck row must not make every pass take the write lock only to skip the row
    again, and an empty tracker costs what ``LIMIT 1`` did.
    """
    return any(i not in skip for i in ids)
