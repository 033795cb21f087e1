"""How one version of an entity's spec differs from another, and what that change is.

A database records, per entity, the normalized spec its schema was last migrated to
(``ledgerq_specs``). Opening it with a spec directory compares the two here, in pure
code: nothing in this module knows SQL. The store asks two questions of it:

* **Opening** (:func:`merge_for_open`): processes of several versions may share one
  database during a rolling upgrade, so an opener may be newer (it adds), older (it
  lacks) or both. The database follows the *union*: what the opener adds is migrated,
  what it lacks is kept. Only a conflict no version order explains is refused.
* **Applying** (:func:`plan_apply`): ``ledgerq migrate --apply`` makes the database's
  spec exactly a directory's, performing removals too, each checked against the data.

Specs are compared in a normalized form (:func:`normalize`): plain JSON-able dicts in
which every set is sorted and every edge is one ``from -> to`` pair, so a diff needs no
old file and two spellings of one spec hash the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from ledgerq.lifecycle.registry import EntityPolicy, build_policy
from ledgerq.lifecycle.spec import ColumnSpec, EntitySpec, SpecError

#: A normalized spec: ``msgspec.to_builtins`` of an :class:`EntitySpec`, canonicalized.
Normal = dict[str, Any]

#: The version of ledgerq's own tables (status_transitions, workers, the metadata
#: tables); recorded in ``ledgerq_schema`` beside the specs. 3: ``workers`` has
#: ``stop_requested_at`` (``ledgerq worker stop``); opening an older database adds it.
#: 4: ``ledgerq archive`` (``ledgerq_archives``, ``ledgerq_archive_batch``, and the log's
#: DELETE guard admitting the archive's listed entities) and ``workers.queues``; opening
#: an older one replaces its guard and adds the column. 5: on PostgreSQL, a run entering
#: ``queued`` notifies listening workers by trigger (``ledgerq_claimable``). 6: Python
#: tasks: ``task_kinds`` (each app's task names and their parameters' JSON Schema) and
#: ``workers.kinds`` (the action kinds each worker serves). 7: ``task_kinds.defaults`` (a
#: task's own priority, retry policy, timeout, capabilities and target, which a run
#: deferred by a state's ``on_enter`` takes).
SCHEMA_VERSION = 7
#: Ids a refusal names at most: enough to find the rows, short enough to read.
SAMPLE_IDS = 5


# ---------------------------------------------------------------- normal form


def normalize(spec: EntitySpec) -> Normal:
    """The spec as canonical JSON-able data; equal specs give equal dicts."""
    data: Normal = msgspec.to_builtins(spec)
    # A state that defers no task normalizes as one recorded before on_enter existed.
    data["states"] = {name: {k: v for k, v in state.items() if k != "on_enter" or v}
                      for name, state in data["states"].items()}
    edges: dict[tuple[str, str], dict[str, Any]] = {}
    for edge in data.pop("edges"):
        for dst in edge["to"]:
            # An edge without an event, a default reason or clears normalizes as one recorded
            # before those fields existed did.
            rule = {k: (sorted(v) if isinstance(v, list) else v)
                    for k, v in edge.items() if k not in ("from", "to")
                    and not (k in ("event", "reason") and v is None)
                    and not (k == "clears" and not v)}
            edges[(edge["from"], dst)] = {"from": edge["from"], "to": [dst], **rule}
    data["edges"] = [edges[k] for k in sorted(edges)]
    columns: dict[str, Any] = {}
    for name, decl in spec.columns.items():
        col = ColumnSpec(type=decl) if isinstance(decl, str) else decl
        columns[name] = msgspec.to_builtins(col)
    data["columns"] = dict(sorted(columns.items()))
    # An index without descending keys normalizes as one recorded before the field
    # existed did: adding the field changed no existing index's definition.
    data["indexes"] = sorted(({k: v for k, v in ix.items() if k != "descending" or v}
                              for ix in data["indexes"]), key=lambda ix: ix["name"])
    for key in ("initial", "terminal", "guard_columns", "patch_columns"):
        data[key] = sorted(set(data[key]))
    data["reason_codes"] = dict(sorted(data["reason_codes"].items()))
    # A spec that names no actors normalizes as one recorded before the field existed.
    if data.get("actors") is None:
        data.pop("actors", None)
    else:
        data["actors"] = sorted(set(data["actors"]))
    return data


def encode(normal: Normal) -> str:
    return msgspec.json.encode(normal, order="sorted").decode()


def decode(text: str) -> Normal:
    value = msgspec.json.decode(text)
    if not isinstance(value, dict):
        raise ValueError("a recorded spec must be a JSON object")
    return value


def spec_hash(normal: Normal) -> str:
    """The content hash the database records beside each spec."""
    return hashlib.sha256(encode(normal).encode()).hexdigest()


def to_policy(normal: Normal, source: str) -> EntityPolicy:
    """A policy from a normalized spec (a recorded one, or a merge): validated again."""
    return build_policy(msgspec.convert(normal, type=EntitySpec), source)


def policy_normal(policy: EntityPolicy) -> Normal:
    if policy.spec is None:
        raise ValueError(f"policy {policy.name!r} was not built from a spec")
    return normalize(policy.spec)


# ---------------------------------------------------------------- changes


@dataclass(frozen=True, slots=True)
class Change:
    """One difference between two versions of one entity's spec.

    ``kind`` names what changed (state, edge, column, ...), ``action`` is add, remove
    or change, and ``name`` the item (an edge is ``a -> b``).
    """

    entity: str
    kind: str
    action: Literal["add", "remove", "change"]
    name: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"{self.action} {self.kind} {self.entity}.{self.name}"
        return f"{text} ({self.detail})" if self.detail else text


#: What a change does to the schema: ``table`` changes need DDL (a rebuild of a SQLite
#: table, an ALTER on PostgreSQL); ``behaviour`` changes are in the spec alone.
SCHEMA_KINDS = frozenset({"entity", "state", "column", "index"})


def schema_changes(changes: Iterable[Change]) -> list[Change]:
    return [c for c in changes if c.kind in SCHEMA_KINDS
            and not (c.kind == "state" and c.action == "change")]


def _keyed(items: Iterable[Mapping[str, Any]], key: Callable[[Mapping[str, Any]], str]
           ) -> dict[str, Mapping[str, Any]]:
    return {key(i): i for i in items}


def _edge_name(e: Mapping[str, Any]) -> str:
    return f"{e['from']} -> {e['to'][0]}"


def diff(old: Normal | None, new: Normal | None) -> list[Change]:
    """Every difference from ``old`` to ``new`` (either may be absent: a new or a
    removed entity), in a stable order: entity, states, edges, columns, the rest."""
    if old is None and new is None:
        return []
    if old is None:
        assert new is not None
        return [Change(new["entity"], "entity", "add", new["entity"], f"table {new['table']}")]
    if new is None:
        return [Change(old["entity"], "entity", "remove", old["entity"], f"table {old['table']}")]
    entity = new["entity"]
    out: list[Change] = []
    if old["table"] != new["table"]:
        out.append(Change(entity, "table", "change", old["table"], f"renamed to {new['table']}"))

    def compare(kind: str, a: Mapping[str, Any], b: Mapping[str, Any],
                describe: Callable[[Any, Any], str] | None = None) -> None:
        for name in a:
            if name not in b:
                out.append(Change(entity, kind, "remove", name))
        for name in b:
            if name not in a:
                out.append(Change(entity, kind, "add", name))
            elif a[name] != b[name]:
                detail = describe(a[name], b[name]) if describe else ""
                out.append(Change(entity, kind, "change", name, detail))

    compare("state", old["states"], new["states"])
    compare("edge", _keyed(old["edges"], _edge_name), _keyed(new["edges"], _edge_name))
    for key in ("initial", "terminal"):
        compare(key, dict.fromkeys(old[key]), dict.fromkeys(new[key]))
    compare("column", old["columns"], new["columns"], _column_change)
    compare("index", _keyed(old["indexes"], lambda i: str(i["name"])),
            _keyed(new["indexes"], lambda i: str(i["name"])))
    compare("reason_code", old["reason_codes"], new["reason_codes"])
    compare("guard_column", dict.fromkeys(old["guard_columns"]),
            dict.fromkeys(new["guard_columns"]))
    compare("patch_column", dict.fromkeys(old["patch_columns"]),
            dict.fromkeys(new["patch_columns"]))
    handled = {"entity", "table", "states", "edges", "initial", "terminal", "columns",
               "indexes", "reason_codes", "guard_columns", "patch_columns"}
    for key in sorted((set(old) | set(new)) - handled):
        if old.get(key) != new.get(key):
            out.append(Change(entity, "spec", "change", key))
    return out


def _column_change(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}"
                     for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def _column_kind(col: Mapping[str, Any]) -> str:
    ref = f" referencing {col['references']}" if col.get("references") else ""
    return f"{col.get('type')}{ref}"


def retyped(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether a column change alters what its values are (type or reference): such a
    column is rebuilt empty, so it may change only while no row holds a value in it."""
    return any(a.get(k) != b.get(k) for k in ("type", "references", "on_delete"))


