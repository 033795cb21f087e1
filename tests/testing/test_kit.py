"""The kit's parts: every edge of the example specs applied with Hypothesis' defaults,
the strategies' values and moves, the spec as a ``transitions`` machine, and the refusals
of what the kit cannot do."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import run_state_machine_as_test
from transitions import MachineError
from transitions.extensions.diagrams import GraphMachine

from ledgerq.errors import InvalidInput
from ledgerq.lifecycle import Actor, default_registry, load_registry
from ledgerq.lifecycle.registry import Registry
from ledgerq.lifecycle.values import value_problem
from ledgerq.tasks import App
from ledgerq.testing import LifecycleMachine, strategies
from lifecycle_support import with_dispatch
from test_docs import block

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = settings(settings.get_profile("default"), deadline=None, database=None,
                   suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """The deployment example and the docs' order, beside the packaged specs."""
    specs = tmp_path_factory.mktemp("specs")
    shutil.copy(ROOT / "docs" / "examples" / "deployment.toml", specs)
    (specs / "shop_order.toml").write_text(
        block(ROOT / "docs" / "lifecycles.md", "example: shop_order.toml", "toml"),
        encoding="utf-8")
    return load_registry(specs)


@pytest.mark.parametrize("entity", ["deployment", "shop_order"])
def test_every_edge_is_applied_with_the_defaults(entity: str, examples: Registry) -> None:
    machine = LifecycleMachine.for_entity(entity, registry=examples)
    run_state_machine_as_test(machine, settings=DEFAULT)
    assert machine.applied == set(machine.policy.edge_rules), (
        "edges never applied", set(machine.policy.edge_rules) - machine.applied)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_every_column_type_guarded_on(backend: str, request: pytest.FixtureRequest) -> None:
    """A widget guards on a boolean (SQLite hands it back as 0 or 1: a guard on the row's
    own value was refused), on JSON (a guard on a JSON column raised NameError), on a
    minted token, with custom actors and a unique index."""
    target = None if backend == "sqlite" else request.getfixturevalue("pg_database")
    machine = LifecycleMachine.for_entity(
        "widget", registry=load_registry(Path(__file__).parent / "specs_widget"),
        target=target)
    run_state_machine_as_test(machine, settings=settings(
        DEFAULT, max_examples=60 if backend == "sqlite" else 20, derandomize=True))
    if backend == "sqlite":
        assert machine.applied == set(machine.policy.edge_rules)


def test_the_generated_class_is_named_for_its_entity() -> None:
    machine = LifecycleMachine.for_entity("schedule_run")
    assert machine.__name__ == "ScheduleRunMachine"
    assert machine.policy is default_registry().entity("schedule_run")
    assert LifecycleMachine.for_entity("dispatch", registry=with_dispatch()).applied \
        is not machine.applied


def test_an_entity_the_kit_cannot_fill_is_refused(tmp_path: Path) -> None:
    spec = (ROOT / "docs" / "examples" / "deployment.toml").read_text(encoding="utf-8")
    (tmp_path / "deployment.toml").write_text(spec.replace(
        "[columns]\n", '[columns]\nrelease_id = { type = "text", references = "schedule_runs", '
        "not_null = true }\n", 1), encoding="utf-8")
    with pytest.raises(InvalidInput, match="release_id references schedule_runs"):
        LifecycleMachine.for_entity("deployment", registry=load_registry(tmp_path))
    with pytest.raises(ValueError, match="unknown entity type 'nothing_like_it'"):
        LifecycleMachine.for_entity("nothing_like_it")


# ---------------------------------------------------------------- strategies

PACKAGED = with_dispatch()  # the packaged specs and the docs' example outbox
COLUMNS = sorted((p.name, c) for p in PACKAGED.policies() for c in p.columns
                 if p.columns[c].references is None)


