"""The guarded compare-and-swap: one status change = one UPDATE + one fact, one transaction.

Validation that needs no database (entity, reason code, column allowlists) happens in
the caller's task before anything is queued; the rest runs as one unit inside
:meth:`StateDB.write`, so the read, the checks, the UPDATE and the fact see one
snapshot under the write lock and commit (or vanish) together.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from typing import TYPE_CHECKING, Any

from ledgerq.lifecycle.models import Actor, StateReason, TransitionRequest, TransitionResult
from ledgerq.lifecycle.registry import STANDARD_COLUMNS, EntityPolicy
from ledgerq.store.codec import dumps, loads, to_sql

if TYPE_CHECKING:
    from ledgerq.store.db import StateDB

VOCABULARY_ERROR = "not in the declared transition vocabulary"

_FACT_INSERT = """
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""


def check_columns(policy: EntityPolicy, guard: dict[str, Any] | None,
                  patch: dict[str, Any] | None) -> None:
    for kind, given, allowed in (("guard", guard, policy.guard_columns),
                                 ("patch", patch, policy.patch_columns)):
        extra = sorted(set(given or ()) - allowed)
        if extra:
            raise ValueError(
                f"{kind} column(s) {', '.join(extra)} not allowed for {policy.name}; "
                f"allowed: {', '.join(sorted(allowed)) or 'none'}"
            )


def check_reason(policy: EntityPolicy, reason: StateReason) -> None:
    if reason.code not in policy.reason_codes:
        raise ValueError(
            f"unknown reason code {reason.code!r} for {policy.name}; "
            f"declared: {', '.join(sorted(policy.reason_codes))}"
        )


def prepare(db: StateDB, request: TransitionRequest, guard: dict[str, Any] | None,
            patch: dict[str, Any] | None) -> EntityPolicy:
    """Every check that needs no read; raises ValueError before anything is queued."""
    policy = db.registry.entity(request.entity_type)
    check_reason(policy, request.reason)
    check_columns(policy, guard, patch)
    return policy


async def transition(db: StateDB, request: TransitionRequest, *,
                     guard: dict[str, Any] | None = None,
                     patch: dict[str, Any] | None = None,
                     now: float | None = None) -> TransitionResult:
    """Apply one guarded move, or report a conflict; see docs/queue.md for the exact order."""
    policy = prepare(db, request, guard, patch)
    return await db.write(lambda conn: apply_transition(conn, policy, request, guard, patch, now))


def apply_transition(conn: sqlite3.Connection, policy: EntityPolicy, request: TransitionRequest,
                     guard: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
                     now: float | None = None) -> TransitionResult:
    """The in-transaction half of :func:`transition`; callers must have run :func:`prepare`."""
    guard = guard or {}
    patch = patch or {}
    repeat = _replay(conn, request)
    if repeat is not None:
        return repeat
    cols = ["status", "version", *sorted(guard)]
    row = conn.execute(
        f"SELECT {', '.join(cols)} FROM {policy.table} WHERE id = ?", (request.entity_id,)
    ).fetchone()
    if row is None:
        raise LookupError(f"{policy.name} {request.entity_id!r} not found")
    observed: str = row[0]
    if request.from_state is not None and observed != request.from_state:
        return _conflict(observed)
    if not policy.allows(observed, request.to_state):
        allowed = ", ".join(policy.targets(observed)) or "none (terminal)"
        raise ValueError(
            f"{policy.name} {observed} -> {request.to_state} is {VOCABULARY_ERROR}; "
            f"allowed from {observed}: {allowed}"
        )
    rule = policy.rule(observed, request.to_state)
    if rule.actors is not None and request.actor.type not in rule.actors:
        raise ValueError(
            f"{policy.name} {observed} -> {request.to_state} is restricted to actor type(s) "
            f"{', '.join(sorted(rule.actors))}; got {request.actor.type!r}"
        )
    for kind, need, given in (("guard", rule.requires_guard, guard),
                              ("patch", rule.requires_patch, patch)):
        missing = sorted(need - set(given))
        if missing:
            raise ValueError(
                f"{policy.name} {observed} -> {request.to_state} requires {kind} column(s) "
                f"{', '.join(missing)}"
            )
    for i, col in enumerate(sorted(guard)):
        if row[2 + i] != guard[col]:
            return _conflict(observed)

    ts = time.time() if now is None else now
    changes: dict[str, Any] = {
        "updated_at": ts,
        "status_reason_code": request.reason.code,
        "status_reason_summary": request.reason.summary,
        "status_evidence_refs": dumps(request.reason.evidence_refs),
    }
    changes.update({k: to_sql(v) for k, v in patch.items()})
    version = int(row[1]) + 1
    sets = ", ".join(f"{c} = ?" for c in changes)
    where = " AND ".join(["id = ?", "status = ?"] + [f"{c} IS ?" for c in sorted(guard)])
    # RETURNING reads the patched columns back as stored (after the column's type
    # affinity), so the fact records exactly what the row holds: 123 patched into a
    # TEXT column is '123' in both, and folding the log reproduces the row.
    patched = list(patch)
    returning = f" RETURNING {', '.join(patched)}" if patched else " RETURNING id"
    stored = conn.execute(
        f"UPDATE {policy.table} SET status = ?, version = ?, {sets} WHERE {where}{returning}",
        [request.to_state, version, *changes.values(), request.entity_id, observed,
         *(to_sql(guard[c]) for c in sorted(guard))],
    ).fetchall()
    if len(stored) != 1:
        return _conflict(observed)
    if patched:
        changes.update(zip(patched, stored[0], strict=True))
    fact_id = str(uuid.uuid4())
    _append_fact(conn, fact_id, policy.name, request.entity_id, observed, request.to_state,
                 request.reason, request.actor, ts, version, changes, request.idempotency_key)
    return TransitionResult(applied=True, previous_state=observed,
                            current_state=request.to_state, transition_id=fact_id)


