"""The lifecycle policy registry: every rule the engine enforces, built from spec files.

Nothing else in ledgerq declares an edge, a terminal set, a reason vocabulary or a
column allowlist; it asks an :class:`EntityPolicy`. Policies are immutable once built
so a running process cannot drift from the files it loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, get_args

from ledgerq.lifecycle.identifiers import (
    IDENTIFIER,
    identifier_problem,
    reason_code_problem,
)
from ledgerq.lifecycle.models import ActorType
from ledgerq.lifecycle.spec import (
    ColumnSpec,
    EdgeSpec,
    EntitySpec,
    SpecError,
    SpecProblem,
    read_spec,
)

if TYPE_CHECKING:
    from transitions import Machine

log = logging.getLogger("ledgerq.specs")

#: Tables ledgerq's own schema owns; no entity may project into them.
RESERVED_TABLES = frozenset({"status_transitions", "workers", "schedules", "invocations"})
#: Every name ledgerq's own schema takes in the database's one namespace of tables,
#: indexes and triggers (tests/lifecycle/test_spec_identifiers.py checks it against the DDL).
#: An edge's event: what ``entity.send(id, event)`` names.
EVENT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
#: An actor type an entity declares (``customer``, ``user``).
ACTOR_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")

RESERVED_OBJECTS = RESERVED_TABLES | frozenset({
    # PostgreSQL's schema also takes these (its metadata table, the append-only trigger
    # function and the TRUNCATE trigger SQLite does not have).
    "ledgerq_schema", "ledgerq_specs", "ledgerq_spec_versions", "ledgerq_rebuild",
    "status_transitions_append_only", "status_transitions_no_truncate",
    "uq_status_transitions_version", "uq_status_transitions_idempotency",
    "status_transitions_no_update", "status_transitions_no_delete", "idx_workers_leased_run",
    # ``ledgerq archive``: its record and the list of entities it may delete facts of.
    "ledgerq_archives", "ledgerq_archive_batch",
    # PostgreSQL's wake-up: the trigger on the runs table and its function.
    "ledgerq_claimable", "ledgerq_notify_claimable", "ledgerq_ended", "ledgerq_notify_ended",
    # Python tasks an app recorded (and PostgreSQL's name for its primary key).
    "task_kinds", "task_kinds_pkey",
})
ACTOR_TYPES: frozenset[str] = frozenset(get_args(ActorType))

#: The logical column types a spec may declare; each dialect maps them to its own DDL.
COLUMN_TYPES = ("text", "integer", "float", "timestamp", "json", "boolean")
#: What ``on_delete`` of a reference may say.
ON_DELETE = ("cascade", "set_null", "restrict")
#: How a row can have ended: the closed vocabulary of a terminal state's ``outcome``.
#: Closed, so code asking "did it succeed?" and a reader of a spec agree on the words.
SUCCEEDED = "succeeded"
OUTCOMES = (SUCCEEDED, "failed", "cancelled", "skipped")


@dataclass(frozen=True, slots=True)
class ColumnPolicy:
    """One validated column: a logical type and its constraints, no SQL text."""

    type: str
    not_null: bool = False
    default: bool | int | float | str | None = None
    references: str | None = None
    on_delete: str | None = None
    primary_key: bool = False

    def __str__(self) -> str:
        parts = [self.type]
        if self.primary_key:
            parts.append("primary key")
        if self.not_null:
            parts.append("not null")
        if self.default is not None:
            parts.append(f"default {self.default!r}")
        if self.references is not None:
            parts.append(f"references {self.references}")
        if self.on_delete is not None:
            parts.append(f"on delete {self.on_delete.replace('_', ' ')}")
        return " ".join(parts)


#: Columns every projection table has; the engine maintains them, specs never declare them.
STANDARD_COLUMNS: Mapping[str, ColumnPolicy] = MappingProxyType(
    {
        "id": ColumnPolicy("text", primary_key=True),
        "status": ColumnPolicy("text", not_null=True),
        "version": ColumnPolicy("integer", not_null=True, default=0),
        "created_at": ColumnPolicy("timestamp", not_null=True),
        "updated_at": ColumnPolicy("timestamp"),
        "status_reason_code": ColumnPolicy("text"),
        "status_reason_summary": ColumnPolicy("text"),
        "status_evidence_refs": ColumnPolicy("json"),
    }
)


@dataclass(frozen=True, slots=True)
class EdgeRule:
    """What one declared edge demands of a request beyond being declared."""

    actors: frozenset[str] | None
    requires_guard: frozenset[str]
    requires_patch: frozenset[str]
    description: str
    fresh_tokens: frozenset[str] = frozenset()
    #: The event that names this edge, and the reason code a move along it records by
    #: default (the spec's ``event`` and ``reason``).
    event: str | None = None
    reason: str | None = None
    #: The columns a move along this edge sets to NULL unless its patch gives them: the
    #: columns of the groups the spec's ``clears`` names.
    clears: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class IndexPolicy:
    name: str
    columns: tuple[str, ...]
    unique: bool
    #: The spec's ``where_status``: the states the index covers (None: not status-partial).
    status_in: tuple[str, ...] | None = None
    #: The spec's ``where_not_null``: columns the indexed rows have set.
    not_null: tuple[str, ...] = ()
    #: The spec's ``descending``: columns kept in descending order.
    descending: frozenset[str] = frozenset()

    @property
    def where(self) -> str | None:
        """The partial index's condition, built from validated names and quoted states."""
        terms = [f"{c} IS NOT NULL" for c in self.not_null]
        if self.status_in is not None:
            terms.append(f"status IN ({', '.join(sql_literal(s) for s in self.status_in)})")
        return " AND ".join(terms) or None


