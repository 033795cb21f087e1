"""Hypothesis strategies drawn from a spec: values, legal moves, illegal moves, arguments.

Everything here is derived from the policy, so a state, edge, column or reason code added
to a spec file is drawn without a change to a test. Values are those a row and the log
both store exactly (:func:`ledgerq.lifecycle.values.value_problem` refuses the rest: a
NUL, a lone surrogate, an integer past 64 bits, JSON nested 64 levels deep), edge cases
included: the bounds of 64-bit integers, empty and non-ASCII text, deep JSON.
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from hypothesis import strategies as st

from ledgerq.errors import (
    ActorNotAllowed,
    IllegalTransition,
    InvalidInput,
    MissingColumns,
    UnknownReason,
)
from ledgerq.lifecycle.models import MAX_ACTOR_ID_LENGTH, Actor, StateReason
from ledgerq.lifecycle.registry import STANDARD_COLUMNS, ColumnPolicy, EntityPolicy
from ledgerq.lifecycle.values import (
    INT64_MAX,
    INT64_MIN,
    JSON_FLOAT_LIMIT,
    MAX_JSON_DEPTH,
    value_problem,
)

if TYPE_CHECKING:
    from ledgerq.tasks.task import Task

T = TypeVar("T")

#: Characters text may hold: anything but NUL (PostgreSQL text cannot) and surrogates
#: (not UTF-8).
TEXT = st.characters(codec="utf-8", exclude_characters="\x00")


_CACHE: dict[tuple[Any, ...], tuple[Any, st.SearchStrategy[Any]]] = {}


def _cached(owner: Any, key: tuple[Any, ...],
            build: Callable[[], st.SearchStrategy[T]]) -> st.SearchStrategy[T]:
    """One strategy per (owner, key), built once: Hypothesis strategies are immutable,
    and building one (a recursive JSON strategy above all) costs more than drawing it."""
    found = _CACHE.get((id(owner), *key))
    if found is None or found[0] is not owner:
        found = _CACHE[(id(owner), *key)] = (owner, build())
    return found[1]


@functools.cache
def text(max_size: int = 24) -> st.SearchStrategy[str]:
    """Text both backends store exactly: empty, ASCII, non-ASCII (some of each, often)."""
    return st.one_of(st.sampled_from(["", "a", "ü", "日本", "\U0001f600", " x "]),
                     st.text(TEXT, max_size=max_size))


def _floats() -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from([0.0, -0.0, 1.5, -2.25, 1e15, 5e-324]),
                     st.floats(allow_nan=False, allow_infinity=False))


def _integers() -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([0, -1, 1, INT64_MIN, INT64_MAX]),
                     st.integers(INT64_MIN, INT64_MAX))


def _nested(depth: int, leaf: Any) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def _json_floats() -> st.SearchStrategy[float]:
    """Floats JSON carries exactly: below 2**53 in size (the engine refuses the rest)."""
    below = math.nextafter(JSON_FLOAT_LIMIT, 0)
    return st.one_of(st.sampled_from([0.0, -0.0, 1.5, -2.25, 1e15, 5e-324, below]),
                     st.floats(-below, below))


@functools.cache
def json_values(*, allow_none: bool = True) -> st.SearchStrategy[Any]:
    """A JSON column's values: scalars, lists and objects of them, and values nested just
    short of the depth the engine refuses (None, SQL's NULL, only when allowed)."""
    scalars = st.one_of(st.none(), st.booleans(), _integers(), _json_floats(), text())

    def containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        return st.one_of(st.lists(inner, max_size=4),
                         st.dictionaries(text(8), inner, max_size=4))

    deep = st.integers(MAX_JSON_DEPTH - 3, MAX_JSON_DEPTH - 1).map(
        lambda d: _nested(d, "deep"))
    top = st.one_of(st.booleans(), _integers(), _json_floats(), text(),
                    containers(st.recursive(scalars, containers, max_leaves=6)), deep)
    return st.one_of(st.none(), top) if allow_none else top


def values(policy: EntityPolicy, column: str) -> st.SearchStrategy[Any]:
    """Values ``column`` of ``policy`` and the log both store exactly, by its logical
    type (None too when the column may be NULL). A column that references another table
    draws None only: a value would have to be a row of that table, which a test makes
    itself (InvalidInput when the reference is required)."""
    try:
        col: ColumnPolicy = policy.columns[column]
    except KeyError:
        raise InvalidInput(f"{policy.name} has no column {column!r}") from None
    return _cached(policy, ("values", column), lambda: _column_values(policy, column, col))


def _column_values(policy: EntityPolicy, column: str, col: ColumnPolicy
                   ) -> st.SearchStrategy[Any]:
    if col.references is not None:
        if col.not_null:
            raise InvalidInput(f"{policy.name}.{column} references {col.references}: "
                               "give its values yourself (an id of a row of that table)")
        return st.none()
    base: st.SearchStrategy[Any] = {
        "integer": _integers(),
        "float": _floats(),
        "timestamp": _floats(),
        "text": text(),
        "boolean": st.booleans(),
        "json": json_values(allow_none=False),
    }[col.type]
    return base if col.not_null or column == "status" else st.one_of(st.none(), base)


def other_than(policy: EntityPolicy, column: str, current: Any, drawn: Any) -> Any:
    """``drawn`` (a value of ``column``), or one of the column's type that differs from
    ``current`` when they are equal: a stale guard value whose drawing never depends on
    the row (a filter would draw again, and an example must draw alike each time it is
    replayed)."""
    if drawn != current:
        return drawn
    if drawn is None:
        return {"integer": 0, "float": 0.0, "timestamp": 0.0, "text": "stale",
                "boolean": False, "json": {"stale": True}}[policy.columns[column].type]
    if isinstance(drawn, bool):
        return not drawn
    if isinstance(drawn, int):
        return drawn - 1 if drawn == INT64_MAX else drawn + 1
    if isinstance(drawn, float):
        return math.nextafter(drawn, math.inf if drawn < 1e300 else 0.0)
    if isinstance(drawn, str):
        return drawn + "~"
    return None if not policy.columns[column].not_null else {"stale": drawn}


@functools.cache
def actors(types: frozenset[str]) -> st.SearchStrategy[Actor]:
    """Actors of the given types, with ids of any text the log stores."""
    ids = st.one_of(st.sampled_from(["alice", "worker-1", "système"]),
                    st.text(TEXT, min_size=1, max_size=MAX_ACTOR_ID_LENGTH))
    return st.builds(Actor, type=st.sampled_from(sorted(types)), id=ids)


@functools.cache
def reasons(codes: tuple[str, ...]) -> st.SearchStrategy[StateReason]:
    """Reasons with one of ``codes``, sometimes a summary and metadata."""
    return st.builds(StateReason, code=st.sampled_from(codes),
                     summary=st.one_of(st.just(""), text(40)),
                     metadata=st.one_of(st.just({}),
                                        st.dictionaries(text(8), json_values(), max_size=3)))


def codes_for(policy: EntityPolicy, src: str | None, dst: str) -> tuple[str, ...]:
    """The reason codes a move to ``dst`` reads best with: the edge's default reason, else
    the codes named for the target state (``<domain>.<dst>.<cause>``), else any."""
    rule = policy.edge_rules.get((src, dst)) if src is not None else None
    if rule is not None and rule.reason is not None:
        return (rule.reason,)
    named = sorted(c for c in policy.reason_codes if c.split(".")[1:2] == [dst])
    return tuple(named or sorted(policy.reason_codes))


@dataclass(frozen=True)
class Move:
    """One move to ask of a row: ``entity.move(id, **move.arguments(row))``.

    A guard's values are the row's, so a move names only the columns its edge requires
    a guard on; :meth:`arguments` fills them in from the row it is made on.
    """

    to_state: str
    actor: Actor
    reason: StateReason
    patch: Mapping[str, Any] = field(default_factory=dict)
    guard_columns: tuple[str, ...] = ()
    #: Guard values given as they are, not read from the row (a planted wrong value).
    guard: Mapping[str, Any] = field(default_factory=dict)

    def guarded(self, column: str, value: Any) -> Move:
        """This move guarded on ``column`` holding ``value`` (given, not read from the
        row: a stale value, an old token)."""
        return replace(self, guard_columns=tuple(c for c in self.guard_columns if c != column),
                       guard={**self.guard, column: value})

    def arguments(self, row: Mapping[str, Any]) -> dict[str, Any]:
        guard = {c: row.get(c) for c in self.guard_columns} | dict(self.guard)
        return {"to_state": self.to_state, "actor": self.actor, "reason": self.reason,
                "patch": dict(self.patch) or None, "guard": guard or None}


class Refused(NamedTuple):
    """An illegal move, the exception it must raise, and what makes it illegal."""

    move: Move
    raises: type[Exception]
    why: str


def legal_move_to(policy: EntityPolicy, src: str, dst: str) -> st.SearchStrategy[Move]:
    """Moves along the declared edge ``src -> dst``: an actor type it accepts, the patch
    columns it requires (and sometimes other allowlisted ones), a declared reason."""
    return _cached(policy, ("legal", src, dst), lambda: _legal_move_to(policy, src, dst))


def _legal_move_to(policy: EntityPolicy, src: str, dst: str) -> st.SearchStrategy[Move]:
    rule = policy.rule(src, dst)
    allowed = policy.actors if rule.actors is None else policy.actors & rule.actors
    required = sorted(rule.requires_patch)
    optional = sorted(policy.patch_columns - rule.requires_patch - rule.fresh_tokens)

    def patch(extra: list[str]) -> st.SearchStrategy[dict[str, Any]]:
        return st.fixed_dictionaries({c: values(policy, c) for c in [*required, *extra]})

    extras = (st.lists(st.sampled_from(optional), max_size=2, unique=True) if optional
              else st.just([]))
    return st.builds(Move, to_state=st.just(dst), actor=actors(frozenset(allowed)),
                     reason=reasons(codes_for(policy, src, dst)),
                     patch=extras.flatmap(patch),
                     guard_columns=st.just(tuple(sorted(rule.requires_guard))))


def legal_moves(policy: EntityPolicy, state: str) -> st.SearchStrategy[Move]:
    """Moves the spec allows from ``state`` (nothing from a terminal state)."""
    targets = policy.targets(state)
    if not targets:
        return st.nothing()
    return _cached(policy, ("legal", state), lambda: st.one_of(
        [legal_move_to(policy, state, dst) for dst in targets]))


def _defects(policy: EntityPolicy, state: str, move: Move
             ) -> list[Callable[[], Refused | None]]:
    """Ways to spoil one legal move, each a single defect with the exception it earns."""
    rule = policy.rule(state, move.to_state)
    others = [s for s in policy.states if s not in policy.edges.get(state, ())]
    outsiders = sorted((policy.actors - rule.actors) if rule.actors is not None else ())
    not_allowlisted = sorted(set(policy.columns) - policy.patch_columns)

    def undeclared() -> Refused | None:
        if not others:
            return None
        dst = others[len(move.patch) % len(others)]
        return Refused(Move(dst, move.actor, move.reason), IllegalTransition,
                       f"no edge {state} -> {dst}")

    def wrong_actor() -> Refused | None:
        kind = outsiders[0] if outsiders else next(
            t for t in ("intruder", "nobody_declared") if t not in policy.actors)
        actor = Actor(type=kind, id=move.actor.id)
        return Refused(replace(move, actor=actor), ActorNotAllowed,
                       f"actor type {kind!r} may not take {state} -> {move.to_state}")

    def missing_patch() -> Refused | None:
        if not rule.requires_patch:
            return None
        dropped = sorted(rule.requires_patch)[0]
        patch = {c: v for c, v in move.patch.items() if c != dropped}
        return Refused(replace(move, patch=patch), MissingColumns,
                       f"patch lacks required {dropped}")

    def missing_guard() -> Refused | None:
        if not rule.requires_guard:
            return None
        dropped = sorted(rule.requires_guard)[0]
        kept = tuple(c for c in move.guard_columns if c != dropped)
        return Refused(replace(move, guard_columns=kept), MissingColumns,
                       f"guard lacks required {dropped}")

    def unknown_reason() -> Refused | None:
        reason = StateReason(code=f"{policy.name}.nowhere.undeclared")
        return Refused(replace(move, reason=reason), UnknownReason,
                       "an undeclared reason code")

    def column_not_allowlisted() -> Refused | None:
        if not not_allowlisted:
            return None
        col = not_allowlisted[len(move.patch) % len(not_allowlisted)]
        return Refused(replace(move, patch={**move.patch, col: None}), InvalidInput,
                       f"{col} is not a patch column")

    def wrong_type() -> Refused | None:
        typed = sorted(c for c in policy.patch_columns
                       if policy.columns[c].type in ("integer", "float", "timestamp",
                                                     "boolean"))
        if not typed:
            return None
        col = typed[len(move.patch) % len(typed)]
        return Refused(replace(move, patch={**move.patch, col: "not a number"}),
                       InvalidInput, f"a text value for {policy.columns[col].type} {col}")

    return [undeclared, wrong_actor, missing_patch, missing_guard, unknown_reason,
            column_not_allowlisted, wrong_type]


def illegal_moves(policy: EntityPolicy, state: str) -> st.SearchStrategy[Refused]:
    """Moves from ``state`` the engine must refuse, each with the exception it must raise
    (IllegalTransition, ActorNotAllowed, MissingColumns, UnknownReason, InvalidInput):
    a legal move with exactly one defect, so the refusal expected does not depend on the
    order of the engine's checks. From a terminal state, every target is undeclared."""
    return _cached(policy, ("illegal", state), lambda: _illegal_moves(policy, state))


def _illegal_moves(policy: EntityPolicy, state: str) -> st.SearchStrategy[Refused]:
    if not policy.targets(state):
        codes = tuple(sorted(policy.reason_codes))
        return st.builds(
            lambda dst, actor, reason: Refused(Move(dst, actor, reason), IllegalTransition,
                                               f"{state} is terminal"),
            st.sampled_from(list(policy.states)), actors(policy.actors), reasons(codes))

    def spoil(move: Move) -> st.SearchStrategy[Refused]:
        found = [r for make in _defects(policy, state, move) if (r := make()) is not None]
        return st.sampled_from(found)

    return legal_moves(policy, state).flatmap(spoil)


def creation_values(policy: EntityPolicy) -> st.SearchStrategy[dict[str, Any]]:
    """Values for a new row: every column it must be given (not null, no default), and
    sometimes the others an edge may guard on or patch."""
    return _cached(policy, ("creation",), lambda: _creation_values(policy))


def _creation_values(policy: EntityPolicy) -> st.SearchStrategy[dict[str, Any]]:
    required = sorted(c for c, col in policy.columns.items()
                      if c not in STANDARD_COLUMNS and col.not_null and col.default is None)
    optional = sorted((policy.guard_columns | policy.patch_columns) - set(required))
    return st.fixed_dictionaries({c: values(policy, c) for c in required},
                                 optional={c: values(policy, c) for c in optional})


def for_type(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of a parameter's annotation that JSON stores exactly: ``Any`` is any JSON
    value, containers and unions are taken apart, other types go to ``st.from_type``."""
    if annotation in (Any, object, None, inspect.Parameter.empty):
        return json_values()
    if annotation is type(None):
        return st.none()
    simple: dict[Any, st.SearchStrategy[Any]] = {
        bool: st.booleans(), int: _integers(), float: _json_floats(), str: text()}
    if annotation in simple:
        return simple[annotation]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([for_type(a) for a in args])
    if origin in (list, set, frozenset, collections.abc.Sequence, collections.abc.Set):
        item = for_type(args[0] if args else Any)
        return st.lists(item, max_size=4).map(origin if origin in (set, frozenset) else list)
    if origin in (dict, collections.abc.Mapping):
        keys = for_type(args[0]) if args else text(8)
        return st.dictionaries(keys, for_type(args[1] if args else Any), max_size=4)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return st.tuples(*(for_type(a) for a in args))
    if origin is tuple:
        return st.lists(for_type(args[0] if args else Any), max_size=4).map(tuple)
    return st.from_type(annotation)


def task_args(task: Task[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments ``task``'s signature accepts and a run stores exactly: each
    parameter drawn from its annotation (``st.from_type``), optional ones sometimes."""
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for name, info in task.arguments.model.model_fields.items():
        (required if info.is_required() else optional)[name] = for_type(info.annotation)

    def storable(kwargs: dict[str, Any]) -> bool:
        try:
            stored = task.arguments.encode((), kwargs)
        except InvalidInput:
            return False
        return value_problem(stored, json=True) is None

    return st.fixed_dictionaries(required, optional=optional).filter(storable)


__all__ = [
    "Move",
    "Refused",
    "actors",
    "codes_for",
    "creation_values",
    "for_type",
    "illegal_moves",
    "json_values",
    "legal_move_to",
    "legal_moves",
    "other_than",
    "reasons",
    "task_args",
    "text",
    "values",
]
