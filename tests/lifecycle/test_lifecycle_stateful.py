"""A hypothesis state machine over every entity of a registry, checked against a
`transitions` reference.

Everything the machine does comes from the registry it is given (:func:`machine_for`):
the entities, the states rows are created in and their reason codes, the values of
every column by its logical type, the edges, actors and allowlists. The packaged specs'
machine runs on SQLite and PostgreSQL; a test adds a state in a temporary spec directory
and sees the machine reach it.

Rows of every entity are created and moved at random: fresh, absent (None) and stale
from_states; declared and undeclared targets; right and wrong guards; allowlisted and
forbidden columns; every actor type; reused idempotency keys; missing rows; two StateDB
connections on one file, sometimes racing for the same row. After every step the log,
the projections and the reference model must agree.

The reference model is built from the same registry with the `transitions` package: one
``transitions.Machine`` per entity whose triggers are exactly ``policy.edges``. It decides
whether an edge exists; the per-edge actor/column rules and the order of the checks are
modelled here, in the order docs/specs.md states them.

Example counts: see tests/conftest.py (profile "ci" by default; LEDGERQ_HYPOTHESIS_PROFILE=long).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from transitions import Machine

from helpers import pg
from ledgerq import StateDB
from ledgerq.codec import loads
from ledgerq.lifecycle import (
    VOCABULARY_ERROR,
    Actor,
    EntityPolicy,
    StateReason,
    TransitionRequest,
    TransitionResult,
    create,
    default_registry,
    transition,
)
from ledgerq.lifecycle.registry import (
    ACTOR_TYPES,
    STANDARD_COLUMNS,
    ColumnPolicy,
    Registry,
    load_registry,
)
from ledgerq.projections import verify

#: A reason code no entity declares (checked when a model is built).
UNDECLARED_CODE = "nobody.declares.this"
MAX_ROWS_PER_ENTITY = 6
# Each example opens a fresh database; on tmpfs (where there is one) that costs a third of
# what it costs on disk. Same SQLite, same WAL and pragmas: only the medium differs.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None

#: Values of each logical column type the machine writes and guards on (a row's
#: not-null columns never get None).
POOLS: dict[str, list[Any]] = {
    "integer": [0, 1, 2],
    "float": [1.5, 2.5, 3.0],
    "timestamp": [1.5, 2.5, 3.0],
    "text": ["w1", "w2"],
    "boolean": [False, True],
    "json": [{"k": 1}, ["a", 2.5, None]],
}
#: What a creation must supply for a not-null column without a default, by logical type.
REQUIRED: dict[str, Any] = {"integer": 1, "float": 1.5, "timestamp": 1.0, "text": "x",
                            "boolean": True, "json": {"k": 1}}


def trigger(dst: str) -> str:
    return f"go_{dst}"


def reference_machine(policy: EntityPolicy) -> Machine:
    """A transitions.Machine whose triggers are exactly the policy's declared edges."""
    edges = [{"trigger": trigger(dst), "source": src, "dest": dst}
             for src, dsts in policy.edges.items() for dst in sorted(dsts)]
    return Machine(model=None, states=list(policy.states), transitions=edges,
                   initial=sorted(policy.initial)[0], auto_transitions=False,
                   ignore_invalid_triggers=False)


def pool(column: ColumnPolicy) -> list[Any]:
    """Values a column may take in this test, by its logical type."""
    if column.references is not None:
        return [None]  # a value would have to be the id of a row of that table
    base = POOLS[column.type]
    return base if column.not_null else [None, *base]


def patch_pool(column: ColumnPolicy) -> list[Any]:
    """Patch values: the pool, plus an integer for a float column (stored as a float).

    A value of another logical type is refused by the engine on both backends (see
    tests/lifecycle/test_transition.py), so it is no move for this machine to make."""
    if column.type in ("float", "timestamp") and column.references is None:
        return [*pool(column), 2]
    return pool(column)


def stored_as(column: ColumnPolicy, value: Any) -> Any:
    """What the row holds for ``value`` (for this test's values): a float column's integer
    is a float. (A boolean reads back as 0/1 on SQLite, equal to False/True.)"""
    if column.type in ("float", "timestamp") and isinstance(value, int) \
            and not isinstance(value, bool):
        return float(value)
    return value