# ---------------------------------------------------------------- the data


class Probe:
    """What a plan must know of the data; each dialect answers it over SQL.

    Each method returns a count and up to :data:`SAMPLE_IDS` ids of the rows meant.
    """

    def rows(self, table: str) -> tuple[int, list[str]]:
        raise NotImplementedError

    def rows_in(self, table: str, state: str) -> tuple[int, list[str]]:
        raise NotImplementedError

    def holding(self, table: str, column: str, *, null: bool = False) -> tuple[int, list[str]]:
        """Rows whose ``column`` is set (or, with ``null``, is NULL)."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a change cannot be made to this data: what blocks it, how many rows, which."""

    change: Change
    reason: str
    rows: int = 0
    ids: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"{self.change}: {self.reason}"
        if self.rows:
            some = ", ".join(self.ids)
            text += f" ({self.rows} row{'s' if self.rows != 1 else ''}: {some}" + (
                ", ..." if self.rows > len(self.ids) else "") + ")"
        return text


@dataclass(frozen=True, slots=True)
class StateMapping:
    """``--map-state entity:from=to``: move every row in ``source`` to ``target``."""

    entity: str
    source: str
    target: str

    @classmethod
    def parse(cls, text: str) -> StateMapping:
        entity, sep, rest = text.partition(":")
        source, eq, target = rest.partition("=")
        if not (sep and eq and entity and source and target):
            raise ValueError(f"--map-state {text!r}: expected ENTITY:FROM=TO "
                             "(e.g. schedule_run:paused=queued)")
        return cls(entity, source, target)

    def __str__(self) -> str:
        return f"{self.entity}:{self.source}={self.target}"