def _conflict(observed: str) -> TransitionResult:
    # A conflict writes nothing; its transition_id names no fact.
    return TransitionResult(applied=False, conflict=True, previous_state=observed,
                            current_state=observed, transition_id=str(uuid.uuid4()))


def _replay(conn: sqlite3.Connection, request: TransitionRequest) -> TransitionResult | None:
    if not request.idempotency_key:
        return None
    fact = conn.execute(
        "SELECT id, previous_status, status FROM status_transitions "
        "WHERE entity_type = ? AND entity_id = ? AND idempotency_key = ?",
        (request.entity_type, request.entity_id, request.idempotency_key),
    ).fetchone()
    if fact is None:
        return None
    if fact[2] != request.to_state:
        raise ValueError(
            f"idempotency key {request.idempotency_key!r} already applied "
            f"{fact[1]} -> {fact[2]} to {request.entity_type} {request.entity_id!r}; "
            f"refusing a different move to {request.to_state}"
        )
    return TransitionResult(applied=True, previous_state=fact[1], current_state=fact[2],
                            transition_id=fact[0])


def _append_fact(conn: sqlite3.Connection, fact_id: str, entity_type: str, entity_id: str,
                 previous: str | None, status: str, reason: StateReason, actor: Actor,
                 ts: float, version: int, changes: dict[str, Any],
                 idempotency_key: str | None) -> None:
    conn.execute(_FACT_INSERT, (
        fact_id, entity_type, entity_id, previous, status, reason.code, reason.summary,
        dumps(reason.evidence_refs), actor.type, actor.id, ts, dumps(reason.metadata),
        version, dumps(changes), idempotency_key or None,
    ))


def create_entity(conn: sqlite3.Connection, policy: EntityPolicy, values: dict[str, Any], *,
                  reason: StateReason, actor: Actor, now: float | None = None,
                  idempotency_key: str | None = None) -> str:
    """Insert a projection row in an initial state plus its creation fact (in-transaction).

    The fact carries every column of the row as stored, database defaults included,
    so folding the log recreates the row exactly.
    """
    status = values.get("status")
    if status not in policy.initial:
        raise ValueError(
            f"{policy.name} must be created in an initial state "
            f"({', '.join(sorted(policy.initial))}), not {status!r}"
        )
    check_reason(policy, reason)
    unknown = sorted(set(values) - set(policy.columns))
    if unknown:
        raise ValueError(f"{policy.table} has no column(s) {', '.join(unknown)}")
    ts = time.time() if now is None else now
    row = {k: to_sql(v) for k, v in values.items()}
    row.setdefault("id", str(uuid.uuid4()))
    row.setdefault("created_at", ts)
    row["version"] = 1
    row["status_reason_code"] = reason.code
    row["status_reason_summary"] = reason.summary
    row["status_evidence_refs"] = dumps(reason.evidence_refs)
    conn.execute(
        f"INSERT INTO {policy.table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
        list(row.values()),
    )
    stored = conn.execute(f"SELECT * FROM {policy.table} WHERE id = ?", (row["id"],)).fetchone()
    initial = {k: stored[k] for k in stored.keys() if k not in ("status", "version")}  # noqa: SIM118 (Row iterates values)
    _append_fact(conn, str(uuid.uuid4()), policy.name, row["id"], None, status, reason, actor,
                 ts, 1, initial, idempotency_key)
    return str(row["id"])


async def create(db: StateDB, entity_type: str, values: dict[str, Any], *, reason: StateReason,
                 actor: Actor, now: float | None = None) -> str:
    """Create one entity row in an initial state, with its creation fact, in one transaction."""
    policy = db.registry.entity(entity_type)
    check_reason(policy, reason)
    return await db.write(lambda conn: create_entity(conn, policy, values, reason=reason,
                                                     actor=actor, now=now))


def fold(facts: list[dict[str, Any]], policy: EntityPolicy) -> dict[str, Any]:
    """The projection row a sequence of one entity's facts (in version order) implies."""
    row: dict[str, Any] = dict.fromkeys(policy.columns)
    for fact in facts:
        row.update(loads(fact["patch"]))
        row["status"] = fact["status"]
        row["version"] = fact["entity_version"]
    return row


__all__ = ["STANDARD_COLUMNS", "VOCABULARY_ERROR", "apply_transition", "create", "create_entity",
           "fold", "transition"]
