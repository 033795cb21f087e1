"""The packaged entities' stateful tests, on the testing kit (``ledgerq.testing``).

Each packaged entity gets the machine a user's entity gets
(``LifecycleMachine.for_entity``: legal, illegal, stale and racing moves, the log and
the rows checked after every step against a ``transitions`` model of the spec), plus the
rules below, which exercise what the kit's user-facing moves do not: the engine's own
request API (``transition()`` with no expected state, or a stale one), and idempotency
keys replayed from a second handle.

With Hypothesis' default settings each machine applies every edge its spec declares
(asserted: the kit steers toward edges not applied yet). On PostgreSQL each example
gets a schema of its own; fewer examples there, with a fixed seed, since each costs more.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule, run_state_machine_as_test

from ledgerq.errors import IdempotencyConflict
from ledgerq.lifecycle import TransitionRequest, TransitionResult, transition
from ledgerq.lifecycle.registry import load_registry
from ledgerq.testing import LifecycleMachine, strategies
from lifecycle_support import with_dispatch

PACKAGED = ["schedule_run", "schedule", "dispatch"]
#: What a user's run of a machine has: Hypothesis' defaults (100 examples of up to 50
#: steps), no example database (CI starts clean) and no deadline (a step is I/O).
DEFAULT = settings(settings.get_profile("default"), deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow])
POSTGRES = settings(DEFAULT, max_examples=20, derandomize=True)


class ProjectRules(LifecycleMachine):
    """The kit's machine, and the engine's request API beside the entity handle's."""

    @rule(data=st.data(), how=st.sampled_from(["unnamed", "stale"]))
    def engine_request(self, data: st.DataObject, how: str) -> None:
        """``transition()`` naming no expected state applies from wherever the row is;
        naming a stale one is a conflict result (not an exception), nothing written."""
        row = self.pick(data, live=True)
        if row is None:
            return
        move = data.draw(strategies.legal_moves(self.policy, row.state), label="move")
        others = [s for s in self.policy.states if s != row.state]
        expected = None if how == "unnamed" else data.draw(st.sampled_from(others),
                                                           label="stale state")
        arguments = move.arguments(row.values)
        request = TransitionRequest(
            entity_type=self.policy.name, entity_id=row.id, from_state=expected,
            to_state=move.to_state, reason=move.reason, actor=move.actor,
            idempotency_key=uuid.uuid4().hex)
        got = self.run(transition(self.db2, request, guard=arguments["guard"],
                                  patch=arguments["patch"]))
        if expected is None:
            assert got.applied and got.current_state == move.to_state, got
            self._record(row, move)
        else:
            assert got.conflict and not got.applied, got
            assert got.current_state == row.state, got

    @rule(data=st.data())
    def replayed_key(self, data: st.DataObject) -> None:
        """A move repeated under its idempotency key (from the other handle, after the
        row moved on) returns the first result and writes nothing; the key asked to take
        the row elsewhere is refused."""
        row = self.pick(data, live=True)
        if row is None:
            return
        move = data.draw(strategies.legal_moves(self.policy, row.state), label="move")
        key = f"k-{row.version}"
        arguments = move.arguments(row.values)
        first: TransitionResult = self.run(self.entity.move(
            row.id, idempotency_key=key, expect=row.state, **arguments))
        self._record(row, move)
        again = self.run(self.other.move(row.id, idempotency_key=key, **arguments))
        assert again == first, (first, again)
        elsewhere = [s for s in self.policy.states if s != move.to_state]
        other_target = data.draw(st.sampled_from(elsewhere), label="other target")
        with pytest.raises(IdempotencyConflict):
            self.run(self.other.move(row.id, idempotency_key=key, **{
                **arguments, "to_state": other_target}))


def machine(entity: str, **options: str) -> type[ProjectRules]:
    return ProjectRules.for_entity(entity, registry=with_dispatch(), **options)


@pytest.mark.parametrize("entity", PACKAGED)
def test_packaged_entity_machine(entity: str) -> None:
    tested = machine(entity)
    run_state_machine_as_test(tested, settings=DEFAULT)
    assert tested.applied == set(tested.policy.edge_rules), (
        "edges never applied", set(tested.policy.edge_rules) - tested.applied)


@pytest.mark.parametrize("entity", PACKAGED)
def test_packaged_entity_machine_on_postgres(entity: str, pg_database: str) -> None:
    """The same rules on PostgreSQL, where the two handles truly race (coverage is the
    steering's, checked on SQLite: fewer examples here may leave an edge out)."""
    run_state_machine_as_test(machine(entity, target=pg_database), settings=POSTGRES)


#: A small entity of its own, and the state a contributor adds to it: the machine
#: reaches and leaves the new state with no change to any test.
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
    assert "paused" not in load_registry(specs).entity("gadget").states
    spec.write_text(GADGET.replace("[reason_codes]\n",
                                   PAUSED_STATE + "\n[reason_codes]\n" + PAUSED_CODES, 1),
                    encoding="utf-8")
    tested = ProjectRules.for_entity("gadget", registry=load_registry(specs))
    run_state_machine_as_test(tested, settings=settings(DEFAULT, max_examples=20))
    assert {("new", "paused"), ("paused", "new"), ("paused", "done")} <= tested.applied
