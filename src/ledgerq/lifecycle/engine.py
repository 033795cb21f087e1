"""The guarded compare-and-swap: one status change = one UPDATE + one fact, one transaction.

Validation that needs no database (entity, reason code, column allowlists) happens in
the caller's task before anything is queued; the rest runs as one unit inside
:meth:`Database.write`, so the read, the checks, the UPDATE and the fact see one
snapshot under the write lock and commit (or vanish) together.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from ledgerq.codec import CONTAINERS, dumps
from ledgerq.errors import InvalidInput
from ledgerq.lifecycle.facts import Fact, make_fact, reason_json
from ledgerq.lifecycle.ids import new_id, new_token
from ledgerq.lifecycle.models import Actor, StateReason, TransitionRequest, TransitionResult
from ledgerq.lifecycle.policy_cache import CACHES, PLAN_LIMIT, cache_of
from ledgerq.lifecycle.registry import STANDARD_COLUMNS, EntityPolicy
from ledgerq.lifecycle.values import (
    DEFAULT_AS_JSON,
    INT64_MAX,
    INT64_MIN,
    MAX_JSON_DEPTH,
    check_allowed,
    check_columns,
    check_reason,
    check_values,
    value_problem,
)
from ledgerq.operations import ClaimFacts, Database, SentMove, Tx

VOCABULARY_ERROR = "not in the declared transition vocabulary"
_isfinite = math.isfinite


def prepare(db: Database, request: TransitionRequest, guard: dict[str, Any] | None,
            patch: dict[str, Any] | None) -> EntityPolicy:
    """Every check that needs no read; raises ValueError before anything is queued."""
    policy = db.registry.entity(request.entity_type)
    check_reason(policy, request.reason)
    check_columns(policy, guard, patch)
    return policy


async def transition(db: Database, request: TransitionRequest, *,
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


def apply_transition(tx: Tx, policy: EntityPolicy, request: TransitionRequest,
                     guard: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
                     now: float | None = None) -> TransitionResult:
    """The in-transaction half of :func:`transition`; callers must have run :func:`prepare`."""
    done = apply_move(tx, policy, request.entity_id, request.from_state, request.to_state,
                      request.reason, request.actor, guard=guard, patch=patch, now=now,
                      idempotency_key=request.idempotency_key, prepared=True)
    # (model_construct, which skips validation, measured slower: it is pure Python.)
    return TransitionResult(applied=done.applied, conflict=not done.applied,
                            previous_state=done.previous_state, current_state=done.current_state,
                            transition_id=done.transition_id)


class Moved(NamedTuple):
    """What :func:`apply_move` did. A plain tuple: the queue makes several per task, and a
    validated model per move costs more than the statements' own Python."""

    applied: bool
    previous_state: str | None
    current_state: str
    #: The new fact's id when applied; a fresh id that names no fact on a conflict.
    transition_id: str
    #: The whole row after the move, when asked for with ``whole_row=True``.
    row: dict[str, Any] | None = None