def create_code(policy: EntityPolicy, initial: str) -> str:
    """A reason code to create a row in ``initial`` with: by the spec's convention the
    middle part of a code is the state it moves to; any declared code is accepted."""
    codes = sorted(policy.reason_codes)
    return next((c for c in codes if c.split(".")[1] == initial), codes[0])


def required_values(policy: EntityPolicy) -> dict[str, Any]:
    """What a creation must supply: every not-null column without a default."""
    values = {}
    for name, column in policy.columns.items():
        if name in STANDARD_COLUMNS or not column.not_null or column.default is not None:
            continue
        assert column.references is None, (
            f"{policy.name}.{name}: a required reference the machine cannot fill")
        values[name] = REQUIRED[column.type]
    return values


@dataclass(frozen=True)
class Model:
    """Everything the machine draws from and checks against, built from one registry:
    the entities, their reference Machines, create codes, required values and the
    columns a request must never name."""

    registry: Registry
    entities: tuple[str, ...]
    policies: dict[str, EntityPolicy]
    machines: dict[str, Machine]
    create_codes: dict[tuple[str, str], str]
    required: dict[str, dict[str, Any]]
    forbidden_columns: tuple[str, ...]
    choices: dict[str, st.SearchStrategy[dict[str, Any]]]

    @classmethod
    def build(cls, registry: Registry) -> Model:
        policies = {p.name: p for p in registry.policies()}
        assert all(UNDECLARED_CODE not in p.reason_codes for p in policies.values())
        # The engine's own columns, and one column of each entity that neither allowlist
        # names (beside a column no entity has at all).
        forbidden = ["status", "id", "version", "created_at", "no_such_column"]
        for p in policies.values():
            outside = sorted(set(p.columns) - set(STANDARD_COLUMNS) - p.guard_columns
                             - p.patch_columns)
            forbidden += outside[:1]
        return cls(
            registry=registry,
            entities=tuple(policies),
            policies=policies,
            machines={name: reference_machine(p) for name, p in policies.items()},
            create_codes={(name, s): create_code(p, s)
                          for name, p in policies.items() for s in sorted(p.initial)},
            required={name: required_values(p) for name, p in policies.items()},
            forbidden_columns=tuple(dict.fromkeys(forbidden)),
            choices={name: _choices(p, tuple(dict.fromkeys(forbidden)))
                     for name, p in policies.items()},
        )

    def declared(self, entity: str, src: str, dst: str) -> bool:
        return trigger(dst) in self.machines[entity].get_triggers(src)

    def stored_patch(self, entity: str, patch: dict[str, Any] | None) -> dict[str, Any]:
        columns = self.policies[entity].columns
        return {c: stored_as(columns[c], v) for c, v in (patch or {}).items()}

    def foreign_codes(self, entity: str) -> list[str]:
        """Reason codes ``entity`` does not declare: other entities' and one nobody does."""
        return [*sorted(c for e, p in self.policies.items() if e != entity
                        for c in p.reason_codes), UNDECLARED_CODE]


def tracked_columns(policy: EntityPolicy) -> list[str]:
    return sorted(policy.guard_columns | policy.patch_columns)


@dataclass
class RefRow:
    """The reference model of one row; ``state`` is driven by the entity's Machine."""

    entity: str
    id: str
    cols: dict[str, Any]
    version: int = 1
    keys: dict[str, TransitionResult] = field(default_factory=dict)
    state: str = ""  # set by transitions


@dataclass
class Snap:
    state: str
    cols: dict[str, Any]
    keys: dict[str, TransitionResult]

    def copy(self) -> Snap:
        return Snap(self.state, dict(self.cols), dict(self.keys))


@dataclass
class Attempt:
    request: TransitionRequest
    guard: dict[str, Any] | None
    patch: dict[str, Any] | None
    second: bool  # sent through the second connection


