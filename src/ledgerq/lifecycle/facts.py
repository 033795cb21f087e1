"""A fact: one row of the ``status_transitions`` log, as the engine makes it and the store
writes it.

A named tuple, so that code reads a fact's fields by name while the drivers still get a
tuple in the log's column order (:data:`~ledgerq.lifecycle.store.FACT_COLUMNS`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ledgerq.codec import dumps
from ledgerq.lifecycle.models import Actor, StateReason


class Fact(NamedTuple):
    """Its fields are the log's columns, in their order (a test holds them equal)."""

    id: str
    entity_type: str
    entity_id: str
    previous_status: str | None
    status: str
    reason_code: str
    reason_summary: str | None
    #: JSON text, as are ``metadata`` and ``patch``.
    evidence_refs: str
    #: The actor's type.
    source: str
    #: The actor's id.
    actor: str | None
    created_at: float
    metadata: str
    entity_version: int
    #: The columns the change set, with the values the row stores.
    patch: str
    idempotency_key: str | None


#: ``tuple_new(Fact, fields)`` makes a Fact of its fields in order, in C: a named tuple's
#: own ``__new__`` is a Python function, a call that doubles what a fact costs to make,
#: and every move makes one. (A name of its own spares each call the attribute lookup.)
tuple_new = tuple.__new__


def make_fact(fact_id: str, entity_type: str, entity_id: str, previous: str | None,
              status: str, reason: StateReason, actor: Actor, ts: float, version: int,
              changes: dict[str, Any], idempotency_key: str | None) -> Fact:
    return tuple_new(Fact, (
        fact_id, entity_type, entity_id, previous, status, reason.code, reason.summary,
        reason_json(reason.evidence_refs), actor.type, actor.id, ts,
        reason_json(reason.metadata), version, dumps(changes), idempotency_key or None))


def reason_json(value: Any) -> str:
    # Most reasons carry no evidence and no metadata: skip the encoder for the empty ones.
    return dumps(value) if value else ("[]" if isinstance(value, list) else "{}")
