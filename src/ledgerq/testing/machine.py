"""``LifecycleMachine.for_entity(name)``: a Hypothesis stateful test of one entity, made
from its spec.

Each example opens a scratch database (a temporary SQLite file, or a fresh schema of the
PostgreSQL database ``target`` names) with two handles, and runs rules drawn from the
spec: rows created in every initial state; legal moves (steered toward edges the example
has not applied yet, so deep states are reached by design, not by luck); illegal moves,
each with the typed refusal it must raise; stale moves (``Conflict``); two handles racing
for one row; a missing row; and, for an entity whose moves mint fencing tokens, an
expired holder's move fenced off. After every step:

* each row equals the fold of its facts, and its versions run 1, 2, 3, ... (``verify``
  scoped to the machine's rows);
* every fact is a declared edge, with a declared reason code and an actor type the
  entity and the edge allow;
* a terminal row never changes again;
* every row is where the independent model (``policy.to_machine()``, a
  ``transitions.Machine``) says it is;
* for an entity whose states defer tasks (``on_enter``), each entry into such a state
  deferred one run of each task, and nothing else deferred any.

Subclass the generated class to add rules: ``self.entity`` and ``self.other`` are the
two handles, ``self.rows`` the model of every row, :meth:`run` runs a coroutine,
:meth:`pick` draws a row and :meth:`apply` makes a legal move and records it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

from ledgerq.errors import (
    ActorNotAllowed,
    Conflict,
    IllegalTransition,
    InvalidInput,
    MissingColumns,
    NotFound,
)
from ledgerq.lifecycle.entities import Entity
from ledgerq.lifecycle.models import TransitionResult
from ledgerq.lifecycle.registry import EntityPolicy, Registry, default_registry
from ledgerq.projections.log import check_rows
from ledgerq.store.db import StateDB
from ledgerq.store.scratch import Scratch
from ledgerq.testing import strategies

M = TypeVar("M", bound="LifecycleMachine")
Edge = tuple[str, str]


@dataclass(eq=False)
class ModelRow:
    """What the machine knows of one row. ``state`` is driven by the transitions model
    (the oracle): a move the oracle refuses cannot be recorded."""

    id: str
    #: The row as last read (after every step).
    values: dict[str, Any]
    version: int = 1
    #: Every fencing token the row held, per token column, oldest first.
    tokens: dict[str, list[Any]] = field(default_factory=dict)
    #: Moves applied since the row was last read: the edge and the values it patched,
    #: checked against the row at the next read.
    unread: list[tuple[Edge, dict[str, Any]]] = field(default_factory=list)
    state: str = ""  # set by the oracle

    if TYPE_CHECKING:  # bound by transitions when the oracle adds the row
        def trigger(self, name: str, **kwargs: Any) -> bool: ...
        def may_trigger(self, name: str, **kwargs: Any) -> bool: ...


def may(row: ModelRow, to_state: str, arguments: dict[str, Any]) -> bool:
    """Whether the oracle would take the row to ``to_state`` (it stays put)."""
    return bool(row.may_trigger(to_state, **arguments))


def take(row: ModelRow, to_state: str, arguments: dict[str, Any]) -> bool:
    """Move the row's oracle model to ``to_state``; False when it refuses."""
    return bool(row.trigger(to_state, **arguments))


def _steps(policy: EntityPolicy, goal: str) -> dict[str, int]:
    """Moves from each state to ``goal`` along declared edges (absent: unreachable)."""
    back: dict[str, list[str]] = {}
    for src, dsts in policy.edges.items():
        for dst in dsts:
            back.setdefault(dst, []).append(src)
    dist = {goal: 0}
    todo = deque([goal])
    while todo:
        here = todo.popleft()
        for src in back.get(here, ()):
            if src not in dist:
                dist[src] = dist[here] + 1
                todo.append(src)
    return dist