def predict(model: Model, a: Attempt, snap: Snap | None) -> tuple[Any, ...]:
    """transition()'s checks, in order, against the reference model; returns the expected
    outcome."""
    req = a.request
    policy = model.policies.get(req.entity_type)
    if policy is None or req.reason.code not in policy.reason_codes:
        return ("value",)
    if set(a.guard or ()) - policy.guard_columns or set(a.patch or ()) - policy.patch_columns:
        return ("value",)
    if snap is None:
        return ("lookup",)
    key = req.idempotency_key
    if key and key in snap.keys:
        original = snap.keys[key]
        if original.current_state != req.to_state:
            return ("value",)
        return ("replay", original)
    if req.from_state is not None and req.from_state != snap.state:
        return ("conflict", snap.state)
    if not model.declared(req.entity_type, snap.state, req.to_state):
        return ("vocab",)
    rule_ = policy.rule(snap.state, req.to_state)
    if rule_.actors is not None and req.actor.type not in rule_.actors:
        return ("value",)
    if rule_.requires_guard - set(a.guard or ()) or rule_.requires_patch - set(a.patch or ()):
        return ("value",)
    if any(snap.cols[c] != v for c, v in (a.guard or {}).items()):
        return ("conflict", snap.state)
    return ("applied", snap.state, req.to_state)


def advance(model: Model, a: Attempt, snap: Snap, expected: tuple[Any, ...],
            result: TransitionResult | None) -> Snap:
    """The reference state after an outcome (only an applied move changes anything)."""
    if expected[0] != "applied":
        return snap
    nxt = snap.copy()
    nxt.state = expected[2]
    nxt.cols.update(model.stored_patch(a.request.entity_type, a.patch))
    if a.request.idempotency_key and result is not None:
        nxt.keys[a.request.idempotency_key] = result
    return nxt


def matches(expected: tuple[Any, ...], actual: TransitionResult | BaseException) -> bool:
    kind = expected[0]
    if kind in ("value", "vocab"):
        if not isinstance(actual, ValueError):
            return False
        return (VOCABULARY_ERROR in str(actual)) == (kind == "vocab")
    if kind == "lookup":
        return isinstance(actual, LookupError)
    if not isinstance(actual, TransitionResult) or actual.event_id is not None:
        return False
    if kind == "replay":
        return actual == expected[1]
    if kind == "conflict":
        return (not actual.applied and actual.conflict
                and actual.previous_state == actual.current_state == expected[1])
    return (actual.applied and not actual.conflict
            and (actual.previous_state, actual.current_state) == expected[1:])


ACTOR_LIST = sorted(ACTOR_TYPES)
METADATA: list[dict[str, Any]] = [{}, {"attempt": 1}, {"host": "h1", "why": ["a", 2.5, None]},
                                  {"nested": {"k": "ü"}}]
INDEX = st.integers(0, 59)  # an index, taken modulo the length of whatever list it picks from


def _choices(policy: EntityPolicy, forbidden: tuple[str, ...]
             ) -> st.SearchStrategy[dict[str, Any]]:
    """Every random choice one attempt needs, in a shape that depends on the entity only."""
    guard_cols = sorted(policy.guard_columns)
    patch_cols = sorted(policy.patch_columns)
    rare = st.integers(0, 19).map(lambda n: n == 0)
    return st.fixed_dictionaries({
        "observed": INDEX,
        "from_how": st.sampled_from(["fresh"] * 5 + ["none"] * 2 + ["stale"] * 2 + ["odd"]),
        "stale": INDEX,
        "declared_target": st.integers(0, 9).map(lambda n: n < 7),
        "to": INDEX,
        # Independently meet (mostly) an edge's required columns and its actor restriction.
        "satisfy_columns": st.integers(0, 3).map(lambda n: n > 0),
        "satisfy_actor": st.integers(0, 3).map(lambda n: n > 0),
        "guard_cols": (st.sets(st.sampled_from(guard_cols), max_size=2).map(sorted)
                       if guard_cols else st.just([])),
        # two bits per guard column: any set -> the guard carries the row's current value
        "guard_right": st.integers(0, 4 ** len(guard_cols) - 1),
        "patch_cols": (st.sets(st.sampled_from(patch_cols), max_size=3).map(sorted)
                       if patch_cols else st.just([])),
        "values": INDEX,  # column i takes value (values + i) of its pool
        "actor": INDEX,
        "bad_guard_col": rare.flatmap(
            lambda yes: st.sampled_from(forbidden) if yes else st.none()),
        "bad_patch_col": rare.flatmap(
            lambda yes: st.sampled_from(forbidden) if yes else st.none()),
        "code": INDEX,
        "bad_code": rare,
        "key_how": st.sampled_from(["new"] * 6 + ["empty", "reuse", "reuse", "shared"]),
        "key": INDEX,
        "metadata": st.sampled_from(METADATA),
        "second": st.integers(0, 3).map(lambda n: n == 0),
    })


