"""The guarded compare-and-swap: one status change = one UPDATE + one fact, in the
caller's transaction.

Everything here runs inside :meth:`Database.write`, so the read, the checks, the UPDATE
and the fact see one snapshot under the write lock and commit (or vanish) together.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from ledgerq.codec import CONTAINERS, dumps
from ledgerq.errors import IdempotencyConflict, NotFound
from ledgerq.lifecycle.entering import entered
from ledgerq.lifecycle.facts import Fact, make_fact
from ledgerq.lifecycle.ids import new_id, new_token
from ledgerq.lifecycle.models import Actor, StateReason, TransitionRequest, TransitionResult
from ledgerq.lifecycle.plans import Plan, move_plan, stamp
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import EventStore, SentMove
from ledgerq.lifecycle.values import check_allowed, check_reason, check_values


def apply_transition(tx: EventStore, policy: EntityPolicy, request: TransitionRequest,
                     guard: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
                     now: float | None = None) -> TransitionResult:
    """The in-transaction half of :func:`~ledgerq.lifecycle.engine.transition`; callers
    must have run :func:`~ledgerq.lifecycle.engine.prepare`."""
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


def apply_move(tx: EventStore, policy: EntityPolicy, entity_id: str,
               from_state: str | None, to_state: str, reason: StateReason, actor: Actor, *,
               guard: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
               now: float | None = None, idempotency_key: str = "",
               whole_row: bool = False, skip_locked: bool = False,
               prepared: bool = False) -> Moved:
    """One guarded move inside the caller's transaction, in
    :func:`~ledgerq.lifecycle.engine.transition`'s check order.

    ``reason`` and ``actor`` are trusted as built (the queue makes them with
    ``model_construct``); the reason code and the column allowlists are still checked
    against the policy, so nothing the spec does not declare is ever written.
    ``whole_row`` returns the row as the UPDATE left it (``RETURNING *``), which saves a
    claim its read-back. ``skip_locked`` makes a row another writer holds a conflict at
    once instead of a wait (a claimant's move; see ``EventStore.read_for_move``); such a
    conflict reports ``from_state``, since the row was not read. ``prepared``: the caller
    ran :func:`~ledgerq.lifecycle.engine.prepare` on these very values (``transition()``),
    so they are not checked twice.
    """
    guard = guard or {}
    patch = patch or {}
    # A move naming the state it expects has a plan, whose making checked the reason code
    # and the allowlists (the first checks, once per shape); its values are its own.
    plan = None if from_state is None else move_plan(
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
        done = _swap(tx, policy, plan, entity_id, reason, actor, guard, patch, now,
                     idempotency_key, None)
        if done is not None:
            return done
        if skip_locked:
            # A claimant's row another claimant holds, took or moved on: lost, as the read
            # would have found it (no read: under contention most claims lose one).
            return _conflict(from_state)
    guard_cols = tuple(sorted(guard))
    row = tx.read_for_move(policy, entity_id, guard_cols, skip_locked=skip_locked)
    if row is None:
        if skip_locked:  # held by another writer (or gone): not this caller's to move
            return _conflict(from_state or "")
        raise NotFound(f"{policy.name} {entity_id!r} not found")
    observed: str = row[0]
    if from_state is not None and observed != from_state:
        return _conflict(observed)
    if plan is None:
        plan = move_plan(tx, policy, observed, to_state, reason, actor, guard, patch,
                         whole_row, skip_locked)
    if plan.refusal is not None:
        raise plan.refused_as(plan.refusal)
    for i, col in enumerate(guard_cols):
        if row[2 + i] != guard[col]:
            return _conflict(observed)
    done = _swap(tx, policy, plan, entity_id, reason, actor, guard, patch, now,
                 idempotency_key, row[1])
    if done is None:
        # Another writer moved the row between the read and the swap (possible where
        # writers run at once: PostgreSQL's READ COMMITTED): the conflict reports the
        # status it left, as a conflict seen at the read would have.
        now_row = tx.read_for_move(policy, entity_id, ())
        return _conflict(observed if now_row is None else now_row[0])
    return done


def _swap(tx: EventStore, policy: EntityPolicy, plan: Plan, entity_id: str, reason: StateReason,
          actor: Actor, guard: dict[str, Any], patch: dict[str, Any], now: float | None,
          idempotency_key: str, version: int | None) -> Moved | None:
    """The compare-and-swap of a move the plan allows, and its fact; None when it matched
    no row.

    ``version`` is the one read before (the swap requires it), or None when nothing was
    read: the swap then bumps whatever version the row has and returns it.
    """
    ts = time.time() if now is None else now
    changes, guards = _terms(tx, policy, plan, reason, ts, guard, patch)
    observed, to_state, whole_row = plan.observed, plan.to_state, plan.whole_row
    if tx.stores_as_sent and not whole_row and _stored_as_sent(tx, policy, plan.patched,
                                                               changes):
        # What the row will store is what is sent: the fact can be written from it, in
        # the swap's own statement (inserted only if the swap matched).
        sent = _sent(policy, plan, entity_id, reason, actor, ts, changes, guards,
                     idempotency_key, version)
        (done,) = tx.update_entities_with_facts(policy, [sent])
        if done is None:
            return None
        if policy.on_enter:
            entered(tx, policy, (sent.fact._replace(entity_version=done),))
        return Moved(True, observed, to_state, sent.fact.id, None)
    after = tx.swap(plan.unread if version is None else plan.read, entity_id, observed,
                    version, plan.moved_to, changes.values(), guards)
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
    fact = make_fact(new_id(), policy.name, entity_id, observed, to_state, reason, actor, ts,
                     new_version, changes, idempotency_key)
    tx.append_facts((fact,))
    if policy.on_enter:
        entered(tx, policy, (fact,))
    return Moved(True, observed, to_state, fact.id, after if whole_row else None)


def _terms(tx: EventStore, policy: EntityPolicy, plan: Plan, reason: StateReason, ts: float,
           guard: dict[str, Any], patch: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """A swap's changes (the stamp, fresh tokens, the patch) and guard values, as sent.

    A JSON column's value goes as JSON text, a scalar too (a task's result ``"done"``
    is the JSON string, which PostgreSQL's jsonb would refuse as bare text), except a
    number where the dialect binds numbers (:attr:`EventStore.binds_json_numbers`).
    """
    changes = stamp(reason, ts)
    for c in plan.fresh:
        changes[c] = new_token()
    json = policy.json_columns
    bare = tx.binds_json_numbers
    # (to_sql inline: a move's every value passes here, and few are JSON)
    for k, v in patch.items():
        changes[k] = json_param(v, bare) if k in json or isinstance(v, CONTAINERS) else v
    for c in plan.cleared:
        changes[c] = None
    return changes, [json_param(v, bare) if isinstance(v := guard[c], CONTAINERS) or c in json
                     else v for c in plan.guard_cols]


def json_param(value: Any, bare_numbers: bool) -> Any:
    """A JSON column's value as a statement sends it: JSON text, or a number as itself
    where the dialect binds numbers (NULL stays NULL)."""
    if value is None or (bare_numbers and type(value) in (int, float)):
        return value
    return dumps(value)


def _sent(policy: EntityPolicy, plan: Plan, entity_id: str, reason: StateReason,
          actor: Actor, ts: float, changes: dict[str, Any], guards: list[Any],
          idempotency_key: str, version: int | None) -> SentMove:
    """A swap whose fact is written from the values it sends, in its own statement; a
    swap after a read (``version`` given) waits for a row another writer holds."""
    return SentMove(entity_id, plan.observed, version, plan.moved_to, changes,
                    dict(zip(plan.guard_cols, guards, strict=True)),
                    plan.skip_locked and version is None,
                    make_fact(new_id(), policy.name, entity_id, plan.observed, plan.to_state,
                              reason, actor, ts, 0, changes, idempotency_key))


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


def apply_moves(tx: EventStore, policy: EntityPolicy, moves: Sequence[MoveTerms]) -> list[Moved]:
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
        changes, guards = _terms(tx, policy, plan, m.reason, ts, m.guard, m.patch)
        if plan.refusal is not None or not _stored_as_sent(tx, policy, plan.patched, changes):
            return [_apply(tx, policy, each) for each in moves]
        sent.append(_sent(policy, plan, m.entity_id, m.reason, m.actor, ts, changes, guards,
                          "", None))
    done = tx.update_entities_with_facts(policy, sent)
    if policy.on_enter:
        entered(tx, policy, [s.fact._replace(entity_version=version)
                             for s, version in zip(sent, done, strict=True)
                             if version is not None])
    return [_apply(tx, policy, m) if version is None
            else Moved(True, m.from_state, m.to_state, s.fact.id, None)
            for m, s, version in zip(moves, sent, done, strict=True)]


def _checked_plan(tx: EventStore, policy: EntityPolicy, m: MoveTerms) -> Plan:
    """The plan of a move that names the state it expects, its values checked: what
    :func:`apply_move` checks before its swap, in the same order."""
    plan = move_plan(tx, policy, m.from_state, m.to_state, m.reason, m.actor, m.guard,
                     m.patch, False, False)
    if m.guard:
        check_values(policy, "guard", m.guard)
    if m.patch:
        check_values(policy, "patch", m.patch)
    return plan


def _swaps_then_facts(tx: EventStore, policy: EntityPolicy, moves: Sequence[MoveTerms]
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
                changes, guards = _terms(tx, policy, plan, m.reason, ts, m.guard, m.patch)
                after = tx.swap(plan.unread, m.entity_id, m.from_state, None,
                                None if m.from_state == m.to_state else m.to_state,
                                changes.values(), guards)
            if after is None:
                _append(tx, policy, facts)
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
                _append(tx, policy, facts)
        raise
    _append(tx, policy, facts)
    return out


def _append(tx: EventStore, policy: EntityPolicy, facts: list[Fact]) -> None:
    """Append the facts of swaps that matched, and defer what the states they entered
    declare (``on_enter``)."""
    tx.append_facts(facts)
    if policy.on_enter:
        entered(tx, policy, facts)


def _apply(tx: EventStore, policy: EntityPolicy, m: MoveTerms) -> Moved:
    return apply_move(tx, policy, m.entity_id, m.from_state, m.to_state, m.reason, m.actor,
                      guard=m.guard, patch=m.patch, now=m.now)


def _stored_as_sent(tx: EventStore, policy: EntityPolicy, patched: tuple[str, ...],
                    changes: dict[str, Any]) -> bool:
    """Whether every patched value reads back from its column as the same value of the
    same type (``EventStore.exact_types``; no JSON column, no int sent to a float column): the
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


def _conflict(observed: str) -> Moved:
    # A conflict writes nothing; its transition_id names no fact.
    return Moved(False, observed, observed, new_id())


def _replay(tx: EventStore, entity_type: str, entity_id: str, to_state: str,
            key: str) -> Moved | None:
    found = tx.find_fact_by_idempotency_key(entity_type, entity_id, key)
    if found is None:
        return None
    fact_id, previous, status = found
    if status != to_state:
        raise IdempotencyConflict(
            f"idempotency key {key!r} already applied {previous} -> {status} to "
            f"{entity_type} {entity_id!r}; refusing a different move to {to_state}"
        )
    return Moved(True, previous, status, fact_id)
