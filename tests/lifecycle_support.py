"""Small builders shared by the lifecycle-core tests (not a conftest: plain imports)."""

from __future__ import annotations

import functools
import uuid
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.lifecycle import (
    Actor,
    Registry,
    StateReason,
    TransitionRequest,
    TransitionResult,
    create,
    load_registry,
    transition,
)

SYSTEM = Actor(type="system", id="test-system")
OPERATOR = Actor(type="operator", id="alice")

#: The reason code each entity is created with, per initial state.
CREATE_CODES = {
    ("schedule_run", "queued"): "run.queued.submitted",
    ("schedule_run", "waiting_dependency"): "run.waiting_dependency.submitted",
    ("schedule_run", "running"): "run.started.scheduled",
    ("schedule_run", "failed"): "run.failed.scheduled",
    ("schedule_run", "skipped"): "run.skipped.scheduled",
    ("dispatch", "pending"): "dispatch.pending.created",
}


def run_values(status: str = "queued", **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "status": status,
        "trigger_context": {"source": "test"},
        "action_kind": "shell",
        "action_args": ["echo", "hi"],
        "fired_at": 1000.0,
    }
    values.update(extra)
    return values


def dispatch_values(**extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "status": "pending",
        "channel": "email",
        "payload": {"to": "a@example.org", "body": "hello"},
    }
    values.update(extra)
    return values


async def new_run(db: StateDB, status: str = "queued", **extra: Any) -> str:
    return await create(db, "schedule_run", run_values(status, **extra),
                        reason=StateReason(code=CREATE_CODES[("schedule_run", status)]),
                        actor=SYSTEM)


#: The docs' example outbox entity: not packaged (a user opts into it), used by many
#: engine tests as a second entity beside the queue's.
DISPATCH_SPEC = Path(__file__).resolve().parents[1] / "docs" / "examples" / "dispatch.toml"


@functools.lru_cache(maxsize=1)
def with_dispatch() -> Registry:
    """The packaged specs plus the example ``dispatch`` entity."""
    return load_registry(DISPATCH_SPEC)


async def new_dispatch(db: StateDB, **extra: Any) -> str:
    return await create(db, "dispatch", dispatch_values(**extra),
                        reason=StateReason(code="dispatch.pending.created"), actor=SYSTEM)


def request(entity_type: str, entity_id: str, from_state: str | None, to_state: str,
            code: str, *, actor: Actor = SYSTEM, key: str | None = None,
            summary: str = "", metadata: dict[str, Any] | None = None,
            evidence: list[dict[str, Any]] | None = None) -> TransitionRequest:
    return TransitionRequest(
        entity_type=entity_type,
        entity_id=entity_id,
        from_state=from_state,
        to_state=to_state,
        reason=StateReason(code=code, summary=summary, metadata=metadata or {},
                           evidence_refs=evidence or []),
        actor=actor,
        idempotency_key=key if key is not None else str(uuid.uuid4()),
    )


async def move(db: StateDB, entity_type: str, entity_id: str, from_state: str | None,
               to_state: str, code: str, *, guard: dict[str, Any] | None = None,
               patch: dict[str, Any] | None = None, now: float | None = None,
               **kw: Any) -> TransitionResult:
    """A transition; a claim (into running from elsewhere) carries a lease, as the spec
    requires, unless the test names lease columns itself."""
    if entity_type == "schedule_run" and to_state == "running" and from_state != "running":
        patch = {**CLAIM_LEASE, **(patch or {})}
    return await transition(db, request(entity_type, entity_id, from_state, to_state, code, **kw),
                            guard=guard, patch=patch, now=now)


#: The lease a test claim takes (the engine mints its fencing token).
CLAIM_LEASE: dict[str, Any] = {"leased_by": "test-worker", "lease_expires_at": 4.0e9}


async def row(db: StateDB, table: str, entity_id: str) -> dict[str, Any] | None:
    return await db.fetch_one(f"SELECT * FROM {table} WHERE id = ?", (entity_id,))


async def fact_count(db: StateDB, entity_id: str | None = None) -> int:
    if entity_id is None:
        got = await db.fetch_one("SELECT count(*) AS n FROM status_transitions")
    else:
        got = await db.fetch_one(
            "SELECT count(*) AS n FROM status_transitions WHERE entity_id = ?", (entity_id,))
    assert got is not None
    return int(got["n"])


async def snapshot(db: StateDB) -> dict[str, list[dict[str, Any]]]:
    """Every row of every projection table plus the log, for 'nothing changed' checks."""
    out: dict[str, list[dict[str, Any]]] = {}
    for table in ("schedule_runs", "dispatch_outbox", "status_transitions"):
        out[table] = await db.fetch_all(f"SELECT * FROM {table} ORDER BY id")
    return out
