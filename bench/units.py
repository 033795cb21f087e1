"""ledgerq's units alone: the in-transaction work of a lifecycle, with nothing around it.

A ceiling for the runtime, not a system: the same units a StateDB runs for a submit, a
claim pass and its runs' terminal writes (``insert_all``, ``_claim_together``,
``finish_all``: every check, statement and fact the engine makes), called
directly on a plain sqlite3 connection with the same schema and pragmas and committed
through the same ``_run_group``, single-threaded: no event loop, no futures, no
validation of the application, no supervision of the run. What the runtime adds is the
difference between this and ledgerq; what the engine adds is the difference between
this and the schema floor (bench/floor.py). Used by bench/queue.py (one submit per
commit, passes) and bench/runtime.py (units grouped as the 64 submitters' commits are,
their submits joined in one unit as ledgerq joins the submits of one turn).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from floor import APP, WORKER
from ledgerq.lifecycle import Registry
from ledgerq.queue import moves
from ledgerq.queue.runs import lease_of, terms, worker_actor
from ledgerq.queue.submission.application import validate
from ledgerq.queue.submission.submit import SUBMITTER, insert_all
from ledgerq.queue.worker.claim import _claim_together
from ledgerq.queue.worker.outcomes import finish_all
from ledgerq.store.sqlite.backend import STATEMENT_CACHE, _run_group
from ledgerq.store.sqlite.schema import create_schema

#: A run's lease, as the Worker's default gives it.
LEASE_TTL = 300.0


class Units:
    """A connection configured as a StateDB's writer, and the lifecycle's units on it."""

    def __init__(self, path: str, registry: Registry, sync: str) -> None:
        self.policy = registry.entity("schedule_run")
        self.conn = sqlite3.connect(path, isolation_level=None,
                                    cached_statements=STATEMENT_CACHE)
        for pragma in ("journal_mode = WAL", f"synchronous = {sync}", "foreign_keys = ON",
                       "temp_store = MEMORY"):
            self.conn.execute(f"PRAGMA {pragma}")
        create_schema(self.conn, registry)
        self.app = validate(APP)

    def close(self) -> None:
        self.conn.close()

    def group(self, units: list[Callable[[Any], Any]]) -> list[Any]:
        """``units`` in one transaction (one commit), their values."""
        outcomes = _run_group(self.conn, units=units, wait=True)
        assert outcomes is not None and all(ok for ok, _ in outcomes), outcomes
        return [value for _, value in outcomes]

    def submit(self, tx: Any, now: float | None = None) -> str:
        return insert_all(tx, self.policy, [self.app], time.time() if now is None else now,
                           "host", SUBMITTER)[0]

    def submit_joined(self, tx: Any, count: int, now: float) -> list[str]:
        """``count`` submits joined in one turn, as ledgerq.queue.submission.joined writes them."""
        return insert_all(tx, self.policy, [self.app] * count, now, "host", SUBMITTER)

    def claim_pass(self, tx: Any, rids: list[str], now: float) -> list[Any]:
        """A pass's claims, as ``claim_pass`` writes those of rows without a concurrency
        key: together."""
        cands = [{"id": rid, "concurrency_key": None, "lease_attempts": 0} for rid in rids]
        return _claim_together(tx, self.policy, cands, len(cands), WORKER, now, LEASE_TTL)

    def finish(self, tx: Any, runs: list[dict[str, Any]], now: float) -> list[Any]:
        """The runs' terminal writes after exit 0, each guarded on its lease, then their
        dependents settled, as a pass's outcomes are written together."""
        patch = {"ended_at": now, "exit_code": 0, "error_detail": None, "run_attempts": 1}
        return finish_all(tx, self.policy, [
            terms(run["id"], moves.EXITED_ZERO, actor=worker_actor(WORKER), summary="",
                  guard=lease_of(self.policy, run), patch=patch, now=now)
            for run in runs], now)


def units_lifecycles(path: str, registry: Registry, sync: str, n: int,
                     limit: int) -> dict[str, float]:
    """bench/queue.py's lifecycle scenario as units alone: ``n`` submits one per commit,
    then passes of ``limit`` (the claims in one commit, the terminal writes in another).
    Lifecycles/s with its submit-only and worker-only parts and CPU per lifecycle."""
    units = Units(path, registry, sync)
    c0, t0 = time.process_time(), time.perf_counter()
    ids = [units.group([units.submit])[0] for _ in range(n)]
    t1 = time.perf_counter()
    for first in range(0, n, limit):
        now = time.time()
        (claimed,) = units.group([partial(units.claim_pass, rids=ids[first:first + limit],
                                          now=now)])
        now = time.time()
        (done,) = units.group([partial(units.finish, runs=claimed, now=now)])
        assert len(done) == len(ids[first:first + limit]) and all(done), done
    t2, c2 = time.perf_counter(), time.process_time()
    (facts,) = units.conn.execute("SELECT count(*) FROM status_transitions").fetchone()
    units.close()
    assert facts == 3 * n, facts
    return {"lifecycle": n / (t2 - t0), "submit": n / (t1 - t0), "worker": n / (t2 - t1),
            "cpu_us": (c2 - c0) / n * 1e6}
