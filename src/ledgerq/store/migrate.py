"""Making a database's schema follow its specs, on either dialect, in one transaction.

The plan is pure (``ledgerq.lifecycle.evolution``); this module carries it out through
a :class:`Catalog`, which each dialect implements over one connection inside the
migration's transaction (``store/<dialect>/catalog.py``): reading what the database
records, answering the plan's questions about the data, and running the DDL. Nothing
here holds SQL. A refused plan raises :class:`~ledgerq.errors.MigrationRefused` before
anything is written; the caller's transaction rolls back whatever a failure leaves.
"""

from __future__ import annotations

import abc
import dataclasses
import time
from collections.abc import Iterable
from types import MappingProxyType

import msgspec

from ledgerq.errors import MigrationRefused
from ledgerq.lifecycle import evolution
from ledgerq.lifecycle.evolution import Change, Normal, Plan, StateMapping
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.lifecycle.moves import apply_move
from ledgerq.lifecycle.registry import EdgeRule, EntityPolicy, Registry, build_policy
from ledgerq.lifecycle.spec import EntitySpec
from ledgerq.lifecycle.store import EventStore


class Catalog(evolution.Probe, abc.ABC):
    """One dialect's view of a database's schema, inside the migration transaction."""

    @abc.abstractmethod
    def recorded(self) -> dict[str, Normal]:
        """The spec each entity was last migrated to ({} before any was recorded)."""

    @abc.abstractmethod
    def tables(self) -> set[str]: ...

    @abc.abstractmethod
    def table_states(self, table: str) -> list[str] | None:
        """The states the table's status CHECK admits (None: no CHECK found)."""

    @abc.abstractmethod
    def table_columns(self, table: str) -> list[str]: ...

    @abc.abstractmethod
    def table_indexes(self, table: str) -> set[str]: ...

    @abc.abstractmethod
    def create(self, policy: EntityPolicy) -> None:
        """Create the entity's table and indexes."""

    @abc.abstractmethod
    def alter(self, old: Normal, new: EntityPolicy, changes: list[Change]) -> None:
        """Make an existing table match ``new``; ``changes`` say what differs from ``old``."""

    @abc.abstractmethod
    def drop(self, table: str) -> None: ...

    @abc.abstractmethod
    def record(self, normal: Normal, now: float) -> None:
        """Record ``normal`` as the entity's spec (and keep it among its versions)."""

    @abc.abstractmethod
    def forget(self, entity: str) -> None: ...

    @abc.abstractmethod
    def ids_in(self, table: str, state: str) -> list[str]:
        """Every id in ``state`` (the rows a mapping moves)."""

    @abc.abstractmethod
    def tx(self) -> EventStore:
        """The dialect's transaction on this connection, for the facts of mapped moves."""


def wanted(registry: Registry) -> list[Normal]:
    return [evolution.policy_normal(p) for p in registry.policies()]


def on_open(catalog: Catalog, registry: Registry) -> Plan:
    """Migrate what the opener adds; keep what it lacks; refuse conflicts (writing
    nothing). Returns the plan carried out (empty when the database was current)."""
    recorded = _adopted(catalog, registry)
    plan = evolution.plan_open(recorded, wanted(registry), catalog)
    if plan.refusals:
        raise MigrationRefused(plan.refused_message())
    _carry_out(catalog, registry, plan)
    return plan


def needed(catalog: Catalog, registry: Registry) -> bool:
    """Whether opening must migrate: planned without a lock (reads only), so that opening
    a current database, or one that a newer version migrated, writes nothing and waits
    for no one. A conflict is refused here already, having changed nothing."""
    recorded = catalog.recorded()
    if all(recorded.get(n["entity"]) == n for n in wanted(registry)) and \
            {p.table for p in registry.policies()} <= catalog.tables():
        return False
    plan = evolution.plan_open(_adopted(catalog, registry), wanted(registry), catalog)
    if plan.refusals:
        raise MigrationRefused(plan.refused_message())
    return not plan.empty


def apply(catalog: Catalog, registry: Registry, mappings: Iterable[StateMapping] = (),
          *, dry_run: bool = False) -> Plan:
    """Make the database's specs exactly the registry's (``ledgerq migrate --apply``).

    The table first widens to the union of both versions, mapped rows then move (each
    with a fact), and only then does it narrow to the target, so every CHECK holds at
    every step. ``dry_run`` plans and checks without writing (``--plan``).
    """
    recorded = _adopted(catalog, registry)
    mappings = list(mappings)
    plan = evolution.plan_apply(recorded, wanted(registry), catalog, mappings)
    if dry_run:
        return plan
    if plan.refusals:
        raise MigrationRefused(plan.refused_message())
    now = time.time()
    by_entity = {p.name: p for p in registry.policies()}
    for ep in plan.entities:
        old, new = ep.old, ep.new
        if old is None or new is None or not (ep.records or ep.moves):
            continue
        union = evolution.merge(old, new)
        wide = _loose_policy(union)
        widen = [c for c in evolution.schema_changes(evolution.diff(old, union))
                 if c.action == "add"]
        if widen:
            catalog.alter(old, wide, widen)
        for mapping, code in ep.moves:
            _move_rows(catalog, wide, mapping, code, now)
        narrow = evolution.schema_changes(evolution.diff(union, new))
        if narrow:
            catalog.alter(union, by_entity[ep.entity], narrow)
    for ep in plan.entities:
        if ep.old is None and ep.new is not None:
            catalog.create(by_entity[ep.entity])
        elif ep.new is None and ep.old is not None:
            catalog.drop(ep.old["table"])
            catalog.forget(ep.entity)
        if ep.new is not None and ep.records:
            catalog.record(ep.new, now)
    return plan


