"""A hypothesis state machine that evolves a spec under a live database.

Between runs of creates and moves, the machine changes the spec of one entity at
random: it adds a state, an edge or a column (opening migrates them), attempts to
remove a state with ``migrate`` (with or without a mapping for its rows), and attempts
changes no version order explains (a terminal state given an edge, a column retyped
while it holds values). After every step:

* projection == fold(log) (``verify``), and every row is where the model says;
* no row is in a state the database's recorded spec does not declare;
* the recorded spec is the one the model expects (the union after an additive open,
  exactly the target after an apply, unchanged after a refusal);
* a refusal changed nothing: the schema and every row are as before.

Runs on SQLite and on PostgreSQL (a fresh schema per example).
"""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from evolution_support import snapshot
from helpers import pg
from ledgerq import StateDB
from ledgerq.errors import MigrationRefused
from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, create, evolution, transition
from ledgerq.lifecycle.evolution import Normal, StateMapping
from ledgerq.lifecycle.registry import Registry, build_policy
from ledgerq.lifecycle.spec import ColumnSpec, EntitySpec, SpecError, StateSpec
from ledgerq.projections import verify

ENTITY = "gizmo"
ACTOR = Actor(type="operator", id="machine")
VALUES = {"text": st.text(alphabet="abc xyz", max_size=5), "integer": st.integers(-5, 5),
          "json": st.lists(st.integers(0, 3), max_size=2)}


def codes_for(states: list[str]) -> dict[str, str]:
    out = {}
    for s in states:
        out[f"g.{s}.go"] = f"Into {s}."
        out[f"g.{s}.migrated"] = f"Moved into {s} by a migration."
    return out


def start_spec() -> Normal:
    states = ["a", "b", "done"]
    return evolution.normalize(msgspec.convert({
        "entity": ENTITY, "table": "gizmos", "states": {s: {"description": s} for s in states},
        "initial": ["a"], "terminal": ["done"], "reason_codes": codes_for(states),
        "edges": [{"from": "a", "to": ["b", "done"]}, {"from": "b", "to": ["done"]}],
        "columns": {"note": "text"}, "patch_columns": ["note"]}, type=EntitySpec))


def _state(name: str) -> dict[str, Any]:
    """A state as a normalized spec holds it (a field left at its default is left out)."""
    return {k: v for k, v in msgspec.to_builtins(StateSpec(description=name)).items()
            if k != "on_enter"}


def _column(kind: str, default: Any) -> dict[str, Any]:
    return dict(msgspec.to_builtins(ColumnSpec(type=kind, not_null=default is not None,
                                               default=default)))


def _edge(a: str, b: str) -> dict[str, Any]:
    return evolution.normalize(msgspec.convert({
        "entity": "e", "table": "t", "states": {}, "initial": [], "terminal": [],
        "reason_codes": {}, "edges": [{"from": a, "to": [b]}]}, type=EntitySpec))["edges"][0]


def registry_of(normal: Normal) -> Registry | None:
    """The registry of one candidate spec, or None when it is not a valid spec."""
    try:
        return Registry([build_policy(msgspec.convert(normal, type=EntitySpec), "machine")])
    except (SpecError, msgspec.ValidationError):
        return None