def apply_move(tx: Tx, policy: EntityPolicy, entity_id: str,
               from_state: str | None, to_state: str, reason: StateReason, actor: Actor, *,
               guard: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
               now: float | None = None, idempotency_key: str = "",
               whole_row: bool = False, skip_locked: bool = False,
               prepared: bool = False) -> Moved:
    """One guarded move inside the caller's transaction, in :func:`transition`'s check order.

    ``reason`` and ``actor`` are trusted as built (the queue makes them with
    ``model_construct``); the reason code and the column allowlists are still checked
    against the policy, so nothing the spec does not declare is ever written.
    ``whole_row`` returns the row as the UPDATE left it (``RETURNING *``), which saves a
    claim its read-back. ``skip_locked`` makes a row another writer holds a conflict at
    once instead of a wait (a claimant's move; see ``Tx.entity_for_move``); such a
    conflict reports ``from_state``, since the row was not read. ``prepared``: the caller
    ran :func:`prepare` on these very values (``transition()``), so they are not checked
    twice.
    """
    guard = guard or {}
    patch = patch or {}
    # A move naming the state it expects has a plan, whose making checked the reason code
    # and the allowlists (the first checks, once per shape); its values are its own.
    plan = None if from_state is None else _plan(
        tx, policy, from_state, to_state, reason, actor, guard, patch, whole_row, skip_locked)
    if not prepared:
        if plan is None:
            check_reason(policy, reason)
            check_allowed(policy, guard, patch)
        if guard:
            check_values(policy, "guard", guard)
        if patch:
            check_values(policy, "patch", patch)
    if idempotency_key:
        # Two moves under one key at once (other connections): the second waits for the
        # first to commit, then replays it, as it would have one after the other.
        tx.lock_key(f"transition:{policy.name}:{entity_id}:{idempotency_key}")
        repeat = _replay(tx, policy.name, entity_id, to_state, idempotency_key)
        if repeat is not None:
            return repeat
    if plan is not None and plan.refusal is None and from_state is not None:
        # The caller named the state it expects and the move is legal from there: the swap
        # itself is the read (status and guards in its WHERE). Only when it matches nothing
        # is the row read, to tell not-found from a conflict in the checks' order.
        done = _swap(tx, policy, plan, entity_id, from_state, to_state, reason, actor, guard,
                     patch, now, idempotency_key, whole_row, skip_locked, None)
        if done is not None:
            return done
        if skip_locked:
            # A claimant's row another claimant holds, took or moved on: lost, as the read
            # would have found it (no read: under contention most claims lose one).
            return _conflict(from_state)
    guard_cols = tuple(sorted(guard))
    row = tx.entity_for_move(policy, entity_id, guard_cols, skip_locked=skip_locked)
    if row is None:
        if skip_locked:  # held by another writer (or gone): not this caller's to move
            return _conflict(from_state or "")
        raise LookupError(f"{policy.name} {entity_id!r} not found")
    observed: str = row[0]
    if from_state is not None and observed != from_state:
        return _conflict(observed)
    if plan is None:
        plan = _plan(tx, policy, observed, to_state, reason, actor, guard, patch, whole_row,
                     skip_locked)
    if plan.refusal is not None:
        raise ValueError(plan.refusal)
    for i, col in enumerate(guard_cols):
        if row[2 + i] != guard[col]:
            return _conflict(observed)
    done = _swap(tx, policy, plan, entity_id, observed, to_state, reason, actor, guard,
                 patch, now, idempotency_key, whole_row, False, row[1])
    if done is None:
        # Another writer moved the row between the read and the swap (possible where
        # writers run at once: PostgreSQL's READ COMMITTED): the conflict reports the
        # status it left, as a conflict seen at the read would have.
        now_row = tx.entity_for_move(policy, entity_id, ())
        return _conflict(observed if now_row is None else now_row[0])
    return done


def apply_claims(tx: Tx, policy: EntityPolicy, rows: list[tuple[str, dict[str, Any],
                                                                  dict[str, Any]]],
                 from_state: str, to_state: str, reason: StateReason, actor: Actor, *,
                 limit: int, now: float | None = None) -> list[dict[str, Any]]:
    """Claimants' moves of several rows in one swap statement and one fact insert, in
    ``rows``' order (``(id, guard, patch)`` each) until ``limit`` applied; the rows as
    stored after their moves (whole rows), in that order.

    Each row is still its own guarded move (status, its guard values, its version
    incremented) with its own fact; a row another writer holds, took or moved on is not
    moved (lost, as :func:`apply_move` with ``skip_locked`` reports it). Every row gives
    the same guard and patch columns, none of them JSON (checked). The checks run once,
    as they would for each row: the reason, the columns, the edge from ``from_state``.
    """
    if not rows:
        return []
    guard, patch = rows[0][1], rows[0][2]
    # The whole-row claimant's plan (its making checks the reason code and allowlists).
    plan = _plan(tx, policy, from_state, to_state, reason, actor, guard, patch, True, True)
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
        raise ValueError(plan.refusal)
    ts = time.time() if now is None else now
    changes = _stamp(reason, ts)
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