@pytest.mark.parametrize("entity, column", COLUMNS)
@settings(max_examples=40)
@given(data=st.data())
def test_values_are_what_the_log_stores_exactly(entity: str, column: str,
                                                data: st.DataObject) -> None:
    policy = PACKAGED.entity(entity)
    value = data.draw(strategies.values(policy, column))
    kind = policy.columns[column].type
    assert value_problem(value, json=kind == "json") is None
    if value is None:
        assert not policy.columns[column].not_null or column == "status"
    elif kind == "boolean":
        assert isinstance(value, bool)
    elif kind == "integer":
        assert type(value) is int
    elif kind in ("float", "timestamp"):
        assert type(value) is float


@settings(max_examples=60)
@given(data=st.data())
def test_legal_moves_take_declared_edges(data: st.DataObject) -> None:
    policy = PACKAGED.entity(data.draw(st.sampled_from(["schedule_run", "dispatch"])))
    state = data.draw(st.sampled_from([s for s in policy.states if policy.targets(s)]))
    move = data.draw(strategies.legal_moves(policy, state))
    rule = policy.rule(state, move.to_state)
    assert move.actor.type in policy.actors
    assert rule.actors is None or move.actor.type in rule.actors
    assert rule.requires_patch <= set(move.patch) <= policy.patch_columns
    assert set(move.guard_columns) == rule.requires_guard
    assert move.reason.code in policy.reason_codes


def test_every_refusal_is_drawn() -> None:
    """From a state with a restricted edge, each kind of refusal comes up."""
    policy = PACKAGED.entity("dispatch")
    seen: set[str] = set()

    @settings(max_examples=300, database=None)
    @given(strategies.illegal_moves(policy, "dead_letter"))
    def collect(refused: strategies.Refused) -> None:
        seen.add(refused.raises.__name__)

    collect()
    assert seen == {"IllegalTransition", "ActorNotAllowed", "MissingColumns", "UnknownReason",
                    "InvalidInput"}


def test_task_args_fit_the_signature() -> None:
    app = App(":memory:")

    @app.task
    def resize(width: int, height: int, label: str = "", ratio: float | None = None,
               extra: dict[str, Any] | None = None) -> None:
        """A task with required, optional and container parameters."""

    @settings(max_examples=50, database=None)
    @given(strategies.task_args(resize))
    def check(kwargs: dict[str, Any]) -> None:
        assert {"width", "height"} <= set(kwargs)
        assert resize.arguments.decode(resize.arguments.encode((), kwargs)) == {
            "label": "", "ratio": None, "extra": None, **kwargs}

    check()


# ---------------------------------------------------------------- the transitions model

def test_the_spec_as_a_transitions_machine() -> None:
    order = PACKAGED.entity("dispatch").to_machine()
    assert order.state == "pending"
    assert sorted(order.get_triggers("pending")) == ["acked", "delivering", "expired"]
    with pytest.raises(MachineError):
        order.trigger("pending")  # no edge pending -> pending
    assert order.trigger("delivering", actor=Actor(type="system", id="w"))
    # The self-loop needs its guard and patch columns; without them the model stays put.
    assert not order.trigger("delivering", actor="system")
    assert order.trigger("delivering", actor="system", guard={"attempt": 0},
                         patch={"attempt": 1})
    assert order.trigger("dead_letter", actor="system")
    # Resurrection is an operator's, with three columns.
    patch = {"attempt": 0, "next_attempt_at": 1.0, "last_error": None}
    assert not order.trigger("pending", actor="system", patch=patch)
    assert order.trigger("pending", actor="operator", patch=patch)
    assert order.state == "pending"


def test_events_are_triggers_too(examples: Registry) -> None:
    order = examples.entity("shop_order").to_machine()
    assert order.trigger("pay", actor="system") and order.state == "paid"
    assert not order.may_trigger("ship", actor="system")  # tracking is required
    assert order.trigger("ship", actor="system", patch={"tracking": "T1"})


def test_the_model_draws_itself_as_mermaid(examples: Registry) -> None:
    graph = examples.entity("shop_order").to_machine(
        machine_class=GraphMachine, graph_engine="mermaid").get_graph().draw(None)
    assert "stateDiagram-v2" in graph
    assert "created --> paid: paid" in graph or "created --> paid: pay" in graph
