"""Creating entities: a projection row in an initial state and its creation fact, which
carries the row as stored, so that folding the log recreates the row exactly."""

from __future__ import annotations

import math
import time
from typing import Any, NamedTuple

from ledgerq.codec import dumps
from ledgerq.errors import ActorNotAllowed, InvalidInput
from ledgerq.lifecycle.entering import entered
from ledgerq.lifecycle.facts import Fact, make_fact, reason_json, tuple_new
from ledgerq.lifecycle.ids import new_id
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.lifecycle.policy_cache import CACHES, PLAN_LIMIT, cache_of
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import EventStore
from ledgerq.lifecycle.values import (
    DEFAULT_AS_JSON,
    INT64_MAX,
    INT64_MIN,
    check_reason,
    check_values,
)


def create_entity(tx: EventStore, policy: EntityPolicy, values: dict[str, Any], *,
                  reason: StateReason, actor: Actor, now: float | None = None,
                  idempotency_key: str | None = None) -> str:
    """Insert a projection row in an initial state plus its creation fact (in-transaction).

    The fact carries the row as stored (after type affinity, database defaults
    included), so folding the log recreates the row exactly: the values sent where the
    column keeps them as sent (``EventStore.exact_types``), the rest read back (or, on
    PostgreSQL, taken by the server in the same statement).
    """
    ts = time.time() if now is None else now
    check_actor(policy, actor)
    row, sent = _creation(tx, policy, values, reason, ts)
    if sent is not None:
        if tx.stores_as_sent:
            # The patch is known but for what only the database knows: one statement.
            _create_with_facts(tx, policy, [row], [sent], reason, actor, ts,
                               idempotency_key)
            return str(row["id"])
        # The patch is known but for the columns the row is read back for (defaults the
        # database fills in, JSON text it may convert): the row reads back only those.
        patch, stored = sent
        patch.update(tx.insert_entity(policy, row, returning=stored))
    else:
        patch = _initial_patch(tx.insert_entity(policy, row), policy)
    fact = make_fact(new_id(), policy.name, row["id"], None, row["status"], reason, actor, ts,
                     1, patch, idempotency_key)
    tx.append_facts((fact,))
    if policy.on_enter:
        entered(tx, policy, (fact,))
    return str(row["id"])


#: Columns a creation fact's patch leaves out: the fact records them in fields of its own.
_NOT_IN_PATCH = ("status", "version")


class SentPlan(NamedTuple):
    """What every creation of one shape (the columns it sends) on one dialect shares."""

    #: Each sent column the patch takes: (name, the type whose values the dialect stores
    #: exactly, or None; whether it is JSON; whether it has a default).
    sent: tuple[tuple[str, type | None, bool, bool], ...]
    #: Unsent columns whose spec default the dialect stores exactly: the creation sends
    #: the default itself, so its patch knows the value without asking the database.
    filled: dict[str, Any]
    #: The unsent columns the database fills with their defaults.
    defaulted: tuple[str, ...]


#: How a JSON text the dialect stores as sent begins: an object, an array or a string
#: (SQLite's JSON columns would convert text that reads as a number).
_JSON_KEPT = ("{", "[", '"')


def sent_plan(tx: EventStore, policy: EntityPolicy, columns: tuple[str, ...]) -> SentPlan | None:
    """The plan of creations that send ``columns``, kept in the policy's cache by the
    dialect and the columns; None where :func:`_sent_patch` gives None."""
    plans: dict[tuple[Any, ...], SentPlan | None] = (
        CACHES.get(id(policy)) or cache_of(policy)).sent_plans
    key = (type(tx), columns)
    if key in plans:
        return plans[key]
    if len(plans) >= PLAN_LIMIT:
        plans.clear()
    exact = tx.exact_types
    defaults = policy.defaulted
    given = set(columns)
    sent: list[tuple[str, type | None, bool, bool]] = []
    filled: dict[str, Any] = {}
    defaulted: list[str] = []
    plan: SentPlan | None = None
    for col, column in policy.columns.items():
        if col in _NOT_IN_PATCH:
            continue
        if col in given:
            sent.append((col, exact.get(column.type), column.type == "json", col in defaults))
        elif col in defaults:
            default = column.default
            if column.type != "json" and type(default) is exact.get(column.type) and (
                    type(default) is not float
                    or (_isfinite(default) and math.copysign(1.0, default) > 0)):
                filled[col] = default
            elif tx.stores_as_sent and column.type not in DEFAULT_AS_JSON:
                break  # (None: see _sent_patch)
            else:
                defaulted.append(col)
    else:
        plan = SentPlan(tuple(sent), filled, tuple(defaulted))
    plans[key] = plan
    return plan


