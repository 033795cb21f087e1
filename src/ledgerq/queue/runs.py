"""Shared helpers for schedule_run rows: decoding, and the facts written by the queue."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from ledgerq.codec import loads
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.lifecycle.moves import Moved, MoveTerms, apply_move
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.moves import ENTITY, LEASE, Move

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database, EventStore

__all__ = ["ENTITY", "SYSTEM", "MalformedRow", "claim_reason", "decode_run", "lease_of",
           "move", "no_lease", "perform", "run_policy", "terms",
           "worker_actor"]

SYSTEM = Actor(type="system", id="ledgerq")


def run_policy(db: Database[EventStore]) -> EntityPolicy:
    """The run entity's policy, once its registry is known to allow every move the queue
    makes (:func:`ledgerq.queue.moves.check`): every queue entry point starts here, so a
    spec set missing an edge the queue needs is refused before anything is written."""
    return moves.check(db.registry).entity(ENTITY)


def no_lease(policy: EntityPolicy) -> dict[str, Any]:
    """What a run that goes back to waiting holds of a lease: nothing (the spec's group)."""
    return dict.fromkeys(policy.column_group(LEASE))


def lease_of(policy: EntityPolicy, row: dict[str, Any]) -> dict[str, Any]:
    """The lease a row holds, as the guard of a move that must still find it."""
    return {c: row.get(c) for c in policy.column_group(LEASE)}


@functools.lru_cache(maxsize=64)
def worker_actor(worker_id: str) -> Actor:
    """The actor of a worker's moves: Actor is frozen, so one per worker id, not a
    pydantic validation per move."""
    return Actor(type="system", id=worker_id)


class MalformedRow(ValueError):
    """A row whose stored JSON cannot be decoded (e.g. written by hand)."""


#: What a JSON column holds as stored (a tuple: ``str | bytes`` is rebuilt per call).
_TEXT = (str, bytes)


def decode_run(policy: EntityPolicy, row: dict[str, Any]) -> dict[str, Any]:
    """A run row with its spec-declared JSON columns decoded; MalformedRow names the column."""
    out = dict(row)
    for col in policy.json_columns:
        text = out.get(col)
        if isinstance(text, _TEXT):
            try:
                out[col] = loads(text)
            except Exception as exc:
                raise MalformedRow(f"run {row.get('id')!r}: column {col} holds invalid JSON: "
                                   f"{exc}") from None
    return out


#: Longest summary whose StateReason is shared (claims, renewals: a worker id or less).
_CACHED_SUMMARY = 200


def _reason(code: str, summary: str, metadata: dict[str, Any] | None = None) -> StateReason:
    """A reason built without pydantic validation: the queue's own codes and strings."""
    return StateReason.model_construct(code=code, summary=summary, evidence_refs=[],
                                       metadata=metadata or {})


#: StateReason is frozen, so one per short (code, summary) is shared by every move.
_shared_reason = functools.lru_cache(maxsize=1024)(_reason)


def claim_reason(worker_id: str) -> StateReason:
    """The reason of a worker's claim (the one :func:`move` gives it, shared)."""
    return _shared_reason(moves.CLAIM.code, f"claimed by {worker_id}")


def move(tx: EventStore, policy: EntityPolicy, run_id: str, from_state: str | None,
         to_state: str, code: str, *, actor: Actor = SYSTEM, summary: str = "",
         guard: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
         metadata: dict[str, Any] | None = None, now: float | None = None,
         whole_row: bool = False, skip_locked: bool = False) -> Moved:
    """One guarded move of a run inside the caller's transaction (the queue's only write path).

    No idempotency key: the guards make the queue's own moves safe to repeat. The reason
    is built without pydantic validation (its fields are the queue's own constants and
    strings); :func:`apply_move` still checks its code against the spec.
    """
    reason = _reason_for(code, summary, metadata)
    # A move into the claim's source state (a requeue, a due retry, a released dependent)
    # wakes listening workers by itself (PostgreSQL's trigger on the runs table).
    return apply_move(tx, policy, run_id, from_state, to_state, reason, actor, guard=guard,
                      patch=patch, now=now, whole_row=whole_row, skip_locked=skip_locked)


def _reason_for(code: str, summary: str, metadata: dict[str, Any] | None = None
                ) -> StateReason:
    # A failure's summary carries its error text: not worth keeping around.
    if not metadata and len(summary) <= _CACHED_SUMMARY:
        return _shared_reason(code, summary)
    return _reason(code, summary, metadata)


def perform(tx: EventStore, policy: EntityPolicy, run_id: str, which: Move, *,
            from_state: str | None = None, **options: Any) -> Moved:
    """One of the queue's own moves (:mod:`ledgerq.queue.moves`), through :func:`move`.

    ``from_state`` is the observed state for a move from :data:`~ledgerq.queue.moves.ANY`
    state (a cancel); other moves start where the table says.
    """
    source = from_state if which.source == moves.ANY else which.source
    return move(tx, policy, run_id, source, which.target, which.code, **options)


def terms(run_id: str, which: Move, *, actor: Actor, summary: str, guard: dict[str, Any],
          patch: dict[str, Any], now: float) -> MoveTerms:
    """One of the queue's own moves from its own source state, as :func:`perform` makes
    it, for :func:`~ledgerq.lifecycle.moves.apply_moves` (several moves at once)."""
    if which.source is None or which.source == moves.ANY:
        raise ValueError(f"{which.code}: not a move from a state of its own")
    return MoveTerms(run_id, which.source, which.target, _reason_for(which.code, summary),
                     actor, guard, patch, now)