def _carry_out(catalog: Catalog, registry: Registry, plan: Plan) -> None:
    now = time.time()
    by_entity = {p.name: p for p in registry.policies()}
    tables = catalog.tables()
    for ep in plan.entities:
        if not ep.records or ep.new is None:
            continue
        if ep.old is None:
            if by_entity[ep.entity].table not in tables:
                catalog.create(by_entity[ep.entity])
        elif ep.schema_changes:
            target = by_entity[ep.entity] if ep.new == evolution.policy_normal(
                by_entity[ep.entity]) else evolution.to_policy(ep.new, "<database spec>")
            catalog.alter(ep.old, target, ep.schema_changes)
        catalog.record(ep.new, now)


def _adopted(catalog: Catalog, registry: Registry) -> dict[str, Normal]:
    """The recorded specs, plus what a database from before specs were recorded shows.

    Such a table's structure is read back (its CHECK's states, its columns and index
    names) and described as the opener's spec minus what the table lacks, so the usual
    diff migrates exactly the difference. A table with states the specs do not declare
    cannot be described that way and is refused.
    """
    recorded = catalog.recorded()
    tables = catalog.tables()
    for entity in [e for e, n in recorded.items() if n["table"] not in tables]:
        del recorded[entity]  # its table was dropped by hand: created again, empty
    for policy in registry.policies():
        if policy.name in recorded or policy.table not in tables:
            continue
        normal = evolution.policy_normal(policy)
        states = catalog.table_states(policy.table)
        if states is not None:
            extra = [s for s in states if s not in normal["states"]]
            if extra:
                raise MigrationRefused(
                    f"table {policy.table} (from before ledgerq recorded specs) admits "
                    f"state(s) {', '.join(extra)} that the {policy.name} spec does not "
                    "declare; open it with specs that declare them")
            keep = set(states)
            normal["states"] = {s: v for s, v in normal["states"].items() if s in keep}
            normal["edges"] = [e for e in normal["edges"]
                               if e["from"] in keep and e["to"][0] in keep]
            for key in ("initial", "terminal"):
                normal[key] = [s for s in normal[key] if s in keep]
        columns = set(catalog.table_columns(policy.table))
        normal["columns"] = {c: v for c, v in normal["columns"].items() if c in columns}
        indexes = catalog.table_indexes(policy.table)
        normal["indexes"] = [i for i in normal["indexes"] if i["name"] in indexes]
        recorded[policy.name] = normal
    return recorded


def _loose_policy(normal: Normal) -> EntityPolicy:
    """A policy for the union of two versions, whatever its graph: it only renders the
    widened table and lets mapped moves through, so it is built without graph checks
    (every state initial and terminal, no edges: nothing to reach, nothing to check)."""
    states = list(normal["states"])
    loose = {**normal, "edges": [], "initial": states, "terminal": states}
    return build_policy(msgspec.convert(loose, type=EntitySpec), "<migration>")


def _move_rows(catalog: Catalog, wide: EntityPolicy, mapping: StateMapping, code: str,
               now: float) -> None:
    """Move every row in ``mapping.source`` to its target, each with a fact."""
    policy = dataclasses.replace(
        wide,
        edges=MappingProxyType({**wide.edges, mapping.source: frozenset({mapping.target})}),
        edge_rules=MappingProxyType({**wide.edge_rules, (mapping.source, mapping.target):
                                     EdgeRule(None, frozenset(), frozenset(), "migration")}),
        patch_columns=frozenset(),
    )
    tx = catalog.tx()
    reason = StateReason(code=code, summary=f"ledgerq migrate --map-state {mapping}")
    actor = Actor(type="operator", id="ledgerq migrate")
    for entity_id in catalog.ids_in(wide.table, mapping.source):
        done = apply_move(tx, policy, entity_id, mapping.source, mapping.target, reason,
                          actor, now=now)
        if not done.applied:
            raise MigrationRefused(f"--map-state {mapping}: {entity_id} moved during the "
                                   "migration; nothing was changed")