#: What :func:`_sent_patch` gives when a value needs :func:`check_values`' full look
#: (told by identity: a patch of its shape, never one :func:`_sent_patch` makes).
_UNCHECKED: tuple[dict[str, Any], tuple[str, ...]] = ({}, ())
_isfinite = math.isfinite


def _sent_patch(tx: EventStore, policy: EntityPolicy, row: dict[str, Any], *, checked: bool = False
                ) -> tuple[dict[str, Any], tuple[str, ...]] | None:
    """:func:`_initial_patch` of ``row`` before it is stored, where the values sent are
    what the row will store: the patch of the sent values (unsent columns' spec defaults
    that the dialect stores exactly added to the row and the patch alike), and the
    columns whose stored value only the database knows (other defaults it fills in; JSON
    text it normalizes, as PostgreSQL's jsonb does, or may convert, as SQLite's affinity
    does text that reads as a number). None where a value would be converted otherwise
    (an int sent to a float column, a bool to SQLite's integer, -0.0 to SQLite's REAL,
    which keeps 0.0), or where PostgreSQL would give a default as JSON other than a read
    would.

    Unless ``checked`` (the row's values passed :func:`check_values`), it looks at every
    value as check_values' quick path would, in the same loop (a creation's values are
    then looked at once, not twice), and gives :data:`_UNCHECKED` for any value that
    quick look does not vouch for: the caller then runs the full checks, which name
    what is wrong, and asks again.
    """
    plan = sent_plan(tx, policy, tuple(row))
    if plan is None:
        return None if checked else _UNCHECKED
    patch: dict[str, Any] = {}
    stored = plan.defaulted
    for col, exact, json, defaulted in plan.sent:
        value = row[col]
        if value is None:
            if defaulted:
                patch[col] = None
            continue
        kind = type(value)
        if not checked and not (
                (kind is exact or (json and kind is str)) and (
                    value.isascii() and "\x00" not in value if kind is str
                    else _isfinite(value) if kind is float
                    else INT64_MIN <= value <= INT64_MAX if kind is int
                    else kind is bool)):
            return _UNCHECKED
        if kind is exact and (not json or value[:1] in _JSON_KEPT) and (
                kind is not float or value or math.copysign(1.0, value) > 0):
            patch[col] = value
        elif json:
            stored = (*stored, col)
        else:
            return None
    if plan.filled:
        row.update(plan.filled)
        patch.update(plan.filled)
    return patch, stored


def _initial_patch(stored: dict[str, Any], policy: EntityPolicy) -> dict[str, Any]:
    """A creation fact's patch: every non-NULL column of the stored row, and every NULL
    one that has a default.

    A column it does not name is its default (:func:`fold` starts from the columns'
    defaults: a column a migration adds later gives older rows its default); leaving
    the other NULLs out halves a typical creation fact, and the log's pages are written
    by every submit's commit.
    """
    defaults = policy.defaulted
    return {k: v for k, v in stored.items()
            if (v is not None or k in defaults) and k not in _NOT_IN_PATCH}


def _creation(tx: EventStore, policy: EntityPolicy, values: dict[str, Any], reason: StateReason,
              ts: float) -> tuple[dict[str, Any], tuple[dict[str, Any], tuple[str, ...]] | None]:
    """The INSERT's column -> value map for a new row, and its creation fact's patch as
    sent (:func:`_sent_patch`); ValueError before anything is written."""
    row = _creation_row(policy, values, reason, ts)
    sent = _sent_patch(tx, policy, row)
    if sent is _UNCHECKED:
        for col in check_values(policy, "creation", values, json_text=True):
            row[col] = dumps(row[col])  # (to_sql, only where it converts)
        sent = _sent_patch(tx, policy, row, checked=True)
    return row, sent


def _creation_row(policy: EntityPolicy, values: dict[str, Any], reason: StateReason,
                  ts: float) -> dict[str, Any]:
    """The INSERT's column -> value map for a new row, its values not yet looked at (see
    :func:`_creation`); ValueError before anything is written."""
    status = values.get("status")
    if status not in policy.initial:
        raise ValueError(
            f"{policy.name} must be created in an initial state "
            f"({', '.join(sorted(policy.initial))}), not {status!r}"
        )
    check_reason(policy, reason)
    if not policy.columns.keys() >= values.keys():
        unknown = sorted(set(values) - set(policy.columns))
        raise InvalidInput(f"{policy.table} has no column(s) {', '.join(unknown)}")
    if not _CREATION_MAINTAINED.isdisjoint(values):
        # The engine writes these from the reason; a value would be dropped.
        maintained = sorted(_CREATION_MAINTAINED & values.keys())
        raise InvalidInput(f"{policy.name} column(s) {', '.join(maintained)} are maintained "
                           "by the engine and cannot be given at creation")
    row = dict(values)
    if "id" not in row:  # (setdefault would make an id every time)
        row["id"] = new_id()
    row.setdefault("created_at", ts)
    row["version"] = 1
    row["status_reason_code"] = reason.code
    row["status_reason_summary"] = reason.summary
    row["status_evidence_refs"] = reason_json(reason.evidence_refs)
    return row


