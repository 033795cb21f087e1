"""A hypothesis state machine over both entities, checked against a `transitions` reference.

Rows of both entities are created and moved at random: fresh, absent (None) and stale
from_states; declared and undeclared targets; right and wrong guards; allowlisted and
forbidden columns; every actor type; reused idempotency keys; missing rows; two StateDB
connections on one file, sometimes racing for the same row. After every step the log,
the projections and the reference model must agree.

The reference model is built from the same registry with the `transitions` package: one
``transitions.Machine`` per entity whose triggers are exactly ``policy.edges``. It decides
whether an edge exists; the per-edge actor/column rules and the D3 ordering are modelled
here, in the order DESIGN.md states them.

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
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
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
from ledgerq.lifecycle.registry import ACTOR_TYPES
from ledgerq.projections import verify
from ledgerq.store.sqlite.schema import column_ddl

REGISTRY = default_registry()
ENTITIES = ("schedule_run", "dispatch")
POLICIES = {name: REGISTRY.entity(name) for name in ENTITIES}
CREATE_CODE = {
    ("schedule_run", "queued"): "run.queued.submitted",
    ("schedule_run", "waiting_dependency"): "run.waiting_dependency.submitted",
    ("schedule_run", "running"): "run.started.scheduled",
    ("schedule_run", "failed"): "run.failed.scheduled",
    ("schedule_run", "skipped"): "run.skipped.scheduled",
    ("dispatch", "pending"): "dispatch.pending.created",
}
REQUIRED_VALUES = {
    "schedule_run": {"trigger_context": {"k": 1}, "action_kind": "shell",
                     "action_args": ["true"], "fired_at": 1.0},
    "dispatch": {"channel": "sms", "payload": {"body": "hi"}},
}
FORBIDDEN_COLUMNS = ("status", "id", "version", "created_at", "action_kind", "channel")
MAX_ROWS_PER_ENTITY = 6
# Each example opens a fresh database; on tmpfs (where there is one) that costs a third of
# what it costs on disk. Same SQLite, same WAL and pragmas: only the medium differs.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def trigger(dst: str) -> str:
    return f"go_{dst}"


def reference_machine(policy: EntityPolicy) -> Machine:
    """A transitions.Machine whose triggers are exactly the policy's declared edges."""
    edges = [{"trigger": trigger(dst), "source": src, "dest": dst}
             for src, dsts in policy.edges.items() for dst in sorted(dsts)]
    return Machine(model=None, states=list(policy.states), transitions=edges,
                   initial=sorted(policy.initial)[0], auto_transitions=False,
                   ignore_invalid_triggers=False)


MACHINES = {name: reference_machine(p) for name, p in POLICIES.items()}


def declared(entity: str, src: str, dst: str) -> bool:
    return trigger(dst) in MACHINES[entity].get_triggers(src)


def pool(decl: str) -> list[Any]:
    """Values a column may take in this test, by its declared SQL type."""
    d = decl.upper()
    if "REFERENCES" in d:
        return [None]
    if d.startswith("INTEGER"):
        base: list[Any] = [0, 1, 2]
    elif d.startswith("REAL"):
        base = [1.5, 2.5, 3.0]
    else:
        base = ["w1", "w2"]
    return base if "NOT NULL" in d else [None, *base]


def patch_pool(decl: str) -> list[Any]:
    """Patch values: the pool, plus an integer for a float column (stored as a float).

    A value of another logical type is refused by the engine on both backends (see
    tests/test_transition.py), so it is no move for this machine to make."""
    d = decl.upper()
    if "REFERENCES" in d:
        return [None]
    return [*pool(decl), 2] if d.startswith("REAL") else pool(decl)


def stored_as(decl: str, value: Any) -> Any:
    """What SQLite keeps for ``value`` in a column declared ``decl`` (for this test's values)."""
    d = decl.upper()
    if value is None:
        return None
    if d.startswith("INTEGER") and isinstance(value, str):
        return int(value)
    if d.startswith("REAL") and isinstance(value, str | int):
        return float(value)
    if d.startswith("TEXT") and isinstance(value, int | float):
        return str(value)
    return value


def stored_patch(policy: EntityPolicy, patch: dict[str, Any] | None) -> dict[str, Any]:
    return {c: stored_as(column_ddl(policy.columns[c]), v) for c, v in (patch or {}).items()}


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