@dataclass
class EntityPlan:
    """What one entity's table and recorded spec go through."""

    entity: str
    old: Normal | None
    new: Normal | None
    changes: list[Change]
    #: Changes the recorded spec has that the opener lacks: kept (an older opener).
    kept: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    #: Rows to move before the table changes: (mapping, reason code).
    moves: list[tuple[StateMapping, str]] = field(default_factory=list)

    @property
    def schema_changes(self) -> list[Change]:
        """The changes that need DDL (a state's description or outcome needs none)."""
        return schema_changes(self.changes)

    @property
    def records(self) -> bool:
        """Whether the recorded spec changes (even with no DDL: a new edge)."""
        if self.new is None or self.old is None:
            return self.new is not self.old
        return spec_hash(self.old) != spec_hash(self.new)


@dataclass
class Plan:
    entities: list[EntityPlan]

    @property
    def refusals(self) -> list[Refusal]:
        return [r for e in self.entities for r in e.refusals]

    @property
    def changes(self) -> list[Change]:
        return [c for e in self.entities for c in e.changes]

    @property
    def empty(self) -> bool:
        return not any(e.records or e.moves for e in self.entities)

    def lines(self) -> list[str]:
        """The plan as an operator reads it: one line per step, classified."""
        out: list[str] = []
        for e in self.entities:
            refused = {r.change for r in e.refusals}
            for c in e.changes:
                if c in refused:
                    continue
                out.append(f"{classify(c)}: {c}")
            for c in e.kept:
                out.append(f"kept: {c} (the database keeps it; migrate --apply removes it)")
            for m, code in e.moves:
                out.append(f"move: {m} (reason {code})")
            out += [f"refused: {r}" for r in e.refusals]
        return out

    def refused_message(self) -> str:
        return "specs conflict with the database; nothing was changed:\n  " + "\n  ".join(
            str(r) for r in self.refusals)