@dataclass(frozen=True, slots=True)
class EntityPolicy:
    """Everything the engine may do to one entity type."""

    name: str
    table: str
    description: str
    source: str
    states: Mapping[str, str]
    initial: frozenset[str]
    terminal: frozenset[str]
    edges: Mapping[str, frozenset[str]]
    edge_rules: Mapping[tuple[str, str], EdgeRule]
    guard_columns: frozenset[str]
    patch_columns: frozenset[str]
    reason_codes: Mapping[str, str]
    columns: Mapping[str, ColumnPolicy]
    indexes: tuple[IndexPolicy, ...]
    #: The decoded spec this policy was built from: what a database records of it
    #: (``ledgerq.lifecycle.evolution.normalize``), so a later diff needs no old file.
    spec: EntitySpec | None = field(default=None, compare=False, repr=False)

    #: Columns declared ``JSON``: stored as text, decoded on the way out. Derived once
    #: here, not per call: every run a worker executes asks for it.
    json_columns: tuple[str, ...] = field(init=False, default=())
    #: Columns of a float type (``float``, ``timestamp``), and the boolean ones.
    float_columns: tuple[str, ...] = field(init=False, default=())
    bool_columns: tuple[str, ...] = field(init=False, default=())
    #: Index name -> the states a status-partial index covers (its ``where_status``).
    index_states: Mapping[str, tuple[str, ...]] = field(init=False, default_factory=dict)
    #: Columns with a default: what a row holds in them when no fact names them.
    defaulted: frozenset[str] = field(init=False, default=frozenset())
    #: Terminal state -> its declared outcome (one of :data:`OUTCOMES`); terminal states
    #: that declare none are absent.
    outcomes: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Group name -> its columns, in spec order (``[column_groups]``).
    column_groups: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    #: The actor types that may move its rows (the spec's ``actors``; default the
    #: ADR-0071 queue's five).
    actors: frozenset[str] = field(default_factory=lambda: ACTOR_TYPES)
    #: State -> the tasks a row entering it defers (the states' ``on_enter``); states
    #: that defer none are absent, so an entity without any has an empty mapping.
    on_enter: Mapping[str, tuple[str, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    #: The registry a policy that defers tasks was first put in: where what runs them
    #: (the queue's entity) is found from inside a move, which is given only the policy.
    peers: Registry | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "json_columns", tuple(
            c for c, col in self.columns.items() if col.type == "json"))
        object.__setattr__(self, "bool_columns", tuple(
            c for c, col in self.columns.items() if col.type == "boolean"))
        object.__setattr__(self, "float_columns", tuple(
            c for c, col in self.columns.items() if col.type in ("float", "timestamp")))
        object.__setattr__(self, "defaulted", frozenset(
            c for c, col in self.columns.items() if col.default is not None))
        object.__setattr__(self, "index_states", MappingProxyType(
            {ix.name: ix.status_in for ix in self.indexes if ix.status_in is not None}))

    def allows(self, from_state: str, to_state: str) -> bool:
        return to_state in self.edges.get(from_state, frozenset())

    def targets(self, from_state: str) -> list[str]:
        return sorted(self.edges.get(from_state, frozenset()))

    def rule(self, from_state: str, to_state: str) -> EdgeRule:
        return self.edge_rules[(from_state, to_state)]

    def event_target(self, from_state: str, event: str) -> str | None:
        """The state ``event`` takes a row in ``from_state`` to; None when no edge out of
        it has that event."""
        for (src, dst), rule in self.edge_rules.items():
            if src == from_state and rule.event == event:
                return dst
        return None

    @property
    def events(self) -> frozenset[str]:
        """Every event an edge of this entity names."""
        return frozenset(r.event for r in self.edge_rules.values() if r.event is not None)

    def outcome(self, state: str) -> str | None:
        """How a row in ``state`` ended; None for a state that is not (or not declared as)
        an end. A state the spec does not know is None too: a row in it (written by a
        newer spec) has not ended as far as this process can tell."""
        return self.outcomes.get(state)

    def states_with_outcome(self, *outcomes: str) -> frozenset[str]:
        """The terminal states whose outcome is one of ``outcomes``."""
        return frozenset(s for s, o in self.outcomes.items() if o in outcomes)

    def column_group(self, name: str) -> tuple[str, ...]:
        """The columns of a declared group; ValueError naming the groups the spec has."""
        try:
            return self.column_groups[name]
        except KeyError:
            known = ", ".join(sorted(self.column_groups)) or "none"
            raise ValueError(f"entity {self.name!r} declares no column group {name!r}; "
                             f"known: {known}") from None

    def to_machine(self, model: Any = None, **options: Any) -> Machine:
        """A ``transitions.Machine`` of this spec, to simulate or draw the lifecycle in
        memory: see :func:`ledgerq.lifecycle.machines.to_machine` (needs the
        ``testing`` extra)."""
        from ledgerq.lifecycle.machines import to_machine

        return to_machine(self, model, **options)

    def status_check(self) -> str:
        """The CHECK clause of the table's status column, so schema and spec cannot drift."""
        states = ", ".join(sql_literal(s) for s in self.states)
        return f"CHECK(status IN ({states}))"


def sql_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class Registry:
    """An immutable set of entity policies, looked up by entity name."""

    __slots__ = ("_by_name",)

    def __init__(self, policies: Iterable[EntityPolicy]) -> None:
        policies = list(policies)
        problems = cross_problems(policies)
        if problems:
            raise SpecError(problems)
        by_name: dict[str, EntityPolicy] = {}
        for p in policies:
            by_name[p.name] = p
            if p.on_enter and p.peers is None:
                object.__setattr__(p, "peers", self)
        self._by_name: Mapping[str, EntityPolicy] = MappingProxyType(by_name)

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, name):
            raise AttributeError(f"Registry is immutable; cannot set {name!r}")
        object.__setattr__(self, name, value)

    @property
    def entities(self) -> list[str]:
        return list(self._by_name)

    def policies(self) -> list[EntityPolicy]:
        return list(self._by_name.values())

    def entity(self, name: str) -> EntityPolicy:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name)) or "none"
            raise ValueError(f"unknown entity type {name!r}; known: {known}") from None

    def allows(self, entity_type: str, from_state: str, to_state: str) -> bool:
        return self.entity(entity_type).allows(from_state, to_state)

    def __repr__(self) -> str:
        return f"Registry({', '.join(self._by_name)})"