class LifecycleMachine(RuleBasedStateMachine):
    """The machine over every entity of ``model``'s registry: see :func:`machine_for`."""

    backend = "sqlite"
    model: ClassVar[Model]
    #: (entity, state) of every row created or moved, over every example of the class.
    reached: ClassVar[set[tuple[str, str]]]
    #: (entity, from, to) of every applied move, over every example of the class.
    moved: ClassVar[set[tuple[str, str, str]]]

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="ledgerq-stateful-", dir=SCRATCH))
        self.runner = asyncio.Runner()
        path, self.schema = pg.fresh_target(self.backend, str(self.tmp))
        self.db = StateDB(path, registry=self.model.registry)
        self.db2 = StateDB(path, registry=self.model.registry)
        self.runner.run(self.db.open())
        self.runner.run(self.db2.open())
        self.rows: dict[str, RefRow] = {}
        self.frozen: dict[str, dict[str, Any]] = {}  # terminal rows as first seen
        self.applied_moves = 0

    def teardown(self) -> None:
        moves = self.applied_moves
        event("applied moves per example: " + (
            "0" if moves == 0 else "1-4" if moves < 5 else "5-14" if moves < 15 else "15+"))
        try:
            for ref in self.rows.values():
                self.model.machines[ref.entity].remove_model(ref)
            self.runner.run(self.db2.close())
            self.runner.run(self.db.close())
        finally:
            self.runner.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
            pg.drop_target(self.schema)

    def run(self, coro: Any) -> Any:
        return self.runner.run(coro)

    # ------------------------------------------------------------ creation

    def _create(self, entity: str, initial: str, values: dict[str, Any], second: bool) -> None:
        model = self.model
        policy = model.policies[entity]
        cols = {c: pool(policy.columns[c])[0] for c in tracked_columns(policy)}
        cols.update({c: v for c, v in values.items() if c in cols})
        # Required text differs per row: a spec's unique index over it (one deployment in
        # flight per service) must not refuse the machine's second row.
        required = {c: f"{v}-{len(self.rows)}" if isinstance(v, str) else v
                    for c, v in model.required[entity].items()}
        row_values = {**required, **cols, "status": initial}
        db = self.db2 if second else self.db
        rid = self.run(create(db, entity, row_values,
                              reason=StateReason(code=model.create_codes[(entity, initial)]),
                              actor=Actor(type="system", id="creator")))
        ref = RefRow(entity=entity, id=rid, cols=model.stored_patch(entity, cols))
        model.machines[entity].add_model(ref, initial=initial)
        self.rows[rid] = ref
        self.reached.add((entity, initial))

    @initialize()
    def seed(self) -> None:
        # One row of each entity, in its first initial state that can still move (in spec
        # order), alternating connections.
        for i, entity in enumerate(self.model.entities):
            policy = self.model.policies[entity]
            initial = [s for s in policy.states if s in policy.initial]
            first = next((s for s in initial if s not in policy.terminal), initial[0])
            self._create(entity, first, {}, second=i % 2 == 1)

    @rule(data=st.data(), second=st.booleans())
    def create_row(self, data: st.DataObject, second: bool) -> None:
        entity = data.draw(st.sampled_from(self.model.entities), label="entity")
        if sum(r.entity == entity for r in self.rows.values()) >= MAX_ROWS_PER_ENTITY:
            return
        policy = self.model.policies[entity]
        initial = data.draw(st.sampled_from(sorted(policy.initial)), label="initial")
        values = {c: data.draw(st.sampled_from(pool(policy.columns[c])), label=c)
                  for c in sorted(policy.guard_columns)}
        self._create(entity, initial, values, second)

    # ------------------------------------------------------------ requests

    def draw_attempt(self, data: st.DataObject, ref: RefRow | None, entity: str) -> Attempt:
        # One draw with a fixed shape per entity: what is drawn never depends on the
        # model's state (a race's winner is not deterministic), only how it is used.
        c = data.draw(self.model.choices[entity], label="attempt")
        policy = self.model.policies[entity]
        states = list(policy.states)
        observed = ref.state if ref is not None else states[c["observed"] % len(states)]
        from_state = {"fresh": observed, "none": None, "odd": "no_such_state",
                      "stale": states[c["stale"] % len(states)]}[c["from_how"]]
        targets = policy.targets(observed)
        if targets and c["declared_target"]:
            to_state = targets[c["to"] % len(targets)]
        else:
            anything = [*states, "nowhere"]
            to_state = anything[c["to"] % len(anything)]
        edge_rule = policy.edge_rules.get((observed, to_state))

        columns = sorted(policy.guard_columns | policy.patch_columns)

        def value(col: str) -> Any:
            options = pool(policy.columns[col])
            return options[(c["values"] + columns.index(col)) % len(options)]

        def patch_value(col: str) -> Any:
            options = patch_pool(policy.columns[col])
            return options[(c["values"] + columns.index(col)) % len(options)]

        def current(col: str) -> Any:
            return ref.cols[col] if ref is not None else None

        guard_cols = sorted(policy.guard_columns)

        def right(col: str) -> bool:
            return bool(c["guard_right"] >> 2 * guard_cols.index(col) & 3)

        guard = {col: current(col) if right(col) else value(col) for col in c["guard_cols"]}
        patch = {col: patch_value(col) for col in c["patch_cols"]}
        actor_type = ACTOR_LIST[c["actor"] % len(ACTOR_LIST)]
        if edge_rule is not None and c["satisfy_columns"]:
            for col in edge_rule.requires_guard:
                guard.setdefault(col, current(col))
            for col in edge_rule.requires_patch:
                patch.setdefault(col, patch_value(col))
        if edge_rule is not None:
            # The engine mints a token the request omits (random: the model could not
            # predict it); tests/lifecycle/test_engine_boundary.py covers the minting itself.
            for col in edge_rule.fresh_tokens:
                patch.setdefault(col, patch_value(col))
        if edge_rule is not None and edge_rule.actors is not None and c["satisfy_actor"]:
            allowed = sorted(edge_rule.actors)
            actor_type = allowed[c["actor"] % len(allowed)]
        if c["bad_guard_col"] is not None:
            guard[c["bad_guard_col"]] = None
        if c["bad_patch_col"] is not None:
            patch[c["bad_patch_col"]] = "x"

        codes = sorted(policy.reason_codes)
        code = codes[c["code"] % len(codes)]
        if c["bad_code"]:
            foreign = self.model.foreign_codes(entity)
            code = foreign[c["code"] % len(foreign)]

        used = list(ref.keys) if ref is not None else []
        if c["key_how"] == "empty":
            key = ""
        elif c["key_how"] == "reuse" and used:
            key = used[c["key"] % len(used)]
        elif c["key_how"] == "shared":
            key = f"shared-{c['key'] % 2}"
        else:
            key = uuid.uuid4().hex
        request = TransitionRequest(
            entity_type=entity,
            entity_id=ref.id if ref is not None else f"missing-{uuid.uuid4().hex[:8]}",
            from_state=from_state,
            to_state=to_state,
            reason=StateReason(code=code, summary=f"to {to_state}", metadata=c["metadata"]),
            actor=Actor(type=actor_type, id=f"{actor_type}-1"),  # type: ignore[arg-type]
            idempotency_key=key,
        )
        return Attempt(request, guard or None, patch or None, second=c["second"])

    async def _fire(self, a: Attempt) -> TransitionResult | BaseException:
        try:
            return await transition(self.db2 if a.second else self.db, a.request,
                                    guard=a.guard, patch=a.patch)
        except (ValueError, LookupError) as exc:
            return exc

    def _snap(self, ref: RefRow | None) -> Snap | None:
        return None if ref is None else Snap(ref.state, dict(ref.cols), dict(ref.keys))

    def _commit(self, ref: RefRow, moves: list[tuple[Attempt, TransitionResult]]) -> None:
        """Drive the reference Machine through the applied moves (it refuses undeclared ones)."""
        for a, result in moves:
            src = ref.state
            getattr(ref, trigger(a.request.to_state))()
            assert ref.state == a.request.to_state
            ref.cols.update(self.model.stored_patch(ref.entity, a.patch))
            ref.version += 1
            if a.request.idempotency_key:
                ref.keys[a.request.idempotency_key] = result
            self.applied_moves += 1
            self.reached.add((ref.entity, ref.state))
            self.moved.add((ref.entity, src, ref.state))

    def _pick(self, data: st.DataObject, entity: str | None = None) -> RefRow | None:
        candidates = [rid for rid, r in self.rows.items()  # creation order: deterministic
                      if entity is None or r.entity == entity]
        if not candidates or data.draw(st.integers(0, 24), label="missing") == 0:
            return None
        return self.rows[data.draw(st.sampled_from(candidates), label="row")]

    # ------------------------------------------------------------ rules

    @rule(data=st.data())
    def fire(self, data: st.DataObject) -> None:
        ref = self._pick(data)
        entity = (ref.entity if ref is not None
                  else data.draw(st.sampled_from(self.model.entities)))
        a = self.draw_attempt(data, ref, entity)
        expected = predict(self.model, a, self._snap(ref))
        actual = self.run(self._fire(a))
        event(f"fire: {expected[0]}")
        assert matches(expected, actual), (expected, actual, a)
        if expected[0] == "applied":
            assert ref is not None and isinstance(actual, TransitionResult)
            self._check_fact(a, actual)
            self._commit(ref, [(a, actual)])

    @rule(data=st.data())
    def race(self, data: st.DataObject) -> None:
        """Two connections move the same row at once; some serial order must explain both."""
        ref = self._pick(data)
        if ref is None:
            return
        a = self.draw_attempt(data, ref, ref.entity)
        b = self.draw_attempt(data, ref, ref.entity)
        a.second, b.second = False, True

        async def both() -> list[TransitionResult | BaseException]:
            return list(await asyncio.gather(self._fire(a), self._fire(b)))

        got_a, got_b = self.run(both())
        start = self._snap(ref)
        assert start is not None
        explanations = []
        for first, second, r1, r2 in ((a, b, got_a, got_b), (b, a, got_b, got_a)):
            e1 = predict(self.model, first, start)
            mid = advance(self.model, first, start, e1,
                          r1 if isinstance(r1, TransitionResult) else None)
            e2 = predict(self.model, second, mid)
            if matches(e1, r1) and matches(e2, r2):
                moves = [(x, r) for x, e, r in ((first, e1, r1), (second, e2, r2))
                         if e[0] == "applied"]
                explanations.append(moves)
        assert explanations, ("no serial order explains the race", got_a, got_b, a, b)
        # Two orders can explain one outcome when the loser replays the winner's shared
        # idempotency key (both get the winner's result): the log says who won.
        moves = next((m for m in explanations
                      if all(self._fact_matches(x, r) for x, r in m)), explanations[0])
        event(f"race: {len(moves)} applied")
        if len(moves) == 2:
            # Both applied: the log says which went first.
            versions = {
                f["id"]: f["entity_version"] for f in self.run(self.db.fetch_all(
                    "SELECT id, entity_version FROM status_transitions WHERE entity_id = ?",
                    (ref.id,)))
            }
            moves.sort(key=lambda m: versions[m[1].transition_id])
            matching = [m for m in explanations
                        if [x[1].transition_id for x in m] == [x[1].transition_id for x in moves]]
            assert matching, "the log's order is not a serial order the model accepts"
        for attempt, result in moves:
            assert isinstance(result, TransitionResult)
            self._check_fact(attempt, result)
        self._commit(ref, moves)  # type: ignore[arg-type]

    def _fact_matches(self, a: Attempt, result: TransitionResult | BaseException) -> bool:
        if not isinstance(result, TransitionResult):
            return False
        fact = self.run(self.db.fetch_one(
            "SELECT reason_code, actor, patch FROM status_transitions WHERE id = ?",
            (result.transition_id,)))
        if fact is None or (fact["reason_code"], fact["actor"]) != (
                a.request.reason.code, a.request.actor.id):
            return False
        # Two attempts may share code and actor and differ only in what they patch: the
        # fact's patch says whose move it is.
        policy = self.model.policies[a.request.entity_type]
        logged = {c: v for c, v in loads(fact["patch"]).items() if c in policy.patch_columns}
        return logged == self.model.stored_patch(policy.name, a.patch)

    def _check_fact(self, a: Attempt, result: TransitionResult) -> None:
        fact = self.run(self.db.fetch_one("SELECT * FROM status_transitions WHERE id = ?",
                                          (result.transition_id,)))
        assert fact is not None
        assert fact["source"] == a.request.actor.type
        assert fact["actor"] == a.request.actor.id
        assert fact["previous_status"] == result.previous_state
        assert fact["status"] == result.current_state
        assert fact["reason_code"] == a.request.reason.code
        from ledgerq.codec import loads

        assert loads(fact["metadata"]) == a.request.reason.metadata
        assert fact["idempotency_key"] == (a.request.idempotency_key or None)

    # ------------------------------------------------------------ invariants

    @invariant()
    def projection_is_the_fold_of_the_log(self) -> None:
        report = self.run(verify(self.db))
        assert report.ok, [str(d) for d in report.drift]

    @invariant()
    def log_rows_and_model_agree(self) -> None:
        facts = self.run(self.db.fetch_all(
            "SELECT entity_type, entity_id, previous_status, status, entity_version "
            "FROM status_transitions ORDER BY entity_type, entity_id, entity_version"))
        per_entity: dict[str, list[dict[str, Any]]] = {}
        for f in facts:
            per_entity.setdefault(f["entity_id"], []).append(f)
            policy = self.model.policies[f["entity_type"]]
            if f["previous_status"] is None:
                assert f["status"] in policy.initial and f["entity_version"] == 1, f
            else:
                # Every applied move is a declared edge.
                assert self.model.registry.allows(
                    f["entity_type"], f["previous_status"], f["status"]), f
        assert set(per_entity) == set(self.rows)
        for own in per_entity.values():
            assert [f["entity_version"] for f in own] == list(range(1, len(own) + 1))
            for before, after in itertools.pairwise(own):
                assert after["previous_status"] == before["status"]
        for entity in self.model.entities:
            policy = self.model.policies[entity]
            for got in self.run(self.db.fetch_all(f"SELECT * FROM {policy.table}")):
                ref = self.rows[got["id"]]
                # version == number of facts == the model's count.
                assert got["version"] == len(per_entity[got["id"]]) == ref.version
                assert got["status"] == ref.state
                # fetch_all hands back SQLite's JSON as its text, PostgreSQL's as the value.
                assert {c: loads(got[c]) if c in policy.json_columns and isinstance(got[c], str)
                        else got[c] for c in ref.cols} == ref.cols
                if got["status"] in policy.terminal:
                    # Terminal rows never change once seen terminal.
                    assert self.frozen.setdefault(got["id"], got) == got

    @invariant()
    def reference_machine_agrees_with_registry(self) -> None:
        for ref in self.rows.values():
            policy = self.model.policies[ref.entity]
            triggers = set(self.model.machines[ref.entity].get_triggers(ref.state))
            assert triggers == {trigger(d) for d in policy.edges[ref.state]}
            assert (not triggers) == (ref.state in policy.terminal)