def classify(change: Change) -> str:
    if change.action == "remove":
        return "removal"
    if change.action == "change" and change.kind == "terminal":
        return "removal"
    return "additive"


# ---------------------------------------------------------------- opening


def merge(old: Normal, new: Normal) -> Normal:
    """The union of two versions: ``new`` plus whatever only ``old`` has.

    States, edges, reason codes and the rest take ``new``'s text where both have them
    (the opener that migrates is the newer in what it adds); columns and indexes both
    have keep ``old``'s definition, since a definition change is not ordered by version
    (only ``migrate --apply`` makes it). What only ``old`` has is kept, so an older
    process that still uses it keeps working.
    """
    out = dict(new)
    out["states"] = {**new["states"], **{s: v for s, v in old["states"].items()
                                          if s not in new["states"]}}
    edges = {_edge_name(e): e for e in old["edges"]} | {_edge_name(e): e for e in new["edges"]}
    out["edges"] = [edges[k] for k in sorted(edges)]
    for key in ("initial", "terminal", "guard_columns", "patch_columns"):
        out[key] = sorted(set(old[key]) | set(new[key]))
    out["reason_codes"] = dict(sorted({**old["reason_codes"], **new["reason_codes"]}.items()))
    out["columns"] = dict(sorted({**new["columns"], **old["columns"]}.items()))
    indexes = {i["name"]: i for i in new["indexes"]} | {i["name"]: i for i in old["indexes"]}
    out["indexes"] = [indexes[k] for k in sorted(indexes)]
    for key, value in old.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict) and key not in (
                "states", "columns", "reason_codes"):
            out[key] = {**value, **out[key]}
    return out


def plan_open(recorded: Mapping[str, Normal], wanted: Iterable[Normal], probe: Probe
              ) -> Plan:
    """What opening with ``wanted`` does to a database that records ``recorded``.

    Additive changes migrate; what the opener lacks is kept; conflicts are refused.
    Entities the opener does not know are left alone.
    """
    plans: list[EntityPlan] = []
    for new in wanted:
        entity = new["entity"]
        old = recorded.get(entity)
        if old is None:
            plans.append(EntityPlan(entity, None, new, diff(None, new)))
            continue
        asked = diff(old, new)
        plan = EntityPlan(entity, old, old, [])
        plans.append(plan)
        plan.refusals = _conflicts(asked, old, new, probe, opening=True)
        merged = merge(old, new)
        plan.kept = [c for c in diff(merged, new) if c.action == "remove"] + [
            c for c in asked if c.action == "change" and c.kind in ("column", "index")]
        if not plan.refusals:
            plan.refusals = _terminal_conflicts(old, merged, probe)
        if any(c.action == "add" for c in asked):
            plan.changes = [c for c in diff(old, merged) if c.kind != "spec"]
            plan.new = merged
            if not plan.refusals:
                plan.refusals = _valid(plan, merged)
    _index_name_clashes(recorded, plans)
    return Plan(plans)


def _index_name_clashes(recorded: Mapping[str, Normal], plans: list[EntityPlan]) -> None:
    """An index added under a name another entity's recorded spec holds is refused.

    The loaded specs' own names are checked when they load; this is about names only the
    database still has (an index a spec retired, kept until ``migrate --apply``): the
    dialects create an index only if its name is absent, so the old one would silently
    stay in its place."""
    owners = {str(ix["name"]): (entity, str(normal["table"]))
              for entity, normal in recorded.items() for ix in normal["indexes"]}
    for plan in plans:
        had = {str(ix["name"]) for ix in (plan.old or {}).get("indexes", ())}
        for ix in (plan.new or {}).get("indexes", ()):
            name = str(ix["name"])
            owner = owners.get(name)
            if name in had or owner is None or owner[0] == plan.entity:
                continue
            change = Change(plan.entity, "index", "add", name)
            plan.refusals.append(Refusal(change, (
                f"the database already has an index named {name!r} (entity "
                f"{owner[0]!r}'s, on table {owner[1]!r}; a spec may have retired it, "
                "and it stays until `ledgerq migrate --apply`): choose another name")))