class LifecycleMachine(RuleBasedStateMachine):
    """The generated stateful test: see the module docstring. Make one with
    :meth:`for_entity`; its ``TestCase`` is what pytest (or unittest) runs."""

    policy: ClassVar[EntityPolicy]
    registry: ClassVar[Registry]
    #: None: a temporary SQLite file per example; a PostgreSQL URL: a schema per example
    #: in that database; a directory: a SQLite file per example there.
    target: ClassVar[str | None] = None
    #: Rows one example creates at most.
    max_rows: ClassVar[int] = 6
    #: Every edge any example of this class applied (what a coverage check reads).
    applied: ClassVar[set[Edge]]

    @classmethod
    def for_entity(cls: type[M], entity: str, *, registry: Registry | None = None,
                   target: str | None = None) -> type[M]:
        """A machine class for ``entity`` of ``registry`` (default: the packaged specs);
        InvalidInput when the entity has a required column the kit cannot fill."""
        registry = registry if registry is not None else default_registry()
        policy = registry.entity(entity)
        strategies.creation_values(policy)  # a required reference is refused here
        for column in sorted(policy.guard_columns | policy.patch_columns):
            strategies.values(policy, column)
        name = "".join(part.title() for part in re.split(r"[^A-Za-z0-9]+", entity)) + "Machine"
        return type(name, (cls,), {"policy": policy, "registry": registry,
                                   "target": target, "applied": set(),
                                   "__module__": cls.__module__})

    # ------------------------------------------------------------------ an example

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.scratch = Scratch(self.target, prefix="ledgerq_machine")
        try:
            self.db = StateDB(self.scratch.target, registry=self.registry)
            self.db2 = StateDB(self.scratch.target, registry=self.registry)
            self.run(self.db.open())
            self.run(self.db2.open())
        except BaseException:
            self._close()
            raise
        #: The two handles: separate connections to one database.
        self.entity: Entity = self.db.entity(self.policy.name)
        self.other: Entity = self.db2.entity(self.policy.name)
        self.oracle = self.policy.to_machine(model=[])
        self.rows: dict[str, ModelRow] = {}
        #: Terminal rows as first seen: they must never change.
        self.frozen: dict[str, dict[str, Any]] = {}
        #: Edges this example applied, and the order it goes after the rest.
        self.applied_here: set[Edge] = set()
        self.focus: list[Edge] = sorted(self.policy.edge_rules)
        self.created = 0
        #: Columns the engine mints a fresh token in on some edge (a lease's fence).
        self.token_columns = sorted({c for r in self.policy.edge_rules.values()
                                     for c in r.fresh_tokens})
        #: Per state, the moves from each state to it.
        self.distances = {s: _steps(self.policy, s) for s in self.policy.states}

    def teardown(self) -> None:
        event(f"edges applied per example: {len(self.applied_here)}")
        self._close()

    def _close(self) -> None:
        try:
            for db in (getattr(self, "db2", None), getattr(self, "db", None)):
                if db is not None and db.is_open:
                    with contextlib.suppress(Exception):
                        self.run(db.close())
        finally:
            self.runner.close()
            self.scratch.drop()

    def run(self, coro: Any) -> Any:
        """Run a coroutine on the example's event loop."""
        return self.runner.run(coro)

    # ------------------------------------------------------------------ helpers

    def handle(self, second: bool) -> Entity:
        return self.other if second else self.entity

    def live(self) -> list[ModelRow]:
        """Rows that can still move, in creation order."""
        return [r for r in self.rows.values() if self.policy.targets(r.state)]

    def pick(self, data: st.DataObject, *, live: bool = False) -> ModelRow | None:
        """A row of this example (only those that can still move, when ``live``)."""
        rows = self.live() if live else list(self.rows.values())
        if not rows:
            return None
        return data.draw(st.sampled_from(rows), label="row")

    def read(self, row: ModelRow) -> dict[str, Any]:
        return dict(self.run(self.entity.get(row.id)))

    def create(self, data: st.DataObject, state: str | None = None) -> ModelRow:
        """A new row in ``state`` (drawn from the initial states when None)."""
        policy = self.policy
        if state is None:
            state = data.draw(st.sampled_from(sorted(policy.initial)), label="initial")
        given = self.unique(data.draw(strategies.creation_values(policy), label="values"))
        actor = data.draw(strategies.actors(policy.actors), label="actor")
        reason = data.draw(strategies.reasons(strategies.codes_for(policy, None, state)),
                           label="reason")
        second = data.draw(st.booleans(), label="second handle")
        rid = self.run(self.handle(second).create(given, actor=actor, state=state,
                                                  reason=reason))
        row = ModelRow(rid, {})
        row.values = self.read(row)  # a move in the same step guards on its defaults
        assert (row.values["status"], row.values["version"]) == (state, 1), row.values
        for column, value in given.items():
            assert row.values[column] == value, (column, value, row.values[column])
        self.oracle.add_model(row, initial=state)
        self.rows[rid] = row
        self.created += 1
        self._seen(row, [])
        event(f"created in {state}")
        return row

    def unique(self, given: dict[str, Any]) -> dict[str, Any]:
        """``given`` with each value a unique index covers made distinct per row, so a
        spec's unique index (one deployment in flight per service) does not refuse the
        machine's second row. (A reference is None here: the kit fills none.)"""
        out = dict(given)
        for index in self.policy.indexes:
            if not index.unique:
                continue
            for column in index.columns:
                kind = self.policy.columns[column].type
                if out.get(column) is None:  # NULLs never collide
                    continue
                if kind == "text":
                    out[column] = f"{out[column]}#{self.created}"
                elif kind in ("integer", "float", "timestamp"):
                    out[column] = self.created
        return out

    def apply(self, row: ModelRow, move: strategies.Move, *, second: bool = False
              ) -> TransitionResult:
        """Make a legal move and record it: the engine must apply it and the oracle must
        agree (the row is checked against the move's patch at the next read)."""
        src = row.state
        if row.unread and move.guard_columns:
            # Moved earlier in this step: guard on what it holds now (a minted token too).
            row.values = self.read(row)
        arguments = move.arguments(row.values)
        assert may(row, move.to_state, arguments), (
            f"the oracle refuses {src} -> {move.to_state}", move)
        try:
            result: TransitionResult = self.run(self.handle(second).move(
                row.id, expect=src, **arguments))
        except Exception as exc:
            raise AssertionError(f"a legal move {src} -> {move.to_state} raised "
                                 f"{type(exc).__name__}: {exc}", move) from exc
        assert result.applied and (result.previous_state, result.current_state) == (
            src, move.to_state), result
        self._record(row, move)
        return result

    def _record(self, row: ModelRow, move: strategies.Move) -> None:
        """Drive the oracle and the model through a move the engine applied."""
        src = row.state
        assert take(row, move.to_state, move.arguments(row.values)), (
            "the oracle refuses a move the engine applied", src, move)
        edge = (src, move.to_state)
        row.version += 1
        row.unread.append((edge, dict(move.patch)))
        row.values.update(move.patch, status=move.to_state)
        # An edge that clears a column group sets what the patch does not give to NULL.
        row.values.update(dict.fromkeys(self.policy.edge_rules[edge].clears - set(move.patch)))
        self.applied_here.add(edge)
        self.applied.add(edge)
        event(f"edge {src} -> {move.to_state}")

    def _seen(self, row: ModelRow, moves: list[tuple[Edge, dict[str, Any]]]) -> None:
        """A row just read after ``moves``: a move that minted a token gave it one it
        never held before; a terminal row is frozen as first seen."""
        minted: set[str] = set()
        for edge, patch in moves:
            rule = self.policy.edge_rules[edge]
            minted = (minted - set(patch) - rule.clears) | (rule.fresh_tokens - set(patch))
        for column in self.token_columns:
            token = row.values.get(column)
            held = row.tokens.setdefault(column, [])
            if column in minted:
                assert token is not None and token not in held, (
                    f"{column} {token!r} was not fresh: held before {held}")
            if token is not None and (not held or held[-1] != token):
                held.append(token)
        if row.state in self.policy.terminal:
            self.frozen.setdefault(row.id, dict(row.values))

    def expect_refusal(self, row: ModelRow, move: strategies.Move, raises: type[Exception],
                       *, expect: str | None = None, second: bool = False) -> None:
        """The move must raise exactly ``raises``; the next read shows nothing written."""
        try:
            got = self.run(self.handle(second).move(row.id, expect=expect or row.state,
                                                    **move.arguments(row.values)))
        except Exception as exc:
            assert type(exc) is raises, (f"expected {raises.__name__}, got "
                                         f"{type(exc).__name__}: {exc}", move)
        else:
            raise AssertionError(f"expected {raises.__name__}, the move applied: {got}",
                                 move)

    # ------------------------------------------------------------------ rules

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        """The edge this example goes after first (examples differ; then the rest in
        order), and one row."""
        edges = sorted(self.policy.edge_rules)
        first = data.draw(st.integers(0, len(edges) - 1), label="first edge")
        self.focus = edges[first:] + edges[:first]
        self.create(data)

    @rule(data=st.data())
    def create_row(self, data: st.DataObject) -> None:
        """A new row in an initial state (up to ``max_rows``)."""
        if self.created < self.max_rows:
            self.create(data)

    @rule(data=st.data(), steps=st.integers(1, 4))
    def legal_moves(self, data: st.DataObject, steps: int) -> None:
        """Moves the spec allows, toward the first edge (in this example's order) not
        applied yet: each time the row nearest it takes the next step of a shortest path
        there. A few steps per rule: a deep edge is reached within one example."""
        for _ in range(steps):
            chosen = self.steer(data)
            if chosen is None:
                return
            row, dst = chosen
            move = data.draw(strategies.legal_move_to(self.policy, row.state, dst),
                             label="move")
            self.apply(row, move, second=data.draw(st.booleans(), label="second handle"))

    def live_move(self, data: st.DataObject) -> tuple[ModelRow, strategies.Move] | None:
        """A row that can still move, and a move the spec allows it (None: no such row)."""
        row = self.pick(data, live=True)
        if row is None:
            return None
        return row, data.draw(strategies.legal_moves(self.policy, row.state), label="move")

    @rule(data=st.data())
    def any_legal_move(self, data: st.DataObject) -> None:
        """A legal move of any row, unsteered."""
        drawn = self.live_move(data)
        if drawn is not None:
            self.apply(*drawn, second=data.draw(st.booleans(), label="second handle"))

    def steer(self, data: st.DataObject) -> tuple[ModelRow, str] | None:
        """(row, target) one step nearer the next edge to apply; a new row when no row
        can get there and rows are left to make."""
        policy = self.policy
        for src, dst in self.focus:
            if (src, dst) in self.applied_here:
                continue
            dist = self.distances[src]
            near = [r for r in self.live() if r.state in dist]
            if not near:
                starts = sorted(s for s in policy.initial if s in dist)
                if not starts or self.created >= self.max_rows:
                    continue
                near = [self.create(data, data.draw(st.sampled_from(starts),
                                                    label="initial"))]
            best = min(dist[r.state] for r in near)
            row = data.draw(st.sampled_from([r for r in near if dist[r.state] == best]),
                            label="row")
            if row.state == src:
                return row, dst
            steps = [t for t in policy.targets(row.state) if dist.get(t) == best - 1]
            return row, data.draw(st.sampled_from(steps), label="step")
        anyone = self.pick(data, live=True)
        if anyone is None:
            return None
        return anyone, data.draw(st.sampled_from(policy.targets(anyone.state)),
                                 label="target")

    @rule(data=st.data())
    def illegal_move(self, data: st.DataObject) -> None:
        """A move with one defect: the typed refusal, and nothing written."""
        row = self.pick(data)
        if row is None:
            return
        refused = data.draw(strategies.illegal_moves(self.policy, row.state), label="move")
        note(f"illegal: {refused.why}")
        event(f"refused: {refused.raises.__name__}")
        move, raises = refused.move, refused.raises
        if raises is IllegalTransition:
            assert move.to_state not in self.oracle.get_triggers(row.state), refused
        elif raises is not InvalidInput:  # the model knows no allowlists or value types
            # The model refuses a wrong actor or missing columns; reason codes it ignores.
            refuses = raises in (ActorNotAllowed, MissingColumns)
            assert may(row, move.to_state, move.arguments(row.values)) != refuses, (
                "the oracle disagrees", refused)
        self.expect_refusal(row, move, raises, second=data.draw(st.booleans(),
                                                                label="second handle"))

    @rule(data=st.data())
    def stale_move(self, data: st.DataObject) -> None:
        """A legal move made from a state the row is no longer in, or guarded on a value
        it no longer holds: Conflict, and nothing written."""
        drawn = self.live_move(data)
        if drawn is None:
            return
        row, move = drawn
        guarded = sorted(c for c in self.policy.guard_columns
                         if self.policy.columns[c].references is None)
        stale_guard = bool(guarded) and data.draw(st.booleans(), label="stale guard")
        if stale_guard:
            column = data.draw(st.sampled_from(guarded), label="guard column")
            drawn = data.draw(strategies.values(self.policy, column), label="stale value")
            wrong = strategies.other_than(self.policy, column, row.values.get(column), drawn)
            self.expect_refusal(row, move.guarded(column, wrong), Conflict)
            return
        others = [s for s in self.policy.states if s != row.state]
        stale = data.draw(st.sampled_from(others), label="expected state")
        self.expect_refusal(row, move, Conflict, expect=stale)

    @rule(data=st.data())
    def move_missing_row(self, data: st.DataObject) -> None:
        """A move of a row that does not exist: NotFound, nothing written."""
        drawn = self.live_move(data)
        if drawn is None:
            return
        row, move = drawn
        try:
            self.run(self.entity.move(f"missing-{row.id}", **move.arguments(row.values)))
        except NotFound:
            return
        raise AssertionError("a move of a missing row did not raise NotFound")

    @rule(data=st.data())
    def race(self, data: st.DataObject) -> None:
        """Two handles move one row at once, both from the state they saw to the same
        target: one wins, the other gets Conflict, unless the first left the row where
        the second expects it (a self-loop) with its guard still true; the log says who
        went first."""
        row = self.pick(data, live=True)
        if row is None:
            return
        # One target for both: whoever wins, the row ends in the same state, so what the
        # example draws next does not depend on the race's winner (Hypothesis replays an
        # example's draws; a winner varies from run to run).
        dst = data.draw(st.sampled_from(self.policy.targets(row.state)), label="target")
        a = data.draw(strategies.legal_move_to(self.policy, row.state, dst), label="first")
        b = data.draw(strategies.legal_move_to(self.policy, row.state, dst), label="second")
        src, before = row.state, dict(row.values)

        async def both() -> list[Any]:
            return list(await asyncio.gather(
                self.entity.move(row.id, expect=src, **a.arguments(before)),
                self.other.move(row.id, expect=src, **b.arguments(before)),
                return_exceptions=True))

        got = self.run(both())
        for outcome in got:
            if isinstance(outcome, BaseException) and not isinstance(outcome, Conflict):
                raise AssertionError(f"a racer's legal move from {src} raised "
                                     f"{type(outcome).__name__}: {outcome}") from outcome
        won = [(m, r) for m, r in zip((a, b), got, strict=True)
               if isinstance(r, TransitionResult)]
        event(f"race: {len(won)} applied")
        assert won, "neither racer applied"
        facts = self.run(self.entity.history(row.id))[row.version:]
        assert len(facts) == len(won), ("facts written by the race", facts, got)
        if len(won) == 2:
            # Serial: the first is the one the log has first.
            won.sort(key=lambda w: w[1].transition_id != facts[0]["id"])
            first, second = won[0][0], won[1][0]
            assert first.to_state == src, "both applied though the first left the state"
            patched = {**before, **first.patch}
            assert all(patched.get(c) == before.get(c) for c in second.guard_columns), \
                "both applied though the first changed the second's guard"
        for move, _ in won:
            self._record(row, move)

    @rule(data=st.data())
    def fenced_holder(self, data: st.DataObject) -> None:
        """The holder of an earlier lease (its token since replaced by a new claim)
        moves the row guarded on its token: Conflict, nothing written."""
        guarded = [c for c in self.token_columns if c in self.policy.guard_columns]
        held = [(r, c) for r in self.live() for c in guarded
                if any(t != r.values.get(c) for t in r.tokens.get(c, ()))]
        if not held:
            return
        row, column = data.draw(st.sampled_from(held), label="fenced row")
        old = data.draw(st.sampled_from([t for t in row.tokens[column]
                                         if t != row.values.get(column)]), label="token")
        move = data.draw(strategies.legal_moves(self.policy, row.state), label="move")
        event("fenced an expired holder")
        self.expect_refusal(row, move.guarded(column, old), Conflict)

    # ------------------------------------------------------------------ invariants

    def _each_entry_deferred_its_tasks_once(self, log: list[dict[str, Any]]) -> None:
        """One run per task per entry into a state that defers tasks, each naming the
        fact that entered it; none for a refused, stale or lost move."""
        from ledgerq.queue.reads import get_runs, list_runs

        policy = self.policy
        wanted = sorted((fact["id"], task) for fact in log
                        if fact["previous_status"] != fact["status"]
                        for task in policy.on_enter.get(fact["status"], ()))
        page = self.run(list_runs(self.db, limit=100_000))
        runs = self.run(get_runs(self.db, [r["id"] for r in page.runs])).values()
        deferred = sorted((r["trigger_context"].get("fact_id"), r["action_kind"]) for r in runs
                          if r["trigger_context"].get("entity") == policy.name)
        assert deferred == wanted, ("deferred", deferred, "entries", wanted)

    @invariant()
    def the_log_and_the_rows_agree(self) -> None:
        """After every step, in one read of this example's rows and their facts: each row
        is the fold of its facts (versions 1, 2, 3, ...); every fact is a declared edge
        with a declared reason and an actor type the entity and the edge allow; each row
        is where the oracle says, at the version counted, holding what its moves patched;
        terminal rows are as first seen."""
        if not self.rows:
            return
        policy, ids = self.policy, list(self.rows)
        rows, log = self.run(self.db.read(lambda tx: (
            tx.read_entities(policy, ids), tx.read_facts_of(policy.name, ids))))
        report = check_rows(policy, rows, log)
        assert report.ok, [str(d) for d in report.drift]
        if policy.on_enter:
            self._each_entry_deferred_its_tasks_once(log)
        facts: dict[str, list[dict[str, Any]]] = {}
        for fact in log:
            facts.setdefault(fact["entity_id"], []).append(fact)
        for got in rows:
            row = self.rows[got["id"]]
            own = facts[row.id]
            assert len(own) == row.version, (row.id, "facts", len(own), "moves", row.version)
            for before, fact in zip([None, *own], own, strict=False):
                src = None if before is None else before["status"]
                assert fact["previous_status"] == src, fact
                if src is None:
                    assert fact["status"] in policy.initial, fact
                else:
                    assert policy.allows(src, fact["status"]), f"undeclared edge: {fact}"
                    rule = policy.rule(src, fact["status"])
                    assert rule.actors is None or fact["source"] in rule.actors, fact
                assert fact["reason_code"] in policy.reason_codes, fact
                assert fact["source"] in policy.actors, fact
            assert got["status"] == row.state, ("the oracle says", row.state, got)
            decoded = self.entity.decode(got)
            patched: dict[str, Any] = {}
            for edge, patch in row.unread:
                patched.update(patch)
                for column in policy.edge_rules[edge].fresh_tokens - set(patch):
                    patched.pop(column, None)  # minted by the engine
                # Cleared by the edge: read back as NULL.
                patched.update(dict.fromkeys(policy.edge_rules[edge].clears - set(patch)))
            for column, value in patched.items():
                assert decoded[column] == value, ("patched", column, value, decoded[column])
            if row.unread:
                row.values = decoded
                self._seen(row, row.unread)
                row.unread.clear()
            elif row.id in self.frozen:
                assert decoded == self.frozen[row.id], f"terminal row {row.id} changed"
            else:
                assert decoded == row.values, ("the row changed with no move", row.values,
                                               decoded)


__all__ = ["LifecycleMachine", "ModelRow"]