# ---------------------------------------------------------------- building


def build_policy(spec: EntitySpec, source: str, *, lost: frozenset[str] = frozenset(),
                 into: list[SpecProblem] | None = None) -> EntityPolicy:
    """Validate one decoded spec; raise SpecError naming every problem found.

    ``lost``: the ``$``-paths :func:`read_spec` could not decode; checks that depend on
    them are skipped rather than reported as a second, misleading problem. ``into``: the
    findings are appended there and the policy is returned anyway, so a caller checking a
    whole directory can go on to the checks across files.
    """
    problems: list[SpecProblem] = [] if into is None else into
    c = _Checking(spec, source, lost, problems)
    # Every check runs whatever the others found, so one pass reports all there is to
    # fix. The order is the order of the findings, which callers and tests compare.
    _check_state_names(c)
    _check_initial_and_terminal(c)
    _check_columns(c)
    _check_allowlists(c)
    _check_actors(c)
    graph = _check_edges(c)
    _check_every_state_reachable(c, graph)
    _check_every_state_can_finish(c, graph)
    _check_reason_codes(c)
    indexes = _check_indexes(c)
    outcomes = _check_outcomes(c)
    on_enter = _check_on_enter(c)
    groups = _check_column_groups(c)
    _check_clears(c, graph, groups)
    _check_entity_and_table(c)
    if problems and into is None:
        raise SpecError(problems)
    return EntityPolicy(
        name=spec.entity,
        table=spec.table,
        description=spec.description,
        source=source,
        states=MappingProxyType({s: spec.states[s].description for s in spec.states}),
        initial=frozenset(spec.initial),
        terminal=frozenset(spec.terminal),
        edges=MappingProxyType({s: frozenset(d) for s, d in graph.edges.items()}),
        edge_rules=MappingProxyType(graph.rules),
        guard_columns=frozenset(spec.guard_columns),
        patch_columns=frozenset(spec.patch_columns),
        reason_codes=MappingProxyType(dict(spec.reason_codes)),
        columns=MappingProxyType(c.columns),
        indexes=tuple(indexes),
        spec=spec,
        outcomes=MappingProxyType(outcomes),
        column_groups=MappingProxyType(groups),
        actors=ACTOR_TYPES if spec.actors is None else frozenset(spec.actors),
        on_enter=MappingProxyType(on_enter),
    )


@dataclass(slots=True)
class _Checking:
    """What the checks of one spec share: each appends to the same list, and each asks
    here whether what it would report is already explained by a decoding problem."""

    spec: EntitySpec
    source: str
    lost: frozenset[str]
    problems: list[SpecProblem]
    #: A state whose table did not decode is still declared by its name: "undeclared
    #: state" where an edge names it would only echo that problem.
    declared: set[str] = field(init=False)
    states_known: bool = field(init=False)
    terminal: frozenset[str] = field(init=False)
    #: The table's valid columns, standard ones first; :func:`_check_columns` adds the
    #: spec's.
    columns: dict[str, ColumnPolicy] = field(init=False)
    #: Declared columns refused for their declaration: reported once, and not again
    #: where a list names them.
    refused: set[str] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.declared = set(self.spec.states) | _lost_keys(self.lost, "$.states")
        self.states_known = "$.states" not in self.lost
        self.terminal = frozenset(self.spec.terminal)
        self.columns = dict(STANDARD_COLUMNS)

    def bad(self, where: str, what: str) -> None:
        self.problems.append(SpecProblem(self.source, where, what))

    def known(self, path: str) -> bool:
        """Whether everything under ``path`` decoded (nothing there is missing)."""
        return not any(p == path or p.startswith((path + ".", path + "["))
                       for p in self.lost)

    def undeclared(self, state: str) -> bool:
        """Whether ``state`` is surely not declared: when the states table did not
        decode, no state can be said to be missing from it."""
        return state not in self.declared and self.states_known

    def absent(self, col: str) -> bool:
        """Whether the table surely lacks ``col``: not one refused for its declaration
        (already reported), nor one whose declaration did not decode."""
        return (col not in self.columns and col not in self.refused
                and "$.columns" not in self.lost and self.known(f"$.columns.{col}"))

    @property
    def graph_known(self) -> bool:
        """An edge that did not decode at all, or a states table that did not, leaves
        the graph unknown: reachability would be judged on a graph the file does not
        declare."""
        return self.states_known and "$.edges" not in self.lost and not any(
            _EDGE_ITEM.match(p) for p in self.lost)