def _valid(plan: EntityPlan, merged: Normal) -> list[Refusal]:
    """The merged spec must itself be a valid spec (it is what the database enforces)."""
    try:
        to_policy(merged, f"<{plan.entity} merged with the database's spec>")
    except SpecError as exc:
        change = plan.changes[0] if plan.changes else Change(plan.entity, "spec", "change",
                                                              plan.entity)
        return [Refusal(change, f"the union with the database's spec is not a valid spec: "
                        f"{p.path}: {p.message}") for p in exc.problems]
    return []


def _terminal_conflicts(old: Normal, merged: Normal, probe: Probe) -> list[Refusal]:
    """A state terminal in one version with edges out of it in the other: no version
    order explains it (one of them gave a terminal state outgoing edges)."""
    edged = {e["from"] for e in merged["edges"]}
    out = []
    for state in sorted(set(merged["terminal"]) & edged):
        n, ids = probe.rows_in(old["table"], state)
        why = ("is terminal in the database's spec; these specs give it outgoing edges, "
               "so rows that ended there would move again" if state in old["terminal"] else
               "is terminal in these specs but has outgoing edges in the database's spec; "
               "removing its edges needs `ledgerq migrate --apply`")
        out.append(Refusal(Change(merged["entity"], "terminal", "change", state),
                           f"state {state!r} {why}", n, tuple(ids)))
    return out


def _conflicts(changes: list[Change], old: Normal, new: Normal, probe: Probe, *,
               opening: bool = False) -> list[Refusal]:
    """What no version order explains, checked against the data where it depends on it.

    ``opening``: a column whose type (or reference) differs from the database's is
    refused even while no row holds a value: the opener would check and write values
    against its own type while the database stores the recorded one (SQLite's affinity
    turned a text '12' into the integer 12, and the log no longer folded into the row).
    Only ``migrate --apply`` retypes a column."""
    out: list[Refusal] = []
    table = old["table"]
    for c in changes:
        if c.kind == "table":
            out.append(Refusal(c, "an entity's table cannot be renamed by a spec change"))
        elif c.kind == "column" and c.action == "add":
            col = new["columns"][c.name]
            if col["not_null"] and col["default"] is None:
                n, ids = probe.rows(table)
                if n:
                    out.append(Refusal(c, "a new NOT NULL column needs a default: existing "
                                       "rows have no value for it", n, tuple(ids)))
        elif c.kind == "column" and c.action == "change":
            a, b = old["columns"][c.name], new["columns"][c.name]
            if retyped(a, b) and opening:
                n, ids = probe.holding(table, c.name)
                out.append(Refusal(c, f"column {c.name!r} is {_column_kind(a)} in the "
                                   f"database's spec and {_column_kind(b)} in these specs; "
                                   "a process whose specs disagree with the database on a "
                                   "column's type may not open it (retype a column with "
                                   "`ledgerq migrate --apply`)", n, tuple(ids)))
            elif retyped(a, b):
                n, ids = probe.holding(table, c.name)
                if n:
                    out.append(Refusal(c, f"column {c.name!r} is retyped while rows hold "
                                       "values in it", n, tuple(ids)))
            elif b["not_null"] and not a["not_null"]:
                n, ids = probe.holding(table, c.name, null=True)
                if n:
                    out.append(Refusal(c, f"column {c.name!r} becomes NOT NULL while rows "
                                       "have no value in it", n, tuple(ids)))
    return out


# ---------------------------------------------------------------- applying