def machine_for(registry: Registry, *, backend: str = "sqlite",
                name: str = "RegistryLifecycleMachine") -> type[LifecycleMachine]:
    """The machine over every entity ``registry`` holds: its rules, values and reference
    Machines all come from the registry, so a state or entity added to a spec is explored
    (and checked) without a change here."""
    attrs = {"backend": backend, "model": Model.build(registry), "reached": set(),
             "moved": set(), "__doc__": LifecycleMachine.__doc__}
    return type(name, (LifecycleMachine,), attrs)


# TestCase.settings inherit max_examples and stateful_step_count from the profile that
# tests/conftest.py loads before this module is imported.
PackagedLifecycleMachine = machine_for(default_registry(), name="PackagedLifecycleMachine")
test_lifecycle_state_machine = PackagedLifecycleMachine.TestCase

#: The same machine on PostgreSQL: two handles (two connection pools) on one schema
#: (emptied per example); fewer examples, since each costs more
#: (LEDGERQ_STATEFUL_PG_EXAMPLES overrides).
PostgresLifecycleMachine = machine_for(default_registry(), backend="postgresql",
                                       name="PostgresLifecycleMachine")

_default = settings.default
assert _default is not None
PostgresLifecycleMachine.TestCase.settings = settings(
    _default, max_examples=int(os.environ.get("LEDGERQ_STATEFUL_PG_EXAMPLES", "40")),
    suppress_health_check=[*_default.suppress_health_check, HealthCheck.large_base_example])