@dataclass(slots=True)
class _Graph:
    """The declared edges that are valid, as the graph checks and the policy use them."""

    edges: dict[str, set[str]]
    rules: dict[tuple[str, str], EdgeRule] = field(default_factory=dict)
    #: States a refused edge may have been meant to reach, or to leave by: whether they
    #: are reachable, or can finish, is unknown until that edge is fixed.
    maybe_reached: set[str] = field(default_factory=set)
    maybe_finishes: set[str] = field(default_factory=set)
    #: (source state, event) -> the index of the edge that names it.
    events: dict[tuple[str, str], int] = field(default_factory=dict)


def _check_state_names(c: _Checking) -> None:
    for name in c.spec.states:
        if not IDENTIFIER.match(name):
            c.bad(f"$.states.{name!r}", "state names must be lower_snake_case identifiers")


def _check_initial_and_terminal(c: _Checking) -> None:
    for key, values in (("initial", c.spec.initial), ("terminal", c.spec.terminal)):
        for i, s in enumerate(values):
            if c.undeclared(s):
                c.bad(f"$.{key}[{i}]", f"undeclared state {s!r}")
    if not c.spec.initial and c.known("$.initial"):
        c.bad("$.initial", "at least one initial state is required")
    if not c.spec.terminal and c.known("$.terminal"):
        c.bad("$.terminal", "at least one terminal state is required")


def _check_columns(c: _Checking) -> None:
    """The engine maintains the standard columns, so a spec that declares one would
    fight it; every other name reaches SQL, so it must be a plain identifier."""
    for name, decl in c.spec.columns.items():
        problem = identifier_problem(name)
        if name in STANDARD_COLUMNS:
            c.bad(f"$.columns.{name}", "is a standard column the engine maintains; remove it")
        elif problem is not None:
            c.bad(f"$.columns.{name!r}", f"column name {problem}")
        else:
            column = _column(f"$.columns.{name}", decl, c.bad)
            if column is not None:
                c.columns[name] = column
            else:
                c.refused.add(name)


def _check_allowlists(c: _Checking) -> None:
    """A request may guard on or patch only columns the table has, and never the ones
    the engine itself moves (a patched status would bypass the declared edges)."""
    for key, values in (("guard_columns", c.spec.guard_columns),
                        ("patch_columns", c.spec.patch_columns)):
        for i, col in enumerate(values):
            if c.absent(col):
                c.bad(f"$.{key}[{i}]",
                      f"column {col!r} is not a column of table {c.spec.table!r}")
            elif col in ("id", "status", "version"):
                c.bad(f"$.{key}[{i}]", f"column {col!r} is maintained by the engine")


def _check_actors(c: _Checking) -> None:
    for j, actor in enumerate(c.spec.actors or []):
        if ACTOR_NAME.fullmatch(actor) is None:
            c.bad(f"$.actors[{j}]", f"actor type {actor!r} is not a name: a lowercase "
                  "letter, then lowercase letters, digits and '_'")


def _check_edges(c: _Checking) -> _Graph:
    """Each edge on its own, then as part of the graph: an edge between declared states
    enters it (once), one naming an undeclared state marks what it may have meant."""
    states = list(c.spec.states)
    graph = _Graph({s: set() for s in [*states, *sorted(c.declared - set(states))]})
    guard_cols = frozenset(c.spec.guard_columns) if c.known("$.guard_columns") else None
    patch_cols = frozenset(c.spec.patch_columns) if c.known("$.patch_columns") else None
    for i, edge in enumerate(c.spec.edges):
        _check_edge(c, i, edge, guard_cols, patch_cols)
        if edge.source not in c.declared:
            graph.maybe_reached.update(edge.to)
            continue
        if any(dst not in c.declared for dst in edge.to):
            graph.maybe_finishes.add(edge.source)
        rule = EdgeRule(
            actors=frozenset(edge.actors) if edge.actors is not None else None,
            requires_guard=frozenset(edge.requires_guard),
            requires_patch=frozenset(edge.requires_patch),
            description=edge.description,
            fresh_tokens=frozenset(edge.fresh_tokens),
            event=edge.event, reason=edge.reason,
        )
        if edge.event is not None:
            taken = graph.events.setdefault((edge.source, edge.event), i)
            if taken != i:
                c.bad(f"$.edges[{i}].event", f"event {edge.event!r} already names edge "
                      f"$.edges[{taken}] out of {edge.source!r}: an event takes one edge")
        for j, dst in enumerate(edge.to):
            if dst not in c.declared:
                continue
            if (edge.source, dst) in graph.rules:
                c.bad(f"$.edges[{i}].to[{j}]", f"edge {edge.source} -> {dst} is declared twice")
            graph.rules[(edge.source, dst)] = rule
            graph.edges[edge.source].add(dst)
    return graph