def predict(a: Attempt, snap: Snap | None) -> tuple[Any, ...]:
    """D3, in order, against the reference model; returns the expected outcome."""
    req = a.request
    policy = POLICIES.get(req.entity_type)
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
    if not declared(req.entity_type, snap.state, req.to_state):
        return ("vocab",)
    rule_ = policy.rule(snap.state, req.to_state)
    if rule_.actors is not None and req.actor.type not in rule_.actors:
        return ("value",)
    if rule_.requires_guard - set(a.guard or ()) or rule_.requires_patch - set(a.patch or ()):
        return ("value",)
    if any(snap.cols[c] != v for c, v in (a.guard or {}).items()):
        return ("conflict", snap.state)
    return ("applied", snap.state, req.to_state)


def advance(a: Attempt, snap: Snap, expected: tuple[Any, ...],
            result: TransitionResult | None) -> Snap:
    """The reference state after an outcome (only an applied move changes anything)."""
    if expected[0] != "applied":
        return snap
    nxt = snap.copy()
    nxt.state = expected[2]
    nxt.cols.update(stored_patch(POLICIES[a.request.entity_type], a.patch))
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


def _other(entity: str) -> str:
    return next(e for e in ENTITIES if e != entity)


def _choices(policy: EntityPolicy) -> st.SearchStrategy[dict[str, Any]]:
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
        "guard_cols": st.sets(st.sampled_from(guard_cols), max_size=2).map(sorted),
        # two bits per guard column: any set -> the guard carries the row's current value
        "guard_right": st.integers(0, 4 ** len(guard_cols) - 1),
        "patch_cols": st.sets(st.sampled_from(patch_cols), max_size=3).map(sorted),
        "values": INDEX,  # column i takes value (values + i) of its pool
        "actor": INDEX,
        "bad_guard_col": rare.flatmap(
            lambda yes: st.sampled_from(FORBIDDEN_COLUMNS) if yes else st.none()),
        "bad_patch_col": rare.flatmap(
            lambda yes: st.sampled_from(FORBIDDEN_COLUMNS) if yes else st.none()),
        "code": INDEX,
        "bad_code": rare,
        "key_how": st.sampled_from(["new"] * 6 + ["empty", "reuse", "reuse", "shared"]),
        "key": INDEX,
        "metadata": st.sampled_from(METADATA),
        "second": st.integers(0, 3).map(lambda n: n == 0),
    })


CHOICES = {name: _choices(p) for name, p in POLICIES.items()}