def _claim_patch_split(tx: Tx, policy: EntityPolicy, changes: dict[str, Any],
                       patched: tuple[str, ...],
                       rows: list[tuple[str, dict[str, Any], dict[str, Any]]]
                       ) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """A claim fact's patch as :class:`~ledgerq.operations.ClaimFacts` takes it: what
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


def _refusal(policy: EntityPolicy, observed: str, to_state: str, actor: Actor,
             guard: dict[str, Any], patch: dict[str, Any]) -> str | None:
    """Why the spec forbids this move from ``observed`` (the checks after the read), or
    None: the edge, its actor types, the guard and patch columns it requires."""
    if not policy.allows(observed, to_state):
        allowed = ", ".join(policy.targets(observed)) or "none (terminal)"
        return (f"{policy.name} {observed} -> {to_state} is {VOCABULARY_ERROR}; "
                f"allowed from {observed}: {allowed}")
    rule = policy.rule(observed, to_state)
    if rule.actors is not None and actor.type not in rule.actors:
        return (f"{policy.name} {observed} -> {to_state} is restricted to actor type(s) "
                f"{', '.join(sorted(rule.actors))}; got {actor.type!r}")
    for kind, need, given in (("guard", rule.requires_guard, guard),
                              ("patch", rule.requires_patch, patch)):
        if need and not need.issubset(given):
            return (f"{policy.name} {observed} -> {to_state} requires {kind} column(s) "
                    f"{', '.join(sorted(need - set(given)))}")
    return None


class _Plan(NamedTuple):
    """What every move of one shape shares (its policy, states, reason code, actor type,
    guard and patch columns, whether its reason has evidence, what it returns): worked
    out once, so a move does only the work its values need."""

    #: Why the spec forbids the move (the checks after the read); None: it may run, and
    #: the fields below are set.
    refusal: str | None
    #: Columns the edge wants a fresh token in that the patch does not give.
    fresh: tuple[str, ...] = ()
    guard_cols: tuple[str, ...] = ()
    #: The patched columns whose stored value the fact records.
    patched: tuple[str, ...] = ()
    #: The swap without a read (the WHERE holds status and guards), and with one.
    unread: Any = None
    read: Any = None




def _plan(tx: Tx, policy: EntityPolicy, observed: str, to_state: str, reason: StateReason,
          actor: Actor, guard: dict[str, Any], patch: dict[str, Any], whole_row: bool,
          skip_locked: bool) -> _Plan:
    """The plan of a move of this shape from ``observed``, kept in the policy's cache by
    the shape and the dialect, whose statements it holds."""
    plans = (CACHES.get(id(policy)) or cache_of(policy)).plans
    key = (type(tx), observed, to_state, reason.code, actor.type, tuple(guard), tuple(patch),
           not reason.evidence_refs, whole_row, skip_locked)
    plan = plans.get(key)
    if plan is None:
        if len(plans) >= PLAN_LIMIT:
            plans.clear()
        plan = plans[key] = _make_plan(tx, policy, observed, to_state, reason, actor, guard,
                                       patch, whole_row, skip_locked)
    return plan


def _make_plan(tx: Tx, policy: EntityPolicy, observed: str, to_state: str,
               reason: StateReason, actor: Actor, guard: dict[str, Any],
               patch: dict[str, Any], whole_row: bool, skip_locked: bool) -> _Plan:
    check_reason(policy, reason)  # (raised, never kept: a plan is made only past these)
    check_allowed(policy, guard, patch)
    refusal = _refusal(policy, observed, to_state, actor, guard, patch)
    if refusal is not None:
        return _Plan(refusal)
    rule = policy.rule(observed, to_state)
    fresh = tuple(sorted(rule.fresh_tokens - patch.keys()))
    # Read back what the database stored of every column whose stored form may differ
    # from what was sent (type affinity; PostgreSQL normalizes jsonb), so the fact records
    # exactly what the row holds. Empty evidence is "[]" everywhere: not worth a column.
    patched = (*fresh, *patch, *(("status_evidence_refs",) if reason.evidence_refs else ()))
    guard_cols = tuple(sorted(guard))
    # The order in which _swap fills a move's changes (a patch may name a stamped column).
    change_cols = tuple(dict.fromkeys((*_STAMPED, *fresh, *patch)))
    same = observed == to_state

    def statement(read: bool, returning: tuple[str, ...]) -> Any:
        return tx.swap_statement(policy, same_state=same, change_cols=change_cols,
                                 guard_cols=guard_cols, read=read,
                                 skip_locked=skip_locked and not read,
                                 returning=None if whole_row else returning)

    return _Plan(None, fresh, guard_cols, patched, statement(False, ("version", *patched)),
                 statement(True, patched))


def _swap(tx: Tx, policy: EntityPolicy, plan: _Plan, entity_id: str, observed: str,
          to_state: str, reason: StateReason, actor: Actor, guard: dict[str, Any],
          patch: dict[str, Any], now: float | None, idempotency_key: str, whole_row: bool,
          skip_locked: bool, version: int | None) -> Moved | None:
    """The compare-and-swap and its fact; None when it matched no row.

    ``version`` is the one read before (the swap requires it), or None when nothing was
    read: the swap then bumps whatever version the row has and returns it.
    """
    ts = time.time() if now is None else now
    changes, guards = _terms(plan, reason, ts, guard, patch)
    moved_to = None if observed == to_state else to_state
    if tx.stores_as_sent and not whole_row and _stored_as_sent(tx, policy, plan.patched,
                                                               changes):
        # What the row will store is what is sent: the fact can be written from it, in
        # the swap's own statement (inserted only if the swap matched).
        sent = _sent(policy, plan, entity_id, observed, to_state, reason, actor, ts, changes,
                     guards, idempotency_key, version, skip_locked)
        if tx.update_entities_with_facts(policy, [sent]) == [None]:
            return None
        return Moved(True, observed, to_state, sent.fact.id, None)
    after = tx.swap(plan.unread if version is None else plan.read, entity_id, observed,
                    version, moved_to, changes.values(), guards)
    if after is None:
        return None
    # The stored values (after the column's type affinity or the database's own
    # normalization of JSON), so the fact records exactly what the row holds and
    # folding the log reproduces the row.
    for k in plan.patched:
        changes[k] = after[k]
    if whole_row:
        changes["status_evidence_refs"] = after["status_evidence_refs"]
    new_version: int = version + 1 if version is not None else after["version"]
    fact_id = new_id()
    tx.append_facts((make_fact(fact_id, policy.name, entity_id, observed, to_state, reason,
                               actor, ts, new_version, changes, idempotency_key),))
    return Moved(True, observed, to_state, fact_id, after if whole_row else None)


def _terms(plan: _Plan, reason: StateReason, ts: float, guard: dict[str, Any],
           patch: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """A swap's changes (the stamp, fresh tokens, the patch) and guard values, as sent."""
    changes = _stamp(reason, ts)
    for c in plan.fresh:
        changes[c] = new_token()
    # (to_sql inline: a move's every value passes here, and few are containers)
    for k, v in patch.items():
        changes[k] = dumps(v) if isinstance(v, CONTAINERS) else v
    return changes, [dumps(v) if isinstance(v := guard[c], CONTAINERS) else v
                     for c in plan.guard_cols]