def _check_edge(c: _Checking, i: int, edge: EdgeSpec, guard_cols: frozenset[str] | None,
                patch_cols: frozenset[str] | None) -> None:
    """A None allowlist is one that did not decode: there is nothing to check against."""
    where = f"$.edges[{i}]"
    if c.undeclared(edge.source):
        c.bad(f"{where}.from", f"edge from undeclared state {edge.source!r}")
    elif edge.source in c.terminal:
        c.bad(f"{where}.from", f"terminal state {edge.source!r} has an outgoing edge")
    if not edge.to:
        c.bad(f"{where}.to", "an edge needs at least one target")
    for j, dst in enumerate(edge.to):
        if c.undeclared(dst):
            c.bad(f"{where}.to[{j}]", f"edge to undeclared state {dst!r}")
    known = ACTOR_TYPES if c.spec.actors is None else frozenset(c.spec.actors)
    for j, actor in enumerate(edge.actors or []):
        if actor not in known:
            c.bad(f"{where}.actors[{j}]",
                  f"unknown actor type {actor!r}; the entity's actors: "
                  f"{', '.join(sorted(known))}")
    for j, col in enumerate(edge.requires_guard):
        if guard_cols is not None and col not in guard_cols:
            c.bad(f"{where}.requires_guard[{j}]", f"column {col!r} is not in guard_columns")
    for j, col in enumerate(edge.requires_patch):
        if patch_cols is not None and col not in patch_cols:
            c.bad(f"{where}.requires_patch[{j}]", f"column {col!r} is not in patch_columns")
    for j, col in enumerate(edge.fresh_tokens):
        if patch_cols is not None and col not in patch_cols:
            c.bad(f"{where}.fresh_tokens[{j}]", f"column {col!r} is not in patch_columns")
    if edge.event is not None:
        if EVENT_NAME.fullmatch(edge.event) is None:
            c.bad(f"{where}.event", f"event {edge.event!r} is not a name: a letter, then "
                  "letters, digits and '_'")
        if len(edge.to) != 1:
            c.bad(f"{where}.event", f"an edge with an event has one target; this one has "
                  f"{len(edge.to)} (declare an edge per target)")
    if edge.reason is not None and edge.reason not in c.spec.reason_codes:
        c.bad(f"{where}.reason", f"default reason {edge.reason!r} is not one of the "
              "entity's reason_codes")


def _check_every_state_reachable(c: _Checking, graph: _Graph) -> None:
    """A state no row can enter is a typo or a forgotten edge."""
    if not (c.graph_known and c.known("$.initial")):
        return
    reachable = _reach(c.spec.initial, graph.edges)
    for s in graph.edges:
        if s not in reachable and s not in graph.maybe_reached:
            c.bad(f"$.states.{s}", "unreachable from every initial state")


def _check_every_state_can_finish(c: _Checking, graph: _Graph) -> None:
    """A row in a state with no way to a terminal one could never end."""
    if not (c.graph_known and c.known("$.terminal")):
        return
    reverse: dict[str, set[str]] = {s: set() for s in graph.edges}
    for src, dsts in graph.edges.items():
        for dst in dsts:
            reverse[dst].add(src)
    can_finish = _reach(c.spec.terminal, reverse)
    for s in graph.edges:
        if s not in can_finish and s not in graph.maybe_finishes:
            c.bad(f"$.states.{s}", "non-terminal state with no path to a terminal state")


def _check_reason_codes(c: _Checking) -> None:
    """Every change records why; a spec with no reason codes would refuse them all."""
    for code in c.spec.reason_codes:
        problem = reason_code_problem(code)
        if problem is not None:
            c.bad(f"$.reason_codes.{code!r}", problem)
    if not c.spec.reason_codes and c.known("$.reason_codes"):
        c.bad("$.reason_codes", "at least one reason code is required")


def _check_indexes(c: _Checking) -> list[IndexPolicy]:
    """An index becomes DDL: its name and columns must be ones the table can take."""
    indexes: list[IndexPolicy] = []
    index_names: set[str] = set()
    for i, ix in enumerate(c.spec.indexes):
        problem = identifier_problem(ix.name)
        if problem is not None:
            c.bad(f"$.indexes[{i}].name", f"index name {problem}")
        elif ix.name in index_names:
            c.bad(f"$.indexes[{i}].name", f"index {ix.name!r} is declared twice")
        index_names.add(ix.name)
        if not ix.columns:
            c.bad(f"$.indexes[{i}].columns", "an index needs at least one column")
        for key, cols in (("columns", ix.columns), ("where_not_null", ix.where_not_null)):
            for j, col in enumerate(cols):
                if c.absent(col):
                    c.bad(f"$.indexes[{i}].{key}[{j}]", f"column {col!r} is not in the table")
        for j, state in enumerate(ix.where_status or []):
            if c.undeclared(state):
                c.bad(f"$.indexes[{i}].where_status[{j}]", f"undeclared state {state!r}")
        for j, col in enumerate(ix.descending):
            if col not in ix.columns:
                c.bad(f"$.indexes[{i}].descending[{j}]",
                      f"column {col!r} is not one of the index's columns")
            elif ix.descending.index(col) != j:
                c.bad(f"$.indexes[{i}].descending[{j}]", f"column {col!r} is listed twice")
        indexes.append(IndexPolicy(ix.name, tuple(ix.columns), ix.unique,
                                   tuple(ix.where_status) if ix.where_status else None,
                                   tuple(ix.where_not_null), frozenset(ix.descending)))
    return indexes