class LifecycleMachine(RuleBasedStateMachine):
    backend = "sqlite"
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="ledgerq-stateful-", dir=SCRATCH))
        self.runner = asyncio.Runner()
        path, self.schema = pg.fresh_target(self.backend, str(self.tmp))
        self.db = StateDB(path)
        self.db2 = StateDB(path)
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
                MACHINES[ref.entity].remove_model(ref)
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
        policy = POLICIES[entity]
        cols = {c: pool(column_ddl(policy.columns[c]))[0] for c in tracked_columns(policy)}
        cols.update({c: v for c, v in values.items() if c in cols})
        row_values = {**REQUIRED_VALUES[entity], **cols, "status": initial}
        db = self.db2 if second else self.db
        rid = self.run(create(db, entity, row_values,
                              reason=StateReason(code=CREATE_CODE[(entity, initial)]),
                              actor=Actor(type="system", id="creator")))
        ref = RefRow(entity=entity, id=rid, cols=cols)
        MACHINES[entity].add_model(ref, initial=initial)
        self.rows[rid] = ref

    @initialize()
    def seed(self) -> None:
        self._create("schedule_run", "queued", {}, second=False)
        self._create("dispatch", "pending", {}, second=True)

    @rule(data=st.data(), entity=st.sampled_from(ENTITIES), second=st.booleans())
    def create_row(self, data: st.DataObject, entity: str, second: bool) -> None:
        if sum(r.entity == entity for r in self.rows.values()) >= MAX_ROWS_PER_ENTITY:
            return
        policy = POLICIES[entity]
        initial = data.draw(st.sampled_from(sorted(policy.initial)), label="initial")
        values = {c: data.draw(st.sampled_from(pool(column_ddl(policy.columns[c]))), label=c)
                  for c in sorted(policy.guard_columns)}
        self._create(entity, initial, values, second)

    # ------------------------------------------------------------ requests

    def draw_attempt(self, data: st.DataObject, ref: RefRow | None, entity: str) -> Attempt:
        # One draw with a fixed shape per entity: what is drawn never depends on the
        # model's state (a race's winner is not deterministic), only how it is used.
        c = data.draw(CHOICES[entity], label="attempt")
        policy = POLICIES[entity]
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
            options = pool(column_ddl(policy.columns[col]))
            return options[(c["values"] + columns.index(col)) % len(options)]

        def patch_value(col: str) -> Any:
            options = patch_pool(column_ddl(policy.columns[col]))
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
            # predict it); tests/test_engine_boundary.py covers the minting itself.
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
            foreign = [*sorted(POLICIES[_other(entity)].reason_codes), "run.x.y"]
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
            getattr(ref, trigger(a.request.to_state))()
            assert ref.state == a.request.to_state
            ref.cols.update(stored_patch(POLICIES[ref.entity], a.patch))
            ref.version += 1
            if a.request.idempotency_key:
                ref.keys[a.request.idempotency_key] = result
            self.applied_moves += 1

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
        entity = ref.entity if ref is not None else data.draw(st.sampled_from(ENTITIES))
        a = self.draw_attempt(data, ref, entity)
        expected = predict(a, self._snap(ref))
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
            e1 = predict(first, start)
            mid = advance(first, start, e1, r1 if isinstance(r1, TransitionResult) else None)
            e2 = predict(second, mid)
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
        policy = POLICIES[a.request.entity_type]
        logged = {c: v for c, v in loads(fact["patch"]).items() if c in policy.patch_columns}
        return logged == stored_patch(policy, a.patch)

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
            policy = POLICIES[f["entity_type"]]
            if f["previous_status"] is None:
                assert f["status"] in policy.initial and f["entity_version"] == 1, f
            else:
                # Every applied move is a declared edge.
                assert REGISTRY.allows(f["entity_type"], f["previous_status"], f["status"]), f
        assert set(per_entity) == set(self.rows)
        for own in per_entity.values():
            assert [f["entity_version"] for f in own] == list(range(1, len(own) + 1))
            for before, after in itertools.pairwise(own):
                assert after["previous_status"] == before["status"]
        for entity in ENTITIES:
            policy = POLICIES[entity]
            for got in self.run(self.db.fetch_all(f"SELECT * FROM {policy.table}")):
                ref = self.rows[got["id"]]
                # version == number of facts == the model's count.
                assert got["version"] == len(per_entity[got["id"]]) == ref.version
                assert got["status"] == ref.state
                assert {c: got[c] for c in ref.cols} == ref.cols
                if got["status"] in policy.terminal:
                    # Terminal rows never change once seen terminal.
                    assert self.frozen.setdefault(got["id"], got) == got

    @invariant()
    def reference_machine_agrees_with_registry(self) -> None:
        for ref in self.rows.values():
            policy = POLICIES[ref.entity]
            triggers = set(MACHINES[ref.entity].get_triggers(ref.state))
            assert triggers == {trigger(d) for d in policy.edges[ref.state]}
            assert (not triggers) == (ref.state in policy.terminal)


# TestCase.settings inherit max_examples and stateful_step_count from the profile that
# tests/conftest.py loads before this module is imported.
test_lifecycle_state_machine = LifecycleMachine.TestCase


class PostgresLifecycleMachine(LifecycleMachine):
    """The same machine on PostgreSQL: two handles (two connection pools) on one fresh
    schema per example; fewer examples, since each costs a schema's DDL
    (LEDGERQ_STATEFUL_PG_EXAMPLES overrides)."""

    backend = "postgresql"


_default = settings.default
assert _default is not None
PostgresLifecycleMachine.TestCase.settings = settings(
    _default, max_examples=int(os.environ.get("LEDGERQ_STATEFUL_PG_EXAMPLES", "40")),
    suppress_health_check=[*_default.suppress_health_check, HealthCheck.large_base_example])
test_lifecycle_state_machine_postgres = PostgresLifecycleMachine.TestCase