class EvolvingSpec(RuleBasedStateMachine):
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="ledgerq-evolve-"))
        self.runner = asyncio.Runner()
        self.schema: str | None = None
        if self.backend == "sqlite":
            self.target = str(self.tmp / "evolve.db")
        else:
            self.schema = f"evolve_{os.getpid()}_{uuid.uuid4().hex[:8]}"
            self.target = pg.create_schema(pg.session_database(), self.schema)
        self.spec = start_spec()  # what the processes run with
        self.recorded = copy.deepcopy(self.spec)  # what the database should record
        self.rows: dict[str, str] = {}
        self.db: StateDB | None = None
        self.counter = 0

    def run(self, coro: Any) -> Any:
        return self.runner.run(coro)

    def teardown(self) -> None:
        try:
            if self.db is not None:
                self.run(self.db.close())
        finally:
            self.runner.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
            if self.schema is not None:
                pg.drop_schema(pg.session_database(), self.schema)

    def reopen(self, spec: Normal, **kw: Any) -> None:
        registry = registry_of(spec)
        assert registry is not None
        if self.db is not None:
            self.run(self.db.close())
            self.db = None
        db = StateDB(self.target, registry=registry, **kw)
        self.run(db.open())
        self.db = db

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # ------------------------------------------------------------ rows

    @initialize()
    def open_first(self) -> None:
        self.reopen(self.spec)

    @rule(note=VALUES["text"])
    def create_row(self, note: str) -> None:
        assert self.db is not None
        rid = self.run(create(self.db, ENTITY, {"status": "a", "note": note},
                              reason=StateReason(code="g.a.go"), actor=ACTOR))
        self.rows[rid] = "a"

    @precondition(lambda self: bool(self.rows))
    @rule(data=st.data())
    def move_row(self, data: st.DataObject) -> None:
        assert self.db is not None
        rid = data.draw(st.sampled_from(sorted(self.rows)))
        here = self.rows[rid]
        targets = sorted(e["to"][0] for e in self.spec["edges"] if e["from"] == here)
        if here not in self.spec["states"] or not targets:
            event("row in a terminal or unknown state")
            return
        there = data.draw(st.sampled_from(targets))
        patch: dict[str, Any] = {}
        for col in self.spec["patch_columns"]:
            if data.draw(st.booleans()):
                patch[col] = data.draw(VALUES[self.spec["columns"][col]["type"]])
        done = self.run(transition(self.db, TransitionRequest(
            entity_type=ENTITY, entity_id=rid, from_state=here, to_state=there,
            reason=StateReason(code=f"g.{there}.go"), actor=ACTOR,
            idempotency_key=uuid.uuid4().hex), patch=patch))
        assert done.applied
        self.rows[rid] = there

    # ------------------------------------------------------------ additive changes

    def grow(self, spec: Normal) -> None:
        """Open with ``spec``, a superset of the recorded one: it migrates."""
        self.reopen(spec)
        assert self.db is not None and self.db.migration is not None
        self.spec = spec
        self.recorded = evolution.merge(self.recorded, spec)
        event("migrated on open")

    @rule(data=st.data())
    def add_state(self, data: st.DataObject) -> None:
        spec = copy.deepcopy(self.spec)
        name = self.fresh("s")
        live = sorted(s for s in spec["states"] if s not in spec["terminal"])
        src = data.draw(st.sampled_from(live))
        dst = data.draw(st.sampled_from(sorted(spec["terminal"])))
        spec["states"][name] = _state(name)
        spec["edges"] = sorted([*spec["edges"], _edge(src, name), _edge(name, dst)],
                               key=lambda e: (e["from"], e["to"][0]))
        spec["reason_codes"] = dict(sorted({**spec["reason_codes"],
                                            **codes_for([name])}.items()))
        self.grow(spec)

    @rule(data=st.data())
    def add_edge(self, data: st.DataObject) -> None:
        spec = copy.deepcopy(self.spec)
        live = sorted(s for s in spec["states"] if s not in spec["terminal"])
        src = data.draw(st.sampled_from(live))
        dst = data.draw(st.sampled_from(sorted(spec["states"])))
        if any(e["from"] == src and e["to"] == [dst] for e in spec["edges"]):
            return
        spec["edges"] = sorted([*spec["edges"], _edge(src, dst)],
                               key=lambda e: (e["from"], e["to"][0]))
        self.grow(spec)

    @rule(kind=st.sampled_from(sorted(VALUES)), default=st.booleans())
    def add_column(self, kind: str, default: bool) -> None:
        spec = copy.deepcopy(self.spec)
        name = self.fresh("c")
        value = {"text": "x", "integer": 7}.get(kind) if default else None
        spec["columns"][name] = _column(kind, value)
        spec["columns"] = dict(sorted(spec["columns"].items()))
        spec["patch_columns"] = sorted([*spec["patch_columns"], name])
        self.grow(spec)

    # ------------------------------------------------------------ removals and refusals

    def refused(self, attempt: Any) -> None:
        """``attempt`` must raise MigrationRefused and change nothing."""
        assert self.db is not None
        before = self.run(snapshot(self.db))
        try:
            attempt()
        except MigrationRefused:
            event("refused")
        else:
            raise AssertionError("expected MigrationRefused")
        self.reopen(self.spec)
        assert self.db is not None
        assert self.run(snapshot(self.db)) == before

    @rule(data=st.data(), mapped=st.booleans())
    def remove_state(self, data: st.DataObject, mapped: bool) -> None:
        spec = copy.deepcopy(self.spec)
        candidates = sorted(s for s in spec["states"] if s not in ("a", "done"))
        if not candidates:
            return
        gone = data.draw(st.sampled_from(candidates))
        del spec["states"][gone]
        spec["edges"] = [e for e in spec["edges"] if gone not in (e["from"], e["to"][0])]
        for key in ("initial", "terminal"):
            spec[key] = [s for s in spec[key] if s != gone]
        if registry_of(spec) is None:
            event("removal leaves an invalid graph")
            return
        occupied = any(s == gone for s in self.rows.values())
        live = sorted(s for s in spec["states"] if s not in spec["terminal"])
        mapping = [StateMapping(ENTITY, gone, data.draw(st.sampled_from(live)))] \
            if mapped and gone not in self.recorded["terminal"] else []
        self.reopen(spec, migrate_on_open=False)
        assert self.db is not None
        if occupied and not mapping:
            self.refused(lambda: self.run(self.db.migrate()))  # type: ignore[union-attr]
            return
        self.run(self.db.migrate(mapping))
        for rid, state in self.rows.items():
            if state == gone:
                self.rows[rid] = mapping[0].target
        self.spec = spec
        self.recorded = copy.deepcopy(spec)
        event("removed a state" + (" with its rows mapped" if occupied else ""))

    @rule(data=st.data())
    def give_a_terminal_state_an_edge(self, data: st.DataObject) -> None:
        spec = copy.deepcopy(self.spec)
        ended = data.draw(st.sampled_from(sorted(spec["terminal"])))
        dst = data.draw(st.sampled_from(sorted(spec["states"])))
        spec["terminal"] = [s for s in spec["terminal"] if s != ended]
        spec["edges"].append(_edge(ended, dst))
        if not spec["terminal"] or registry_of(spec) is None:
            return
        self.refused(lambda: self.reopen(spec))

    @rule(data=st.data())
    def retype_a_column_with_data(self, data: st.DataObject) -> None:
        assert self.db is not None
        spec = copy.deepcopy(self.spec)
        held = [c for c in sorted(spec["columns"]) if self.run(self.db.fetch_one(
            f'SELECT count(*) AS n FROM gizmos WHERE "{c}" IS NOT NULL'))["n"]]
        if not held:
            return
        col = data.draw(st.sampled_from(held))
        old = spec["columns"][col]["type"]
        spec["columns"][col] = {**spec["columns"][col], "default": None, "not_null": False,
                                "type": "integer" if old != "integer" else "text"}
        self.refused(lambda: self.reopen(spec))

    # ------------------------------------------------------------ invariants

    @invariant()
    def projection_is_the_fold_of_the_log(self) -> None:
        if self.db is None:
            return
        report = self.run(verify(self.db))
        assert report.ok, report.drift[:3]
        stored = {r["id"]: r["status"] for r in self.run(self.db.fetch_all(
            "SELECT id, status FROM gizmos"))}
        assert stored == self.rows

    @invariant()
    def every_row_is_in_a_recorded_state_and_the_record_is_expected(self) -> None:
        if self.db is None:
            return
        recorded = self.db.recorded[ENTITY]
        assert set(self.rows.values()) <= set(recorded["states"])
        assert evolution.spec_hash(recorded) == evolution.spec_hash(self.recorded), \
            evolution.diff(self.recorded, recorded)


EvolvingSpec.TestCase.settings = settings(
    max_examples=int(os.environ.get("LEDGERQ_EVOLVE_EXAMPLES", "25")),
    stateful_step_count=25, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_spec_evolution_machine = EvolvingSpec.TestCase


class PostgresEvolvingSpec(EvolvingSpec):
    backend = "postgresql"


PostgresEvolvingSpec.TestCase.settings = settings(
    max_examples=int(os.environ.get("LEDGERQ_EVOLVE_EXAMPLES", "12")),
    stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_spec_evolution_machine_postgres = PostgresEvolvingSpec.TestCase