def _sent(policy: EntityPolicy, plan: _Plan, entity_id: str, observed: str, to_state: str,
          reason: StateReason, actor: Actor, ts: float, changes: dict[str, Any],
          guards: list[Any], idempotency_key: str, version: int | None,
          skip_locked: bool) -> SentMove:
    """A swap whose fact is written from the values it sends, in its own statement."""
    return SentMove(entity_id, observed, version, None if observed == to_state else to_state,
                    changes, dict(zip(plan.guard_cols, guards, strict=True)), skip_locked,
                    make_fact(new_id(), policy.name, entity_id, observed, to_state, reason,
                              actor, ts, 0, changes, idempotency_key))


class MoveTerms(NamedTuple):
    """One move for :func:`apply_moves`: :func:`apply_move`'s terms."""

    entity_id: str
    from_state: str
    to_state: str
    reason: StateReason
    actor: Actor
    guard: dict[str, Any]
    patch: dict[str, Any]
    now: float | None = None


def apply_moves(tx: Tx, policy: EntityPolicy, moves: Sequence[MoveTerms]) -> list[Moved]:
    """:func:`apply_move` for each of ``moves``, in order, inside the caller's transaction.

    Where the values sent are what the rows store (PostgreSQL), every move is checked
    first, as :func:`apply_move` checks it, and then their swaps, each still its own
    guarded statement with its own fact, go to the database together: one round trip
    instead of one per move (a pass's outcomes are ten or more). A swap that matched
    nothing is taken again by :func:`apply_move` alone, which tells a conflict from a
    row not found in the checks' order. Anything else (a move the spec refuses from the state it
    names, a value that would be stored converted) goes move by move. Where the rows'
    stored values must be read back (SQLite), each swap is its own statement and the
    facts of the swaps that matched are appended together (:func:`_swaps_then_facts`).
    """
    if len(moves) < 2:
        return [_apply(tx, policy, m) for m in moves]
    if not tx.stores_as_sent:
        return _swaps_then_facts(tx, policy, moves)
    sent: list[SentMove] = []
    for m in moves:
        plan = _checked_plan(tx, policy, m)
        ts = time.time() if m.now is None else m.now
        changes, guards = _terms(plan, m.reason, ts, m.guard, m.patch)
        if plan.refusal is not None or not _stored_as_sent(tx, policy, plan.patched, changes):
            return [_apply(tx, policy, each) for each in moves]
        sent.append(_sent(policy, plan, m.entity_id, m.from_state, m.to_state, m.reason,
                          m.actor, ts, changes, guards, "", None, False))
    done = tx.update_entities_with_facts(policy, sent)
    return [_apply(tx, policy, m) if version is None
            else Moved(True, m.from_state, m.to_state, s.fact.id, None)
            for m, s, version in zip(moves, sent, done, strict=True)]