def plan_apply(recorded: Mapping[str, Normal], wanted: Iterable[Normal], probe: Probe,
               mappings: Iterable[StateMapping] = ()) -> Plan:
    """What makes the database's spec exactly ``wanted``, removals included.

    Removing what rows still use is refused unless a mapping moves those rows; every
    mapped row gets a fact with the reason code ``<domain>.<target>.migrated``, which
    the target spec must declare.
    """
    target: dict[str, Normal] = {n["entity"]: n for n in wanted}
    by_entity: dict[str, list[StateMapping]] = {}
    for m in mappings:
        by_entity.setdefault(m.entity, []).append(m)
    plans: list[EntityPlan] = []
    for entity in [*target, *(e for e in recorded if e not in target)]:
        old, new = recorded.get(entity), target.get(entity)
        plan = EntityPlan(entity, old, new, diff(old, new))
        plans.append(plan)
        if old is None:
            continue
        table = old["table"]
        maps = by_entity.pop(entity, [])
        if new is None:
            n, ids = probe.rows(table)
            if n:
                plan.refusals.append(Refusal(plan.changes[0], "its table still has rows",
                                             n, tuple(ids)))
            continue
        plan.refusals += _conflicts([c for c in plan.changes if c.action != "remove"],
                                    old, new, probe)
        edged = {e["from"] for e in new["edges"]}
        for state in sorted(set(old["terminal"]) & edged):
            n, ids = probe.rows_in(table, state)
            plan.refusals.append(Refusal(
                Change(entity, "terminal", "remove", state),
                f"terminal state {state!r} would get outgoing edges: rows that ended "
                "there would move again", n, tuple(ids)))
        mapped = {m.source for m in maps}
        for m in maps:
            problem = _mapping_problem(m, old, new)
            if problem:
                plan.refusals.append(Refusal(Change(entity, "state", "remove", m.source),
                                             problem))
                continue
            code = migrated_code(new, m.target)
            if code is None:
                plan.refusals.append(Refusal(
                    Change(entity, "state", "remove", m.source),
                    f"--map-state {m}: the spec declares no reason code for rows moved into "
                    f"{m.target!r}; add one named <domain>.{m.target}.migrated"))
                continue
            if probe.rows_in(table, m.source)[0]:
                plan.moves.append((m, code))
        for c in plan.changes:
            if c.action != "remove":
                continue
            if c.kind == "state" and c.name not in mapped:
                n, ids = probe.rows_in(table, c.name)
                if n:
                    plan.refusals.append(Refusal(
                        c, f"rows are in state {c.name!r}; move them with --map-state "
                        f"{entity}:{c.name}=STATE", n, tuple(ids)))
            elif c.kind == "column":
                n, ids = probe.holding(table, c.name)
                if n:
                    plan.refusals.append(Refusal(c, f"rows hold values in column {c.name!r}",
                                                 n, tuple(ids)))
        for c in plan.changes:
            # A state that becomes terminal settles every row in it: only if none is.
            if c.kind == "terminal" and c.action == "add" and c.name in old["states"] \
                    and c.name not in mapped:
                n, ids = probe.rows_in(table, c.name)
                if n:
                    plan.refusals.append(Refusal(
                        c, f"rows in {c.name!r} would become final; move them first with "
                        f"--map-state {entity}:{c.name}=STATE", n, tuple(ids)))
    for entity in by_entity:
        plan = EntityPlan(entity, recorded.get(entity), target.get(entity), [])
        plan.refusals.append(Refusal(Change(entity, "entity", "change", entity),
                                     "--map-state names an entity neither spec has"))
        plans.append(plan)
    return Plan(plans)


def _mapping_problem(m: StateMapping, old: Normal, new: Normal) -> str | None:
    if m.source not in old["states"]:
        return f"--map-state {m}: the database has no state {m.source!r}"
    if m.target not in new["states"]:
        return f"--map-state {m}: the target spec has no state {m.target!r}"
    if m.source in old["terminal"]:
        return f"--map-state {m}: rows in terminal state {m.source!r} never move"
    if m.source == m.target:
        return f"--map-state {m}: moves rows to the state they are in"
    return None


def migrated_code(new: Normal, target: str) -> str | None:
    """The reason code a mapped move records: the one ``*.<target>.migrated`` code."""
    codes = [c for c in new["reason_codes"] if c.split(".")[1:] == [target, "migrated"]]
    return codes[0] if len(codes) == 1 else None
