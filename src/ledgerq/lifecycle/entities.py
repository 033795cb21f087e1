"""``db.entity(name)``: one entity type's rows, created, read and moved in one line each.

A handle adds no rule of its own: every write is the engine's one guarded
compare-and-swap with one fact (:mod:`ledgerq.lifecycle.moves`), every refusal the
engine's, as a typed exception of :mod:`ledgerq.errors`. What it adds is the reading a
caller otherwise does by hand: ``move`` reads the current state itself, inside the same
write unit as the swap (so nothing can move the row in between), and ``send`` finds the
edge the spec names by an event. A move without a reason records the edge's default
reason (the spec's ``reason``), or the one reason code declared for the target state.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ledgerq.errors import Conflict, IllegalTransition, InvalidInput, NotFound, UnknownReason
from ledgerq.lifecycle.creation import create_entity
from ledgerq.lifecycle.models import Actor, StateReason, TransitionRequest, TransitionResult
from ledgerq.lifecycle.moves import apply_transition, json_param
from ledgerq.lifecycle.rows import decode_cursor, decode_json, encode_cursor, floats_as_floats
from ledgerq.lifecycle.values import check_columns, check_reason, value_problem

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy
    from ledgerq.lifecycle.store import Database, EventStore
    from ledgerq.lifecycle.transactions import Pending, Transaction

T = TypeVar("T")

#: The log's columns that hold JSON text.
FACT_JSON = ("evidence_refs", "metadata", "patch")
MAX_PAGE = 1000


@dataclass
class EntityPage:
    """One page of rows, newest first; ``next_cursor`` continues it (None: the last)."""

    items: list[dict[str, Any]]
    next_cursor: str | None


class Entity:
    """The rows of one entity type (``db.entity("order")``)."""

    def __init__(self, db: Database[Any], name: str, *,
                 policy: EntityPolicy | None = None) -> None:
        self.db = db
        #: The entity's rules: the loaded specs' (or ``policy``, e.g. the database's
        #: recorded spec of an entity the loaded specs lack).
        self.policy: EntityPolicy = policy if policy is not None else db.registry.entity(name)

    @property
    def name(self) -> str:
        return self.policy.name

    def __repr__(self) -> str:
        return f"<Entity {self.name}>"

    # ------------------------------------------------------------------ reads

    def decode(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """A row with its JSON columns decoded and its boolean columns bools (SQLite
        stores them as 1 and 0): what a guard on the row's own values can be given."""
        out = decode_json(dict(row), (*self.policy.json_columns, "status_evidence_refs"))
        for column in self.policy.bool_columns:
            value = out.get(column)
            if type(value) is int:
                out[column] = bool(value)
        return out

    async def get(self, entity_id: str) -> dict[str, Any]:
        """The row, JSON decoded; :class:`~ledgerq.errors.NotFound` (a LookupError)."""
        rows = await self.db.read(lambda tx: tx.read_entities(self.policy, [entity_id]))
        if not rows:
            raise NotFound(f"{self.name} {entity_id!r} not found")
        return self.decode(rows[0])

    async def list(self, *, status: str | Iterable[str] | None = None, limit: int = 50,
                   cursor: str | None = None) -> EntityPage:
        """Rows newest first (in ``status``, when given), a keyset page at a time."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise InvalidInput(f"limit must be an int from 1 to {MAX_PAGE}, not {limit!r}")
        statuses = [status] if isinstance(status, str) else list(status or [])
        unknown = [s for s in statuses if s not in self.policy.states]
        if unknown:
            raise InvalidInput(f"{self.name} has no state {unknown[0]!r}; states: "
                               f"{', '.join(self.policy.states)}")
        filters = {"status": statuses} if statuses else {}
        before = decode_cursor(cursor) if cursor is not None else None
        columns = tuple(self.policy.columns)
        rows = await self.db.read(lambda tx: tx.read_page_before(
            self.policy, filters, columns, before, limit + 1))
        items = [self.decode(r) for r in rows[:limit]]
        last = items[-1] if len(rows) > limit else None
        return EntityPage(items, None if last is None else
                          encode_cursor(float(last["created_at"]), str(last["id"])))

    async def counts(self) -> dict[str, int]:
        """Rows per state: every declared state in spec order (0 where none is), then any
        state rows are in that the spec does not declare (a newer release's)."""
        found = await self.db.read(lambda tx: tx.count_statuses(self.policy))
        out = {state: found.pop(state, 0) for state in self.policy.states}
        return {**out, **dict(sorted(found.items()))}

    async def history(self, entity_id: str) -> builtins.list[dict[str, Any]]:
        """Every fact of the row, oldest first: the log's columns, JSON decoded (a JSON
        column's value inside ``patch`` too, as ``get`` shows it)."""
        facts = await self.db.read(lambda tx: tx.read_facts(self.name, entity_id))
        out = []
        for fact in facts:
            decoded = decode_json(fact, FACT_JSON)
            patch = decoded.get("patch")
            if isinstance(patch, dict):
                decoded["patch"] = floats_as_floats(
                    decode_json(patch, self.policy.json_columns), self.policy.float_columns)
            out.append(decoded)
        return out

    # ------------------------------------------------------------------ writes

    @overload
    async def create(self, values: Mapping[str, Any] | None = None, *, actor: Actor,
                     state: str | None = None, reason: str | StateReason | None = None,
                     tx: None = None) -> str: ...

    @overload
    async def create(self, values: Mapping[str, Any] | None = None, *, actor: Actor,
                     state: str | None = None, reason: str | StateReason | None = None,
                     tx: Transaction) -> Pending[str]: ...

    async def create(self, values: Mapping[str, Any] | None = None, *, actor: Actor,
                     state: str | None = None, reason: str | StateReason | None = None,
                     tx: Transaction | None = None) -> str | Pending[str]:
        """A new row in ``state`` (default: the spec's one initial state) with its
        creation fact; its id (in a transaction: the id once it commits)."""
        if state is None:
            initial = sorted(self.policy.initial)
            if len(initial) != 1:
                raise InvalidInput(f"{self.name} has several initial states "
                                   f"({', '.join(initial)}): give state=")
            state = initial[0]
        why = self._reason(reason, state)
        given = dict(values or {})
        if "status" in given:
            raise InvalidInput("give the state as state=, not as a 'status' value")
        for column in self.policy.json_columns:
            problem = value_problem(given.get(column), json=True)
            if problem is not None:
                raise InvalidInput(f"creation column {column} of {self.name}: {problem}")
        policy = self.policy

        def unit(t: EventStore) -> str:
            bare = t.binds_json_numbers
            row = {k: (json_param(v, bare) if k in policy.json_columns else v)
                   for k, v in given.items()}
            row["status"] = state
            return create_entity(t, policy, row, reason=why, actor=actor)

        return await self._write(unit, tx, f"the new {self.name}'s id")

    @overload
    async def move(self, entity_id: str, to_state: str, *, actor: Actor,
                   patch: Mapping[str, Any] | None = None,
                   reason: str | StateReason | None = None,
                   guard: Mapping[str, Any] | None = None,
                   idempotency_key: str | None = None, expect: str | None = None,
                   tx: None = None) -> TransitionResult: ...

    @overload
    async def move(self, entity_id: str, to_state: str, *, actor: Actor,
                   patch: Mapping[str, Any] | None = None,
                   reason: str | StateReason | None = None,
                   guard: Mapping[str, Any] | None = None,
                   idempotency_key: str | None = None, expect: str | None = None,
                   tx: Transaction) -> Pending[TransitionResult]: ...

    async def move(self, entity_id: str, to_state: str, *, actor: Actor,
                   patch: Mapping[str, Any] | None = None,
                   reason: str | StateReason | None = None,
                   guard: Mapping[str, Any] | None = None,
                   idempotency_key: str | None = None, expect: str | None = None,
                   tx: Transaction | None = None) -> TransitionResult | Pending[TransitionResult]:
        """Move the row to ``to_state`` from whatever state it is in (read inside the
        write): :class:`~ledgerq.errors.IllegalTransition` and the other refusals of
        :mod:`ledgerq.errors` when the spec forbids it; :class:`~ledgerq.errors.Conflict`
        when it is not in ``expect`` (given), a guard fails, or another writer won."""
        # Without a reason, the default is the edge's: known once the state is read.
        why = None if reason is None else self._reason(reason, to_state)
        if to_state not in self.policy.states:
            raise IllegalTransition(f"{self.name} has no state {to_state!r}; states: "
                                    f"{', '.join(self.policy.states)}")
        unit = self._mover(entity_id, lambda _observed: to_state, why, actor, patch, guard,
                           idempotency_key, expect)
        return await self._write(unit, tx, f"the move of {self.name} {entity_id}")

    @overload
    async def send(self, entity_id: str, event: str, *, actor: Actor,
                   patch: Mapping[str, Any] | None = None,
                   reason: str | StateReason | None = None,
                   guard: Mapping[str, Any] | None = None,
                   idempotency_key: str | None = None, expect: str | None = None,
                   tx: None = None) -> TransitionResult: ...

    @overload
    async def send(self, entity_id: str, event: str, *, actor: Actor,
                   patch: Mapping[str, Any] | None = None,
                   reason: str | StateReason | None = None,
                   guard: Mapping[str, Any] | None = None,
                   idempotency_key: str | None = None, expect: str | None = None,
                   tx: Transaction) -> Pending[TransitionResult]: ...

    async def send(self, entity_id: str, event: str, *, actor: Actor,
                   patch: Mapping[str, Any] | None = None,
                   reason: str | StateReason | None = None,
                   guard: Mapping[str, Any] | None = None,
                   idempotency_key: str | None = None, expect: str | None = None,
                   tx: Transaction | None = None) -> TransitionResult | Pending[TransitionResult]:
        """Take the edge ``event`` names out of the row's current state (read inside the
        write); IllegalTransition when no edge out of that state has the event."""
        if event not in self.policy.events:
            known = ", ".join(sorted(self.policy.events)) or "none"
            raise IllegalTransition(f"{self.name} declares no event {event!r}; events: "
                                    f"{known}")
        policy = self.policy

        def target(observed: str) -> str:
            found = policy.event_target(observed, event)
            if found is None:
                here = sorted(r.event for (s, _), r in policy.edge_rules.items()
                              if s == observed and r.event is not None)
                raise IllegalTransition(
                    f"{policy.name} {entity_id!r} is {observed}, where event {event!r} "
                    f"takes no edge; events from {observed}: {', '.join(here) or 'none'}")
            return found

        given = None if reason is None else self._reason(reason, None)
        unit = self._mover(entity_id, target, given, actor, patch, guard, idempotency_key,
                           expect)
        return await self._write(unit, tx, f"the {event!r} of {self.name} {entity_id}")

    # ------------------------------------------------------------------ helpers

    async def _write(self, unit: Callable[[EventStore], T], tx: Transaction | None,
                     what: str) -> T | Pending[T]:
        """``unit`` in a write of its own, or queued in ``tx`` (its value then pending)."""
        if tx is not None:
            return tx.add(unit, what)
        return await self.db.write(unit)

    def _mover(self, entity_id: str, target: Callable[[str], str], why: StateReason | None,
               actor: Actor, patch: Mapping[str, Any] | None,
               guard: Mapping[str, Any] | None, idempotency_key: str | None,
               expect: str | None) -> Callable[[EventStore], TransitionResult]:
        """The write unit of a move: the current state read, the target chosen from it
        (``why`` None: the reason is the target's default), then the engine's guarded
        swap from that state (its checks, in its order)."""
        policy = self.policy
        patched = dict(patch) if patch else None
        guarded = dict(guard) if guard else None
        check_columns(policy, guarded, patched)

        def unit(tx: EventStore) -> TransitionResult:
            rows = tx.read_entities(policy, [entity_id], columns=("id", "status"))
            if not rows:
                raise NotFound(f"{policy.name} {entity_id!r} not found")
            observed = str(rows[0]["status"])
            if expect is not None and observed != expect:
                raise Conflict(f"{policy.name} {entity_id!r} is {observed}, not {expect}")
            to_state = target(observed)
            reason = why if why is not None else self._reason(None, to_state, observed)
            request = TransitionRequest(
                entity_type=policy.name, entity_id=entity_id, from_state=observed,
                to_state=to_state, reason=reason, actor=actor,
                idempotency_key=idempotency_key or "")
            result = apply_transition(tx, policy, request, guarded, patched)
            if result.conflict:
                raise Conflict(f"{policy.name} {entity_id!r}: the move {observed} -> "
                               f"{to_state} lost (now {result.current_state}): a guard "
                               "did not match, or another writer moved it first")
            return result

        return unit

    def _reason(self, reason: str | StateReason | None, to_state: str | None,
                source: str | None = None) -> StateReason:
        """The reason a move records: as given, else the default of the edge it takes
        (from ``source``; when the source is not known, the one default of the edges into
        the target state), else the one code declared for the target state
        (``<domain>.<state>.<cause>``)."""
        if isinstance(reason, StateReason):
            check_reason(self.policy, reason)
            return reason
        if isinstance(reason, str):
            why = StateReason(code=reason)
            check_reason(self.policy, why)
            return why
        if to_state is None:
            raise UnknownReason("give reason=")
        if source is not None:
            taken = self.policy.edge_rules.get((source, to_state))
            defaults = {taken.reason} if taken is not None and taken.reason else set()
        else:
            defaults = {r.reason for (_, dst), r in self.policy.edge_rules.items()
                        if dst == to_state and r.reason is not None}
        if len(defaults) == 1:
            return StateReason(code=defaults.pop())
        codes = sorted(c for c in self.policy.reason_codes if c.split(".")[1:2] == [to_state])
        if len(codes) == 1:
            return StateReason(code=codes[0])
        raise UnknownReason(f"{self.name}: a move to {to_state} needs reason=, one of "
                            f"{', '.join(codes or sorted(self.policy.reason_codes))}")


__all__ = ["Entity", "EntityPage"]