def _check_outcomes(c: _Checking) -> dict[str, str]:
    """Only an end has an outcome, and only one of :data:`OUTCOMES`, so code asking "did
    it succeed?" and a reader of the spec agree."""
    outcomes: dict[str, str] = {}
    for name, state_spec in c.spec.states.items():
        if state_spec.outcome is None:
            continue
        where = f"$.states.{name}.outcome"
        if name not in c.terminal:
            c.bad(where, f"state {name!r} is not terminal; only a terminal state has an outcome")
        elif state_spec.outcome not in OUTCOMES:
            c.bad(where,
                  f"unknown outcome {state_spec.outcome!r}; known: {', '.join(OUTCOMES)}")
        else:
            outcomes[name] = state_spec.outcome
    return outcomes


def _check_on_enter(c: _Checking) -> dict[str, tuple[str, ...]]:
    """Each state's ``on_enter`` names tasks, each once: a task listed twice would be
    deferred twice per entry, which is never what "when it enters, do this" means."""
    out: dict[str, tuple[str, ...]] = {}
    for name, state_spec in c.spec.states.items():
        tasks = state_spec.on_enter
        if not tasks:
            continue
        where = f"$.states.{name}.on_enter"
        # (What a task may be named is the queue's to say: ledgerq.queue.moves.problems.)
        bad = [t for t in tasks if not t.strip()]
        if bad:
            c.bad(where, "a task name is empty")
        twice = sorted({t for t in tasks if tasks.count(t) > 1})
        if twice:
            c.bad(where, f"task {', '.join(map(repr, twice))} is listed more than once")
        if not bad and not twice:
            out[name] = tuple(tasks)
    return out


def _check_column_groups(c: _Checking) -> dict[str, tuple[str, ...]]:
    groups: dict[str, tuple[str, ...]] = {}
    for name, cols in c.spec.column_groups.items():
        # A group's name never reaches SQL (its columns do, as validated columns).
        if not IDENTIFIER.match(name):
            c.bad(f"$.column_groups.{name!r}",
                  "column group names must be lower_snake_case identifiers")
            continue
        if not cols:
            c.bad(f"$.column_groups.{name}", "a column group needs at least one column")
        for j, col in enumerate(cols):
            if col not in c.columns:
                c.bad(f"$.column_groups.{name}[{j}]",
                      f"column {col!r} is not a column of table {c.spec.table!r}")
            elif col in cols[:j]:
                c.bad(f"$.column_groups.{name}[{j}]", f"column {col!r} is listed twice")
        groups[name] = tuple(cols)
    return groups


def _check_clears(c: _Checking, graph: _Graph, groups: Mapping[str, tuple[str, ...]]) -> None:
    """Each edge's ``clears`` names declared column groups whose columns a move may patch;
    the edge's rule gets their columns."""
    patch_cols = frozenset(c.spec.patch_columns) if c.known("$.patch_columns") else None
    for i, edge in enumerate(c.spec.edges):
        cleared: set[str] = set()
        for j, name in enumerate(edge.clears):
            if name not in groups:
                c.bad(f"$.edges[{i}].clears[{j}]", f"{name!r} is not a column group of the "
                      f"entity (declared: {', '.join(sorted(groups)) or 'none'})")
                continue
            for col in groups[name]:
                if patch_cols is not None and col not in patch_cols:
                    c.bad(f"$.edges[{i}].clears[{j}]", f"group {name!r} has column {col!r}, "
                          "which is not in patch_columns: a move cannot clear it")
            cleared.update(groups[name])
        if not cleared:
            continue
        for dst in edge.to:
            rule = graph.rules.get((edge.source, dst))
            if rule is not None:
                graph.rules[(edge.source, dst)] = dataclasses.replace(
                    rule, clears=frozenset(cleared))


def holding_states(policy: EntityPolicy, group: str) -> frozenset[str]:
    """The states whose rows hold ``group``'s columns: those an edge enters by setting
    one of them (a required patch column, or a fresh token)."""
    cols = set(policy.column_groups.get(group, ()))
    return frozenset(dst for (_, dst), rule in policy.edge_rules.items()
                     if cols & (rule.requires_patch | rule.fresh_tokens))