def _checked_plan(tx: Tx, policy: EntityPolicy, m: MoveTerms) -> _Plan:
    """The plan of a move that names the state it expects, its values checked: what
    :func:`apply_move` checks before its swap, in the same order."""
    plan = _plan(tx, policy, m.from_state, m.to_state, m.reason, m.actor, m.guard, m.patch,
                 False, False)
    if m.guard:
        check_values(policy, "guard", m.guard)
    if m.patch:
        check_values(policy, "patch", m.patch)
    return plan


def _swaps_then_facts(tx: Tx, policy: EntityPolicy, moves: Sequence[MoveTerms]
                      ) -> list[Moved]:
    """:func:`apply_move` for each of ``moves``, in order, each swap its own guarded
    statement reading back what its row stores, and the facts of those that matched
    appended together (one ``executemany``, not one statement a move), as a claim pass's
    are. Nothing is read first: a swap that matches nothing, or a move the spec refuses
    from the state it names, is taken again by :func:`apply_move` alone, which tells a
    conflict from a row not found in the checks' order (the facts so far appended first, so no
    applied swap is ever without its fact, whatever it raises)."""
    out: list[Moved] = []
    facts: list[Fact] = []
    try:
        for m in moves:
            plan = _checked_plan(tx, policy, m)
            after = None
            if plan.refusal is None:
                ts = time.time() if m.now is None else m.now
                changes, guards = _terms(plan, m.reason, ts, m.guard, m.patch)
                after = tx.swap(plan.unread, m.entity_id, m.from_state, None,
                                None if m.from_state == m.to_state else m.to_state,
                                changes.values(), guards)
            if after is None:
                tx.append_facts(facts)
                facts = []
                out.append(_apply(tx, policy, m))
                continue
            for k in plan.patched:  # as stored (see _swap)
                changes[k] = after[k]
            fact_id = new_id()
            facts.append(make_fact(fact_id, policy.name, m.entity_id, m.from_state,
                                   m.to_state, m.reason, m.actor, ts, after["version"],
                                   changes, None))
            out.append(Moved(True, m.from_state, m.to_state, fact_id, None))
    except BaseException:
        if facts:  # the swaps that matched keep their facts, even in a failing transaction
            with contextlib.suppress(Exception):
                tx.append_facts(facts)
        raise
    tx.append_facts(facts)
    return out


def _apply(tx: Tx, policy: EntityPolicy, m: MoveTerms) -> Moved:
    return apply_move(tx, policy, m.entity_id, m.from_state, m.to_state, m.reason, m.actor,
                      guard=m.guard, patch=m.patch, now=m.now)


def _stored_as_sent(tx: Tx, policy: EntityPolicy, patched: tuple[str, ...],
                    changes: dict[str, Any]) -> bool:
    """Whether every patched value reads back from its column as the same value of the
    same type (``Tx.exact_types``; no JSON column, no int sent to a float column): the
    fact's patch is then exactly what a read-back would have given."""
    for col in patched:
        value = changes[col]
        if value is None:
            continue
        column = policy.columns.get(col)
        if column is None or column.type == "json" or \
                type(value) is not tx.exact_types.get(column.type):
            return False
    return True


def _stamp(reason: StateReason, ts: float) -> dict[str, Any]:
    """The columns every move sets besides its patch: when, and why."""
    return {"updated_at": ts, "status_reason_code": reason.code,
            "status_reason_summary": reason.summary,
            "status_evidence_refs": reason_json(reason.evidence_refs)}


#: The columns every move sets besides its patch, in :func:`_stamp`'s order.
_STAMPED = tuple(_stamp(StateReason.model_construct(code="", summary="", evidence_refs=[],
                                                    metadata={}), 0.0))


def _conflict(observed: str) -> Moved:
    # A conflict writes nothing; its transition_id names no fact.
    return Moved(False, observed, observed, new_id())


