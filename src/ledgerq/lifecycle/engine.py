"""The transition engine's asynchronous face: one guarded move, or one creation, in a
transaction of its own.

Validation that needs no database (entity, reason code, column allowlists) happens in
the caller's task before anything is queued; the rest runs as one unit inside
:meth:`Database.write` (:mod:`~ledgerq.lifecycle.moves`,
:mod:`~ledgerq.lifecycle.creation`). The names other packages have always imported from
here stay importable from here.
"""

from __future__ import annotations

from typing import Any

from ledgerq.lifecycle.claims import apply_claims
from ledgerq.lifecycle.creation import create_entities, create_entity
from ledgerq.lifecycle.ids import new_id, new_token
from ledgerq.lifecycle.models import Actor, StateReason, TransitionRequest, TransitionResult
from ledgerq.lifecycle.moves import Moved, MoveTerms, apply_move, apply_moves, apply_transition
from ledgerq.lifecycle.plans import VOCABULARY_ERROR
from ledgerq.lifecycle.registry import STANDARD_COLUMNS, EntityPolicy
from ledgerq.lifecycle.store import Database, EventStore
from ledgerq.lifecycle.values import (
    MAX_JSON_DEPTH,
    check_allowed,
    check_columns,
    check_reason,
    check_values,
    value_problem,
)


def prepare(db: Database[EventStore], request: TransitionRequest, guard: dict[str, Any] | None,
            patch: dict[str, Any] | None) -> EntityPolicy:
    """Every check that needs no read; raises ValueError before anything is queued."""
    policy = db.registry.entity(request.entity_type)
    check_reason(policy, request.reason)
    check_columns(policy, guard, patch)
    return policy


async def transition(db: Database[EventStore], request: TransitionRequest, *,
                     guard: dict[str, Any] | None = None,
                     patch: dict[str, Any] | None = None,
                     now: float | None = None) -> TransitionResult:
    """Apply one guarded move, or report a conflict; docs/specs.md ("What the engine does
    with a spec") gives the exact order of its checks."""
    # Copies: the unit runs after this call yields, and what it writes is what was checked.
    guard = dict(guard) if guard else None
    patch = dict(patch) if patch else None
    policy = prepare(db, request, guard, patch)
    return await db.write(lambda tx: apply_transition(tx, policy, request, guard, patch, now))


async def create(db: Database[EventStore], entity_type: str, values: dict[str, Any], *,
                 reason: StateReason,
                 actor: Actor, now: float | None = None) -> str:
    """Create one entity row in an initial state, with its creation fact, in one transaction."""
    policy = db.registry.entity(entity_type)
    check_reason(policy, reason)
    return await db.write(lambda tx: create_entity(tx, policy, values, reason=reason,
                                                     actor=actor, now=now))


__all__ = ["MAX_JSON_DEPTH", "STANDARD_COLUMNS", "VOCABULARY_ERROR", "MoveTerms", "Moved",
           "apply_claims", "apply_move", "apply_moves", "apply_transition", "check_allowed",
           "check_columns", "check_reason", "check_values", "create", "create_entities",
           "create_entity", "new_id", "new_token", "prepare", "transition", "value_problem"]