def held_groups_left_held(policy: EntityPolicy) -> list[SpecProblem]:
    """Edges that take rows out of a state holding a column group into one that must not
    hold it (neither entered by setting the group nor terminal), without clearing it.

    Such rows arrive still holding it: a run paused from ``running`` kept its lease, and
    once it was queued again no claim took it (a claim wants no lease). Terminal states
    are exempt: an ended row keeps the lease it ended under, which tells a lost lease
    from a cancel. ``ledgerq specs check`` reports these as problems; loading logs them.
    """
    out: list[SpecProblem] = []
    for group in sorted(policy.column_groups):
        holding = holding_states(policy, group)
        cols = set(policy.column_groups[group])
        for (src, dst), rule in sorted(policy.edge_rules.items()):
            if src not in holding or dst in holding or dst in policy.terminal \
                    or cols <= rule.clears:
                continue
            index = next((i for i, e in enumerate(policy.spec.edges)
                          if e.source == src and dst in e.to), None) if policy.spec else None
            where = "$.edges" if index is None else f"$.edges[{index}]"
            out.append(SpecProblem(policy.source, f"{where}.clears", (
                f"edge {src} -> {dst} takes rows out of {src!r}, whose rows hold column group "
                f"{group!r} ({', '.join(policy.column_groups[group])}), into {dst!r}, which "
                f"must not hold it: they would arrive holding it (a queued run still "
                f"holding a lease is never claimed). Add clears = [\"{group}\"] to the edge "
                f"(declare {src} -> {dst} in an edge of its own if it shares one)")))
    return out


def _check_entity_and_table(c: _Checking) -> None:
    """Both names reach SQL, and ledgerq's own tables are not a spec's to project into."""
    if c.spec.table in RESERVED_TABLES:
        c.bad("$.table", f"table {c.spec.table!r} is reserved by ledgerq's own schema")
    for where, name in (("$.entity", c.spec.entity), ("$.table", c.spec.table)):
        problem = identifier_problem(name)
        if problem is not None and c.known(where):
            c.bad(where, problem)


_DEFAULT_TYPES: Mapping[str, tuple[type, ...]] = MappingProxyType({
    "text": (str,), "integer": (int,), "float": (int, float), "timestamp": (int, float),
    "boolean": (bool,), "json": (),
})


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _column(where: str, decl: ColumnSpec | str, bad: Callable[[str, str], None]
            ) -> ColumnPolicy | None:
    """A column declaration checked against the closed type vocabulary; never SQL text."""
    spec = ColumnSpec(type=decl) if isinstance(decl, str) else decl
    where_type = where if isinstance(decl, str) else f"{where}.type"
    if spec.type not in COLUMN_TYPES:
        bad(where_type, f"unknown column type {spec.type!r}; known: {', '.join(COLUMN_TYPES)}")
        return None
    ok = True
    default = spec.default
    if default is not None:
        allowed = _DEFAULT_TYPES[spec.type]
        wrong = not isinstance(default, allowed) or (
            isinstance(default, bool) and bool not in allowed)
        if wrong:
            bad(f"{where}.default", f"default {default!r} is not a {spec.type} value"
                if allowed else f"a {spec.type} column takes no default")
            ok = False
        elif isinstance(default, float) and not math.isfinite(default):
            bad(f"{where}.default", "default must be a finite number")
            ok = False
        elif isinstance(default, str) and ("\x00" in default or not _utf8(default)):
            bad(f"{where}.default", "a text default must be UTF-8 text without NUL")
            ok = False
        elif isinstance(default, int) and not -(2**63) <= default < 2**63:
            bad(f"{where}.default", "default does not fit in 64 bits")
            ok = False
    if spec.references is not None:
        problem = identifier_problem(spec.references)
        if problem is not None:
            bad(f"{where}.references", f"referenced table {problem}")
            ok = False
    if spec.on_delete is not None:
        if spec.references is None:
            bad(f"{where}.on_delete", "on_delete needs references")
            ok = False
        elif spec.on_delete not in ON_DELETE:
            bad(f"{where}.on_delete",
                f"unknown on_delete {spec.on_delete!r}; known: {', '.join(ON_DELETE)}")
            ok = False
    if not ok:
        return None
    return ColumnPolicy(spec.type, spec.not_null, default, spec.references, spec.on_delete)


def _lost_keys(lost: frozenset[str], table: str) -> set[str]:
    """The keys of ``table`` whose values did not decode (``$.states.busy.description``
    names state ``busy``)."""
    prefix = table + "."
    return {m.group(0) for p in lost if p.startswith(prefix)
            if (m := IDENTIFIER_PREFIX.match(p, len(prefix))) is not None}


#: A whole edge that did not decode (``$.edges[3]``), as opposed to one of its fields.
_EDGE_ITEM = re.compile(r"\$\.edges\[\d+\]\Z")
#: A lower_snake_case name at the start of what follows a table's path.
IDENTIFIER_PREFIX = re.compile(r"[a-z_][a-z0-9_]*(?=\Z|[.\[])")