test_lifecycle_state_machine_postgres = PostgresLifecycleMachine.TestCase


#: A small entity of its own (a spec file in a temporary directory), and the state a
#: contributor adds to it: the machine must reach it, and leave it, with no change to
#: this file. Small, so that the machine's moves land on the new state often: over the
#: packaged run entity (eight targets from running, most attempts refused on purpose)
#: reaching a new state took minutes on a loaded machine.
GADGET = """
entity = "gadget"
table = "gadgets"
initial = ["new"]
terminal = ["done"]
guard_columns = ["note"]
patch_columns = ["note"]

[states.new]
description = "Just made."
[states.done]
description = "Finished."

[[edges]]
from = "new"
to = ["done"]

[reason_codes]
"gadget.new.made" = "Made."
"gadget.done.finished" = "Finished."

[columns]
note = "text"
"""
PAUSED_STATE = """
[states.paused]
description = "Set aside; finished later."

[[edges]]
from = "new"
to = ["paused"]

[[edges]]
from = "paused"
to = ["new", "done"]
"""
PAUSED_CODES = """\
"gadget.paused.aside" = "Set aside."
"gadget.new.resumed" = "Taken up again."
"""


def test_the_machine_follows_the_specs_it_is_given(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    spec = specs / "gadget.toml"
    spec.write_text(GADGET, encoding="utf-8")
    before = load_registry(specs)
    assert "paused" not in before.entity("gadget").states
    # The state and edges beside the others, the codes under the existing [reason_codes].
    spec.write_text(GADGET.replace("[reason_codes]\n",
                                   PAUSED_STATE + "\n[reason_codes]\n" + PAUSED_CODES, 1),
                    encoding="utf-8")
    registry = load_registry(specs)
    assert registry.allows("gadget", "new", "paused")

    machine = machine_for(registry, name="PausedLifecycleMachine")
    assert "paused" in machine.model.machines["gadget"].states
    into = ("gadget", "new", "paused")
    out_of = {("gadget", "paused", "new"), ("gadget", "paused", "done")}
    # Batches of ten examples (every invariant checked after every step, as always) until
    # the machine has moved a row into paused and out again; the cap makes a machine that
    # never gets there fail in bounded time.
    batch = settings(settings.default, max_examples=10, stateful_step_count=30,
                     database=None, suppress_health_check=list(HealthCheck))
    for _ in range(20):
        run_state_machine_as_test(machine, settings=batch)
        if into in machine.moved and out_of & machine.moved:
            break
    assert ("gadget", "paused") in machine.reached
    assert into in machine.moved
    assert out_of & machine.moved, "the machine reached paused but never left it"
    # The packaged machine knows no such entity.
    assert "gadget" not in PackagedLifecycleMachine.model.policies