def _replay(tx: Tx, entity_type: str, entity_id: str, to_state: str,
            key: str) -> Moved | None:
    found = tx.fact_by_idempotency_key(entity_type, entity_id, key)
    if found is None:
        return None
    fact_id, previous, status = found
    if status != to_state:
        raise ValueError(
            f"idempotency key {key!r} already applied {previous} -> {status} to "
            f"{entity_type} {entity_id!r}; refusing a different move to {to_state}"
        )
    return Moved(True, previous, status, fact_id)


def create_entity(tx: Tx, policy: EntityPolicy, values: dict[str, Any], *,
                  reason: StateReason, actor: Actor, now: float | None = None,
                  idempotency_key: str | None = None) -> str:
    """Insert a projection row in an initial state plus its creation fact (in-transaction).

    The fact carries the row as stored (after type affinity, database defaults
    included), so folding the log recreates the row exactly: the values sent where the
    column keeps them as sent (``Tx.exact_types``), the rest read back (or, on
    PostgreSQL, taken by the server in the same statement).
    """
    ts = time.time() if now is None else now
    row, sent = _creation(tx, policy, values, reason, ts)
    if sent is not None:
        if tx.stores_as_sent:
            # The patch is known but for what only the database knows: one statement.
            _create_with_facts(tx, policy, [row], [sent], reason, actor, ts,
                               idempotency_key)
            return str(row["id"])
        # The patch is known but for the columns the row is read back for (defaults the
        # database fills in, JSON text it may convert): the row reads back only those.
        patch, stored = sent
        patch.update(tx.insert_entity(policy, row, returning=stored))
    else:
        patch = _initial_patch(tx.insert_entity(policy, row), policy)
    tx.append_facts((make_fact(new_id(), policy.name, row["id"], None, row["status"], reason,
                               actor, ts, 1, patch, idempotency_key),))
    return str(row["id"])


#: Columns a creation fact's patch leaves out: the fact records them in fields of its own.
_NOT_IN_PATCH = ("status", "version")


class SentPlan(NamedTuple):
    """What every creation of one shape (the columns it sends) on one dialect shares."""

    #: Each sent column the patch takes: (name, the type whose values the dialect stores
    #: exactly, or None; whether it is JSON; whether it has a default).
    sent: tuple[tuple[str, type | None, bool, bool], ...]
    #: The unsent columns the database fills with their defaults.
    defaulted: tuple[str, ...]


#: How a JSON text the dialect stores as sent begins: an object, an array or a string
#: (SQLite's JSON columns would convert text that reads as a number).
_JSON_KEPT = ("{", "[", '"')


def _sent_plan(tx: Tx, policy: EntityPolicy, columns: tuple[str, ...]) -> SentPlan | None:
    """The plan of creations that send ``columns``, kept in the policy's cache by the
    dialect and the columns; None where :func:`_sent_patch` gives None."""
    plans = (CACHES.get(id(policy)) or cache_of(policy)).sent_plans
    key = (type(tx), columns)
    if key in plans:
        return plans[key]
    if len(plans) >= PLAN_LIMIT:
        plans.clear()
    exact = tx.exact_types
    defaults = policy.defaulted
    given = set(columns)
    sent: list[tuple[str, type | None, bool, bool]] = []
    defaulted: list[str] = []
    plan: SentPlan | None = None
    for col, column in policy.columns.items():
        if col in _NOT_IN_PATCH:
            continue
        if col in given:
            sent.append((col, exact.get(column.type), column.type == "json", col in defaults))
        elif col in defaults:
            if tx.stores_as_sent and column.type not in DEFAULT_AS_JSON:
                break  # (None: see _sent_patch)
            defaulted.append(col)
    else:
        plan = SentPlan(tuple(sent), tuple(defaulted))
    plans[key] = plan
    return plan


#: What :func:`_sent_patch` gives when a value needs :func:`check_values`' full look
#: (told by identity: a patch of its shape, never one :func:`_sent_patch` makes).
_UNCHECKED: tuple[dict[str, Any], tuple[str, ...]] = ({}, ())


