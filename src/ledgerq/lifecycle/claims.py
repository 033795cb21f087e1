"""Claimants' moves, many rows at once: one swap statement and one fact insert for a
claim pass, each row still its own guarded move with its own fact."""

from __future__ import annotations

import time
from typing import Any

from ledgerq.lifecycle.facts import make_fact
from ledgerq.lifecycle.ids import new_id, new_token
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.lifecycle.plans import move_plan, stamp
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import ClaimFacts, EventStore
from ledgerq.lifecycle.values import DEFAULT_AS_JSON, check_values


def apply_claims(tx: EventStore, policy: EntityPolicy, rows: list[tuple[str, dict[str, Any],
                                                                  dict[str, Any]]],
                 from_state: str, to_state: str, reason: StateReason, actor: Actor, *,
                 limit: int, now: float | None = None) -> list[dict[str, Any]]:
    """Claimants' moves of several rows in one swap statement and one fact insert, in
    ``rows``' order (``(id, guard, patch)`` each) until ``limit`` applied; the rows as
    stored after their moves (whole rows), in that order.

    Each row is still its own guarded move (status, its guard values, its version
    incremented) with its own fact; a row another writer holds, took or moved on is not
    moved (lost, as :func:`~ledgerq.lifecycle.moves.apply_move` with ``skip_locked``
    reports it). Every row gives the same guard and patch columns, none of them JSON
    (checked). The checks run once, as they would for each row: the reason, the
    columns, the edge from ``from_state``.
    """
    if not rows:
        return []
    guard, patch = rows[0][1], rows[0][2]
    # The whole-row claimant's plan (its making checks the reason code and allowlists).
    plan = move_plan(tx, policy, from_state, to_state, reason, actor, guard, patch, True,
                     True)
    for _, g, p in rows:
        if g.keys() != guard.keys() or p.keys() != patch.keys():
            raise ValueError("apply_claims: every row must give the same guard and patch "
                             "columns")
        if g:
            check_values(policy, "guard", g)
        if p:
            check_values(policy, "patch", p)
    if set(policy.json_columns) & (guard.keys() | patch.keys()):
        raise ValueError("apply_claims: JSON columns cannot be batched")
    if plan.refusal is not None:
        raise plan.refused_as(plan.refusal)
    ts = time.time() if now is None else now
    changes = stamp(reason, ts)
    # No value is a container (no JSON column, and check_values refuses one elsewhere):
    # each goes to the database as it is.
    fresh = plan.fresh
    given = [(rid, g, {**{c: new_token() for c in fresh}, **p} if fresh else p)
             for rid, g, p in rows]
    patched = (*given[0][2], "status_evidence_refs")
    split = _claim_patch_split(tx, policy, changes, patched, given) if tx.stores_as_sent \
        else None
    # Each fact records the values its row stores. Where the dialect stores what it is
    # sent and the database gives back every per-row column as its exact JSON (``exact``),
    # the facts may be written in the claims' own statement (one round trip, not two);
    # else from the rows as stored, after the claims.
    common, stored = split if split is not None else (dict(changes), patched)
    return tx.claim_entities_with_facts(
        policy, given, observed=from_state, to_state=to_state, changes=changes, limit=limit,
        facts=ClaimFacts([new_id() for _ in range(min(limit, len(given)))],
                         make_fact("", policy.name, "", from_state, to_state, reason, actor,
                                   ts, 0, {}, None), common, stored, exact=split is not None))


def _claim_patch_split(tx: EventStore, policy: EntityPolicy, changes: dict[str, Any],
                       patched: tuple[str, ...],
                       rows: list[tuple[str, dict[str, Any], dict[str, Any]]]
                       ) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """A claim fact's patch as :class:`~ledgerq.lifecycle.store.ClaimFacts` takes it: what
    every row's holds alike (the stamp, and each float column's value, the same for
    every row and stored as sent), and the columns each fact reads from its row as stored
    (those the database gives back as their exact JSON: text, integer, boolean, JSON's
    text); None where a float column's value differs from row to row, or is not stored
    as sent, so the facts are written from the rows as before."""
    common = dict(changes)
    stored: list[str] = []
    for col in patched:
        column = policy.columns.get(col)
        if column is None:
            return None
        if column.type in DEFAULT_AS_JSON:
            stored.append(col)
            common.pop(col, None)
            continue
        values = {p[col] if col in p else changes.get(col) for _, _, p in rows}
        if len(values) != 1:
            return None
        (value,) = values
        if value is not None and type(value) is not tx.exact_types.get(column.type):
            return None
        common[col] = value
    return common, tuple(stored)
