"""Shared helpers for schedule_run rows: decoding, facts written by the queue, dependencies."""

from __future__ import annotations

import functools
import sqlite3
import time
from typing import Any

from ledgerq.lifecycle.engine import Moved, apply_move
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.lifecycle.registry import EntityPolicy, sql_literal
from ledgerq.store.codec import loads

ENTITY = "schedule_run"
SYSTEM = Actor(type="system", id="ledgerq")


class MalformedRow(ValueError):
    """A row whose stored JSON cannot be decoded (e.g. written by hand)."""


def row_dict(row: sqlite3.Row) -> dict[str, Any]:
    """A Row as a dict; ``dict(row)`` looks each name up by a linear search, this does not."""
    return dict(zip(row.keys(), row, strict=True))


def decode_run(policy: EntityPolicy, row: dict[str, Any]) -> dict[str, Any]:
    """A run row with its spec-declared JSON columns decoded; MalformedRow names the column."""
    out = dict(row)
    for col in policy.json_columns:
        if col in out and isinstance(out[col], str | bytes):
            try:
                out[col] = loads(out[col])
            except Exception as exc:
                raise MalformedRow(f"run {row.get('id')!r}: column {col} holds invalid JSON: "
                                   f"{exc}") from None
    return out


def index_clause(policy: EntityPolicy, index: str, *states: str) -> str:
    """The status term of partial index ``index`` when its status list holds every ``states``.

    SQLite uses a partial index only when each term of the index's WHERE appears in the
    query's own WHERE; it does not see that ``status = 'queued'`` implies
    ``status IN ('queued', 'retry_wait')``. A query that filters on ``states`` adds this
    clause beside its own ``status = ?`` so the planner can use the index instead of
    scanning the table. The clause is implied by the query's own condition, so it never
    changes a result; for an index the spec does not declare (or declares differently)
    it is ``1``, and the query is merely slower. Any other term of the index's WHERE
    (``concurrency_key IS NOT NULL``) the query must imply itself, e.g. with
    ``concurrency_key = ?``.
    """
    covered = policy.index_states.get(index)
    if covered is None or not set(states) <= set(covered):
        return "1"
    return _status_in(covered)


@functools.lru_cache(maxsize=64)
def _status_in(states: tuple[str, ...]) -> str:
    return f"status IN ({', '.join(sql_literal(s) for s in states)})"


#: Longest summary whose StateReason is shared (claims, renewals: a worker id or less).
_CACHED_SUMMARY = 200


def _reason(code: str, summary: str, metadata: dict[str, Any] | None = None) -> StateReason:
    """A reason built without pydantic validation: the queue's own codes and strings."""
    return StateReason.model_construct(code=code, summary=summary, evidence_refs=[],
                                       metadata=metadata or {})


#: StateReason is frozen, so one per short (code, summary) is shared by every move.
_shared_reason = functools.lru_cache(maxsize=1024)(_reason)


def move(conn: sqlite3.Connection, policy: EntityPolicy, run_id: str, from_state: str | None,
         to_state: str, code: str, *, actor: Actor = SYSTEM, summary: str = "",
         guard: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
         metadata: dict[str, Any] | None = None, now: float | None = None,
         whole_row: bool = False) -> Moved:
    """One guarded move of a run inside the caller's transaction (the queue's only write path).

    No idempotency key: the guards make the queue's own moves safe to repeat. The reason
    is built without pydantic validation (its fields are the queue's own constants and
    strings); :func:`apply_move` still checks its code against the spec.
    """
    # A failure's summary carries its error text: not worth keeping around.
    shared = not metadata and len(summary) <= _CACHED_SUMMARY
    reason = _shared_reason(code, summary) if shared else _reason(code, summary, metadata)
    return apply_move(conn, policy, run_id, from_state, to_state, reason, actor, guard=guard,
                      patch=patch, now=now, whole_row=whole_row)


def _dependents_sql(policy: EntityPolicy) -> str:
    return f"""
SELECT id, depends_on FROM schedule_runs
WHERE {index_clause(policy, "idx_schedule_runs_waiting", "waiting_dependency")}
  AND status = 'waiting_dependency'
  AND EXISTS (SELECT 1 FROM json_each(schedule_runs.depends_on) WHERE value = ?)
"""


def resolve_dependents(conn: sqlite3.Connection, policy: EntityPolicy, run_ids: list[str],
                       *, waiting: bool = False, now: float | None = None) -> dict[str, int]:
    """Release or cancel waiting runs whose dependencies have all ended (in-transaction).

    ``run_ids`` are runs that just ended (their dependents are checked) or, with
    ``waiting=True``, waiting runs to check themselves. Cancelling a dependent can end
    its own dependents, so the work list grows until nothing more resolves.
    """
    ts = time.time() if now is None else now
    counts = {"released": 0, "cancelled": 0}
    if waiting:
        todo = [(r["id"], r["depends_on"]) for r in conn.execute(
            f"SELECT id, depends_on FROM schedule_runs WHERE status = 'waiting_dependency' "
            f"AND id IN ({', '.join('?' * len(run_ids))})", run_ids)]
    else:
        dependents = _dependents_sql(policy)
        todo = [(r["id"], r["depends_on"]) for rid in run_ids
                for r in conn.execute(dependents, (rid,))]
    seen: set[str] = set()
    while todo:
        rid, deps_json = todo.pop()
        if rid in seen:
            continue
        seen.add(rid)
        try:
            deps = list(loads(deps_json) or [])
        except Exception:
            continue  # a hand-written row; verify() reports it, the queue leaves it alone
        statuses = dict(conn.execute(
            f"SELECT id, status FROM schedule_runs WHERE id IN ({', '.join('?' * len(deps))})",
            deps).fetchall()) if deps else {}
        ended_badly = [d for d in deps
                       if statuses.get(d) in policy.terminal and statuses[d] != "completed"]
        if ended_badly:
            d = ended_badly[0]
            why = f"dependency {d} ended {statuses[d]}"
            res = move(conn, policy, rid, "waiting_dependency", "cancelled",
                       "run.cancelled.dependency_failed", summary=why,
                       patch={"ended_at": ts, "error_detail": why}, now=ts)
            if res.applied:
                counts["cancelled"] += 1
                todo += [(r["id"], r["depends_on"])
                         for r in conn.execute(_dependents_sql(policy), (rid,))]
        elif all(statuses.get(d) == "completed" for d in deps):
            res = move(conn, policy, rid, "waiting_dependency", "queued",
                       "run.queued.dependencies_met", patch={"queued_at": ts}, now=ts)
            counts["released"] += int(res.applied)
    return counts
