"""Shared helpers for schedule_run rows: decoding, facts written by the queue, dependencies."""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from ledgerq.lifecycle.engine import apply_transition
from ledgerq.lifecycle.models import Actor, StateReason, TransitionRequest, TransitionResult
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.store.codec import loads

ENTITY = "schedule_run"
SYSTEM = Actor(type="system", id="ledgerq")
JSON_COLUMNS = ("trigger_context", "action_args", "required_capabilities", "depends_on",
                "retry_policy", "status_evidence_refs")


class MalformedRow(ValueError):
    """A row whose stored JSON cannot be decoded (e.g. written by hand)."""


def decode_run(row: dict[str, Any]) -> dict[str, Any]:
    """A schedule_runs row with its JSON columns decoded; MalformedRow names the column."""
    out = dict(row)
    for col in JSON_COLUMNS:
        if col in out and isinstance(out[col], str | bytes):
            try:
                out[col] = loads(out[col])
            except Exception as exc:
                raise MalformedRow(f"run {row.get('id')!r}: column {col} holds invalid JSON: "
                                   f"{exc}") from None
    return out


def move(conn: sqlite3.Connection, policy: EntityPolicy, run_id: str, from_state: str | None,
         to_state: str, code: str, *, actor: Actor = SYSTEM, summary: str = "",
         guard: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
         metadata: dict[str, Any] | None = None, now: float | None = None) -> TransitionResult:
    """One guarded move of a run inside the caller's transaction (the queue's only write path)."""
    request = TransitionRequest(
        entity_type=policy.name, entity_id=run_id, from_state=from_state, to_state=to_state,
        reason=StateReason(code=code, summary=summary, metadata=metadata or {}),
        actor=actor, idempotency_key="",  # guards make internal moves safe to repeat
    )
    return apply_transition(conn, policy, request, guard, patch, now)


_DEPENDENTS = """
SELECT id, depends_on FROM schedule_runs
WHERE status = 'waiting_dependency'
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
        todo = [(r["id"], r["depends_on"]) for rid in run_ids
                for r in conn.execute(_DEPENDENTS, (rid,))]
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
                todo += [(r["id"], r["depends_on"]) for r in conn.execute(_DEPENDENTS, (rid,))]
        elif all(statuses.get(d) == "completed" for d in deps):
            res = move(conn, policy, rid, "waiting_dependency", "queued",
                       "run.queued.dependencies_met", patch={"queued_at": ts}, now=ts)
            counts["released"] += int(res.applied)
    return counts