def _sent_patch(tx: Tx, policy: EntityPolicy, row: dict[str, Any], *, checked: bool = False
                ) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """:func:`_initial_patch` of ``row`` before it is stored, where the values sent are
    what the row will store: the patch of the sent values, and the columns whose stored
    value only the database knows (defaults it fills in; JSON text it normalizes, as
    PostgreSQL's jsonb does, or may convert, as SQLite's affinity does text that reads as
    a number). None where a value would be converted otherwise (an int sent to a float
    column, a bool to SQLite's integer, -0.0 to SQLite's REAL, which keeps 0.0), or
    where PostgreSQL would give a default as JSON other than a read would.

    Unless ``checked`` (the row's values passed :func:`check_values`), it looks at every
    value as check_values' quick path would, in the same loop (a creation's values are
    then looked at once, not twice), and gives :data:`_UNCHECKED` for any value that
    quick look does not vouch for: the caller then runs the full checks, which name
    what is wrong, and asks again.
    """
    plan = _sent_plan(tx, policy, tuple(row))
    if plan is None:
        return None if checked else _UNCHECKED
    patch: dict[str, Any] = {}
    stored = plan.defaulted
    for col, exact, json, defaulted in plan.sent:
        value = row[col]
        if value is None:
            if defaulted:
                patch[col] = None
            continue
        kind = type(value)
        if not checked and not (
                (kind is exact or (json and kind is str)) and (
                    value.isascii() and "\x00" not in value if kind is str
                    else _isfinite(value) if kind is float
                    else INT64_MIN <= value <= INT64_MAX if kind is int
                    else kind is bool)):
            return _UNCHECKED
        if kind is exact and (not json or value[:1] in _JSON_KEPT) and (
                kind is not float or value or math.copysign(1.0, value) > 0):
            patch[col] = value
        elif json:
            stored = (*stored, col)
        else:
            return None
    return patch, stored


def _initial_patch(stored: dict[str, Any], policy: EntityPolicy) -> dict[str, Any]:
    """A creation fact's patch: every non-NULL column of the stored row, and every NULL
    one that has a default.

    A column it does not name is its default (:func:`fold` starts from the columns'
    defaults: a column a migration adds later gives older rows its default); leaving
    the other NULLs out halves a typical creation fact, and the log's pages are written
    by every submit's commit.
    """
    defaults = policy.defaulted
    return {k: v for k, v in stored.items()
            if (v is not None or k in defaults) and k not in _NOT_IN_PATCH}


def _creation(tx: Tx, policy: EntityPolicy, values: dict[str, Any], reason: StateReason,
              ts: float) -> tuple[dict[str, Any], tuple[dict[str, Any], tuple[str, ...]] | None]:
    """The INSERT's column -> value map for a new row, and its creation fact's patch as
    sent (:func:`_sent_patch`); ValueError before anything is written."""
    row = _creation_row(policy, values, reason, ts)
    sent = _sent_patch(tx, policy, row)
    if sent is _UNCHECKED:
        for col in check_values(policy, "creation", values, json_text=True):
            row[col] = dumps(row[col])  # (to_sql, only where it converts)
        sent = _sent_patch(tx, policy, row, checked=True)
    return row, sent


def _creation_row(policy: EntityPolicy, values: dict[str, Any], reason: StateReason,
                  ts: float) -> dict[str, Any]:
    """The INSERT's column -> value map for a new row, its values not yet looked at (see
    :func:`_creation`); ValueError before anything is written."""
    status = values.get("status")
    if status not in policy.initial:
        raise ValueError(
            f"{policy.name} must be created in an initial state "
            f"({', '.join(sorted(policy.initial))}), not {status!r}"
        )
    check_reason(policy, reason)
    if not policy.columns.keys() >= values.keys():
        unknown = sorted(set(values) - set(policy.columns))
        raise InvalidInput(f"{policy.table} has no column(s) {', '.join(unknown)}")
    if not _CREATION_MAINTAINED.isdisjoint(values):
        # The engine writes these from the reason; a value would be dropped.
        maintained = sorted(_CREATION_MAINTAINED & values.keys())
        raise InvalidInput(f"{policy.name} column(s) {', '.join(maintained)} are maintained "
                           "by the engine and cannot be given at creation")
    row = dict(values)
    if "id" not in row:  # (setdefault would make an id every time)
        row["id"] = new_id()
    row.setdefault("created_at", ts)
    row["version"] = 1
    row["status_reason_code"] = reason.code
    row["status_reason_summary"] = reason.summary
    row["status_evidence_refs"] = reason_json(reason.evidence_refs)
    return row


_CREATION_MAINTAINED = frozenset({"version", "status_reason_code", "status_reason_summary",
                                  "status_evidence_refs"})

#: Rows read back at once.
_READBACK_CHUNK = 500