_CREATION_MAINTAINED = frozenset({"version", "status_reason_code", "status_reason_summary",
                                  "status_evidence_refs"})

#: Rows read back at once.
_READBACK_CHUNK = 500


def check_actor(policy: EntityPolicy, actor: Actor) -> None:
    """The actor's type is one the entity's spec admits (its ``actors``)."""
    if actor.type not in policy.actors:
        raise ActorNotAllowed(f"{policy.name} is created and moved by actor types "
                              f"{', '.join(sorted(policy.actors))}; got {actor.type!r}")


def create_entities(tx: EventStore, policy: EntityPolicy,
                    values: list[dict[str, Any]], *, reason: StateReason, actor: Actor,
                    now: float | None = None) -> list[str]:
    """:func:`create_entity` for many rows at once (in-transaction), in the given order.

    Same rows and the same creation facts (each carrying its row as stored). Where the
    values sent are what the rows store (PostgreSQL), each row and its fact are one
    statement, sent together per run of rows of the same shape; otherwise one
    ``executemany`` per run of rows that name the same columns, one read-back per chunk
    of ids and one ``executemany`` for the facts. Every row is checked before the first
    is written.
    """
    check_actor(policy, actor)
    ts = time.time() if now is None else now
    made = [_creation(tx, policy, v, reason, ts) for v in values]
    rows = [row for row, _ in made]
    sent = [patch for _, patch in made]
    plans = [s for s in sent if s is not None]
    exact = bool(rows) and len(plans) == len(rows)
    if exact and tx.stores_as_sent:
        _create_with_facts(tx, policy, rows, plans, reason, actor, ts)
        return [str(r["id"]) for r in rows]
    start = 0
    while start < len(rows):  # consecutive rows with the same columns share one INSERT
        cols = tuple(rows[start])
        end = start + 1
        while end < len(rows) and tuple(rows[end]) == cols:
            end += 1
        tx.insert_entities(policy, cols, [list(r.values()) for r in rows[start:end]])
        start = end
    evidence = dumps(reason.evidence_refs)
    metadata = dumps(reason.metadata)
    facts: list[Fact] = []
    for i in range(0, len(rows), _READBACK_CHUNK):
        part = rows[i:i + _READBACK_CHUNK]
        ids = [r["id"] for r in part]
        if exact:
            # Each patch is known but for its row's columns to read back (see
            # create_entity): only those are read, of the rows that have any.
            wanted = {c: None for _, read in plans[i:i + _READBACK_CHUNK] for c in read}
            stored = {r["id"]: r for r in tx.read_entities(
                policy, ids, columns=("id", *wanted))} if wanted else {}
            patches = [{**patch, **{c: stored[row["id"]][c] for c in read}}
                       for row, (patch, read) in zip(part, plans[i:i + _READBACK_CHUNK],
                                                     strict=True)]
        else:
            stored = {r["id"]: r for r in tx.read_entities(policy, ids)}
            patches = [_initial_patch(stored[row["id"]], policy) for row in part]
        for row, patch in zip(part, patches, strict=True):
            # make_fact's fields, the reason's JSON encoded once for every row.
            facts.append(tuple_new(Fact, (
                new_id(), policy.name, row["id"], None, row["status"], reason.code,
                reason.summary, evidence, actor.type, actor.id, ts, metadata, 1,
                dumps(patch), None)))
    tx.append_facts(facts)
    if policy.on_enter:
        entered(tx, policy, facts)
    return [str(r["id"]) for r in rows]


def _create_with_facts(tx: EventStore, policy: EntityPolicy, rows: list[dict[str, Any]],
                       sent: list[tuple[dict[str, Any], tuple[str, ...]]],
                       reason: StateReason, actor: Actor, ts: float,
                       idempotency_key: str | None = None) -> None:
    """Rows and their creation facts, one statement each, sent together per run of
    consecutive rows with the same columns and the same columns left to the database."""
    start = 0
    while start < len(rows):
        shape = (tuple(rows[start]), sent[start][1])
        end = start + 1
        while end < len(rows) and (tuple(rows[end]), sent[end][1]) == shape:
            end += 1
        made = [(list(row.values()), make_fact(new_id(), policy.name, row["id"], None,
                                               row["status"], reason, actor, ts, 1, patch,
                                               idempotency_key))
                for row, (patch, _) in zip(rows[start:end], sent[start:end], strict=True)]
        tx.insert_entities_with_facts(policy, shape[0], made, shape[1])
        if policy.on_enter:
            entered(tx, policy, [fact for _, fact in made])
        start = end