def _reach(starts: Iterable[str], graph: Mapping[str, Iterable[str]]) -> set[str]:
    seen = set(starts)
    todo = deque(seen)
    while todo:
        for nxt in graph.get(todo.popleft(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def packaged_specs_dir() -> Path:
    """The specs shipped in the wheel, or the repository's ``specs/`` in a source checkout."""
    packaged = resources.files("ledgerq") / "specs"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "specs"


def load_registry(path: str | Path | None = None, *, packaged: bool = True) -> Registry:
    """The packaged specs plus a spec directory's (or one file's); None: the packaged
    specs alone.

    A spec in ``path`` for an entity the packaged specs also declare replaces the
    packaged one (logged on ``ledgerq.specs``): a directory holding only ``order.toml``
    still has the queue's entities. ``packaged=False``: the directory's specs alone.
    """
    root = Path(path) if path is not None else packaged_specs_dir()
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = sorted(root.glob("*.toml"))
    else:
        raise SpecError([SpecProblem.whole_file(root, "no such spec file or directory")])
    if not files:
        raise SpecError([SpecProblem.whole_file(root, "contains no *.toml spec files")])
    if path is not None and packaged and root.resolve() != packaged_specs_dir().resolve():
        files = _with_packaged(files)
    # Every file is read and checked however many problems the others have, and the
    # checks across files run on every spec whose names decoded: one run of `ledgerq
    # specs check` reports all there is to fix.
    problems: list[SpecProblem] = []
    policies: list[EntityPolicy] = []
    all_tables = True
    for f in files:
        decoded = read_spec(f)
        problems.extend(decoded.problems)
        if decoded.spec is None:
            all_tables = False
            continue
        policy = build_policy(decoded.spec, str(f), lost=decoded.lost, into=problems)
        if {"$.entity", "$.table"} & decoded.lost:
            all_tables = False
        else:
            policies.append(policy)
    problems.extend(cross_problems(policies, all_tables=all_tables))
    if problems:
        raise SpecError(problems)
    for policy in policies:
        for p in held_groups_left_held(policy):
            # Specs from before ``clears`` existed still load (the databases they made
            # must open); ``ledgerq specs check`` refuses them until the edge is fixed.
            if (p.file, p.path) not in _WARNED:
                _WARNED.add((p.file, p.path))
                log.warning("specs: %s: %s: %s", p.file, p.path, p.message)
    return Registry(policies)


#: Held-group findings logged already (once per process each).
_WARNED: set[tuple[str, str]] = set()


def _with_packaged(files: list[Path]) -> list[Path]:
    """``files`` and the packaged spec files whose entity none of them declares."""
    given: set[str] = set()
    for f in files:
        decoded = read_spec(f)
        if decoded.spec is not None:
            given.add(decoded.spec.entity)
    out = list(files)
    for f in sorted(packaged_specs_dir().glob("*.toml")):
        decoded = read_spec(f)
        entity = decoded.spec.entity if decoded.spec is not None else None
        if entity in given:
            log.info("specs: %s replaces the packaged spec of %s",
                     next(str(g) for g in files if _declares(g, entity)), entity)
            continue
        out.append(f)
    return out


def _declares(f: Path, entity: str | None) -> bool:
    decoded = read_spec(f)
    return decoded.spec is not None and decoded.spec.entity == entity


def cross_problems(policies: Iterable[EntityPolicy], *,
                   all_tables: bool = True) -> list[SpecProblem]:
    """What no single spec file shows: names two specs (or ledgerq's schema) both claim.

    Every table and index lives in one namespace per database; ``CREATE ... IF NOT
    EXISTS`` would silently skip a second object of the same name, so a collision must
    be refused here rather than discovered as a missing index. ``all_tables`` False: some
    spec's table is unknown (its file did not decode), so a reference to a table none of
    ``policies`` has may be to that one and is not reported.
    """
    problems: list[SpecProblem] = []
    policies = list(policies)
    seen_entity: dict[str, str] = {}
    owner: dict[str, str] = {n: "ledgerq's own schema" for n in RESERVED_OBJECTS}
    for p in policies:
        if p.name in seen_entity:
            problems.append(SpecProblem(p.source, "$.entity", f"duplicate entity {p.name!r} "
                                        f"(also in {seen_entity[p.name]})"))
        seen_entity.setdefault(p.name, p.source)
        if p.table in owner and p.table not in RESERVED_TABLES:
            problems.append(SpecProblem(p.source, "$.table", f"duplicate table {p.table!r} "
                                        f"(also in {owner[p.table]})"))
        owner.setdefault(p.table, p.source)
    # PostgreSQL names each table's primary-key index <table>_pkey in the same namespace.
    for table, source in list(owner.items()):
        if table in RESERVED_TABLES or table in {p.table for p in policies}:
            owner.setdefault(f"{table}_pkey", f"{source} (its primary key's index)")
    for p in policies:
        for i, ix in enumerate(p.indexes):
            if ix.name in owner:
                problems.append(SpecProblem(
                    p.source, f"$.indexes[{i}].name",
                    f"{ix.name!r} is already a table or index name (in {owner[ix.name]})"))
            owner.setdefault(ix.name, p.source)
    tables = {p.table for p in policies} | (RESERVED_TABLES - {"status_transitions", "workers"})
    for p in policies:
        for name, column in p.columns.items():
            if (column.references is not None and column.references not in tables
                    and all_tables):
                problems.append(SpecProblem(
                    p.source, f"$.columns.{name}.references",
                    f"unknown table {column.references!r}; known: {', '.join(sorted(tables))}"))
    return problems


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The registry of the packaged specs, built once per process."""
    return load_registry()