def create_entities(tx: Tx, policy: EntityPolicy,
                    values: list[dict[str, Any]], *, reason: StateReason, actor: Actor,
                    now: float | None = None) -> list[str]:
    """:func:`create_entity` for many rows at once (in-transaction), in the given order.

    Same rows and the same creation facts (each carrying its row as stored). Where the
    values sent are what the rows store (PostgreSQL), each row and its fact are one
    statement, sent together per run of rows of the same shape; otherwise one
    ``executemany`` per run of rows that name the same columns, one read-back per chunk
    of ids and one ``executemany`` for the facts. Every row is checked before the first
    is written.
    """
    ts = time.time() if now is None else now
    made = [_creation(tx, policy, v, reason, ts) for v in values]
    rows = [row for row, _ in made]
    sent = [patch for _, patch in made]
    plans = [s for s in sent if s is not None]
    exact = bool(rows) and len(plans) == len(rows)
    if exact and tx.stores_as_sent:
        _create_with_facts(tx, policy, rows, plans, reason, actor, ts)
        return [str(r["id"]) for r in rows]
    start = 0
    while start < len(rows):  # consecutive rows with the same columns share one INSERT
        cols = tuple(rows[start])
        end = start + 1
        while end < len(rows) and tuple(rows[end]) == cols:
            end += 1
        tx.insert_entities(policy, cols, [list(r.values()) for r in rows[start:end]])
        start = end
    evidence = dumps(reason.evidence_refs)
    metadata = dumps(reason.metadata)
    facts: list[Fact] = []
    for i in range(0, len(rows), _READBACK_CHUNK):
        part = rows[i:i + _READBACK_CHUNK]
        ids = [r["id"] for r in part]
        if exact:
            # Each patch is known but for its row's columns to read back (see
            # create_entity): only those are read, of the rows that have any.
            wanted = {c: None for _, read in plans[i:i + _READBACK_CHUNK] for c in read}
            stored = {r["id"]: r for r in tx.entities_by_id(
                policy, ids, columns=("id", *wanted))} if wanted else {}
            patches = [{**patch, **{c: stored[row["id"]][c] for c in read}}
                       for row, (patch, read) in zip(part, plans[i:i + _READBACK_CHUNK],
                                                     strict=True)]
        else:
            stored = {r["id"]: r for r in tx.entities_by_id(policy, ids)}
            patches = [_initial_patch(stored[row["id"]], policy) for row in part]
        for row, patch in zip(part, patches, strict=True):
            # make_fact's fields, the reason's JSON encoded once for every row (and the
            # Fact made in C, as make_fact makes it).
            facts.append(tuple.__new__(Fact, (
                new_id(), policy.name, row["id"], None, row["status"], reason.code,
                reason.summary, evidence, actor.type, actor.id, ts, metadata, 1,
                dumps(patch), None)))
    tx.append_facts(facts)
    return [str(r["id"]) for r in rows]


def _create_with_facts(tx: Tx, policy: EntityPolicy, rows: list[dict[str, Any]],
                       sent: list[tuple[dict[str, Any], tuple[str, ...]]],
                       reason: StateReason, actor: Actor, ts: float,
                       idempotency_key: str | None = None) -> None:
    """Rows and their creation facts, one statement each, sent together per run of
    consecutive rows with the same columns and the same columns left to the database."""
    start = 0
    while start < len(rows):
        shape = (tuple(rows[start]), sent[start][1])
        end = start + 1
        while end < len(rows) and (tuple(rows[end]), sent[end][1]) == shape:
            end += 1
        tx.insert_entities_with_facts(policy, shape[0], [
            (list(row.values()), make_fact(new_id(), policy.name, row["id"], None,
                                           row["status"], reason, actor, ts, 1, patch,
                                           idempotency_key))
            for row, (patch, _) in zip(rows[start:end], sent[start:end], strict=True)],
            shape[1])
        start = end


async def create(db: Database, entity_type: str, values: dict[str, Any], *, reason: StateReason,
                 actor: Actor, now: float | None = None) -> str:
    """Create one entity row in an initial state, with its creation fact, in one transaction."""
    policy = db.registry.entity(entity_type)
    check_reason(policy, reason)
    return await db.write(lambda tx: create_entity(tx, policy, values, reason=reason,
                                                     actor=actor, now=now))


__all__ = ["MAX_JSON_DEPTH", "STANDARD_COLUMNS", "VOCABULARY_ERROR", "MoveTerms", "Moved",
           "apply_move", "apply_moves", "apply_transition", "check_columns", "check_values",
           "create", "create_entities", "create_entity", "new_id", "new_token",
           "transition", "value_problem"]
