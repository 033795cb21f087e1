"""The engine's operations (:class:`ledgerq.lifecycle.store.EventStore`), once for both dialects.

Moves (the compare-and-swap, with its fact), claims, creation, the log, and what verify
and rebuild read and write. A dialect overrides what it does better in one statement.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from ledgerq.codec import dumps, loads
from ledgerq.lifecycle.facts import Fact, tuple_new
from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import ClaimFacts, EventStore, Row, SentMove
from ledgerq.store.sqltx.base import CHUNK, SqlBase


class Swap(NamedTuple):
    """A compare-and-swap statement for one shape of move (:meth:`EventOps.prepare_swap`)."""

    text: str
    #: The columns it returns, in order; None: the whole row (named by the cursor).
    names: tuple[str, ...] | None


class EventOps(SqlBase, EventStore):
    """The engine's operations over the connection."""

    stores_as_sent: bool = False
    exact_types: Mapping[str, type] = MappingProxyType({})

    # ------------------------------------------------------------ moves, claims, creation

    def read_for_move(self, policy: EntityPolicy, entity_id: str,
                      guard_cols: tuple[str, ...], *, skip_locked: bool = False
                      ) -> tuple[Any, ...] | None:
        key = ("select", policy.table, guard_cols, skip_locked)
        sql = self._texts.get(key)
        if sql is None:
            cols = ", ".join(["status", "version", *(quote(c) for c in guard_cols)])
            sql = self._texts[key] = self.q(
                "read_for_move_skip_locked" if skip_locked else "read_for_move",
                table=self.table(policy), columns=cols)
        row: tuple[Any, ...] | None = self.execute(sql, (entity_id,)).fetchone()
        return row

    def update_entity(self, policy: EntityPolicy, entity_id: str, *, observed: str,
                      version: int | None, to_state: str | None, changes: dict[str, Any],
                      guards: dict[str, Any], returning: tuple[str, ...] | None,
                      skip_locked: bool = False) -> Row | None:
        statement = self.prepare_swap(policy, same_state=to_state is None,
                                      change_cols=tuple(changes), guard_cols=tuple(guards),
                                      read=version is not None, skip_locked=skip_locked,
                                      returning=returning)
        return self.swap(statement, entity_id, observed, version, to_state,
                         changes.values(), guards.values())

    def prepare_swap(self, policy: EntityPolicy, *, same_state: bool,
                     change_cols: tuple[str, ...], guard_cols: tuple[str, ...], read: bool,
                     skip_locked: bool, returning: tuple[str, ...] | None) -> Swap:
        text = self.update_text(policy, same_state, change_cols, guard_cols, not read,
                                skip_locked, returning)
        return Swap(text, None if returning is None else returning or ("id",))

    def swap(self, statement: Swap, entity_id: str, observed: str, version: int | None,
             to_state: str | None, changes: Iterable[Any], guards: Iterable[Any]
             ) -> Row | None:
        cur = self.execute(statement.text, self.update_params(entity_id, observed, version,
                                                              to_state, changes, guards))
        stored = cur.fetchall()
        if len(stored) != 1:
            return None
        names = statement.names if statement.names is not None else self.names(cur)
        return dict(zip(names, stored[0], strict=True))

    def update_text(self, policy: EntityPolicy, same_state: bool, change_cols: tuple[str, ...],
                    guard_cols: tuple[str, ...], unread: bool, skip_locked: bool,
                    returning: tuple[str, ...] | None) -> str:
        """The swap's UPDATE for one shape of move (remembered per shape); ``returning``
        the columns it returns (None: every column)."""
        key = ("update", policy.table, same_state, change_cols, guard_cols, returning,
               unread, skip_locked)
        sql = self._texts.get(key)
        if sql is None:
            # A same-state move (a lease renewal) leaves status as it is (the WHERE pins
            # it): assigning it would re-check the CHECK constraint and touch every index
            # whose WHERE names status, which doubles the UPDATE's cost on SQLite.
            sets = [*change_cols] if unread else ["version", *change_cols]
            if not same_state:
                sets.insert(0, "status")
            name = "update_entity" if not unread else \
                "update_entity_unread_skip_locked" if skip_locked else "update_entity_unread"
            sql = self._texts[key] = self.q(
                name, table=self.table(policy),
                assignments=", ".join(self.q("assign", column=quote(c)) for c in sets),
                guards=" ".join(self.q("guard_term", column=quote(c)) for c in guard_cols),
                returning="*" if returning is None else
                ", ".join(quote(c) for c in returning or ("id",)))
        return sql

    @staticmethod
    def update_params(entity_id: str, observed: str, version: int | None,
                      to_state: str | None, changes: Iterable[Any],
                      guards: Iterable[Any]) -> list[Any]:
        """:meth:`update_text`'s parameters, in its placeholders' order (``changes`` and
        ``guards``: the values, in the order of the text's columns)."""
        moved = () if to_state is None else (to_state,)
        if version is None:
            return [*moved, *changes, entity_id, observed, *guards]
        return [*moved, version + 1, *changes, entity_id, observed, version, *guards]

    def update_entities_with_facts(self, policy: EntityPolicy, moves: Sequence[SentMove]
                                   ) -> list[int | None]:
        # Two statements a move, one move after the other (a dialect that can do better
        # overrides this).
        out: list[int | None] = []
        for m in moves:
            after = self.update_entity(policy, m.entity_id, observed=m.observed,
                                       version=m.version, to_state=m.to_state,
                                       changes=m.changes, guards=m.guards,
                                       returning=("version",), skip_locked=m.skip_locked)
            if after is None:
                out.append(None)
                continue
            new_version: int = after["version"]
            self.append_facts((m.fact._replace(entity_version=new_version),))
            out.append(new_version)
        return out

    def claim_entities_with_facts(self, policy: EntityPolicy,
                                  rows: Sequence[tuple[str, Row, Row]], *, observed: str,
                                  to_state: str, changes: Row, limit: int,
                                  facts: ClaimFacts) -> list[Row]:
        # The claims, then their facts from the rows as stored (a dialect that can do
        # both in one statement overrides this).
        stored = self.claim_entities(policy, rows, observed=observed, to_state=to_state,
                                     changes=changes, limit=limit)
        # What every claim's fact shares, read once a pass (a Fact's field is a descriptor
        # lookup): all but its id, entity id, version and patch.
        f = facts.fields
        entity_type, key = f.entity_type, f.idempotency_key
        shared = (f.previous_status, f.status, f.reason_code, f.reason_summary,
                  f.evidence_refs, f.source, f.actor, f.created_at, f.metadata)
        self.append_facts([
            tuple_new(Fact, (fact_id, entity_type, after["id"], *shared, after["version"],
                             dumps({**facts.common, **{c: after[c] for c in facts.stored}}),
                             key))
            for fact_id, after in zip(facts.ids, stored, strict=False)])
        return stored

    def claim_entities(self, policy: EntityPolicy, rows: Sequence[tuple[str, Row, Row]], *,
                       observed: str, to_state: str, changes: Row, limit: int) -> list[Row]:
        # One swap per row, in order (SQLite: one writer at a time, nothing is skipped),
        # every row the same statement (the rows give the same columns, maybe in another
        # order: each row's values are taken in the statement's).
        got: list[Row] = []
        if not rows:
            return got
        change_cols = tuple({**changes, **rows[0][2]})
        guard_cols = tuple(rows[0][1])
        statement = self.prepare_swap(
            policy, same_state=False, change_cols=change_cols, guard_cols=guard_cols,
            read=False, skip_locked=True, returning=None)
        for entity_id, guards, patch in rows:
            if len(got) >= limit:
                break
            # The values in the statement's column order (a row may name its columns in
            # another order than the first row: only then are they reordered).
            merged = {**changes, **patch}
            if tuple(merged) != change_cols:
                merged = {c: merged[c] for c in change_cols}
            if tuple(guards) != guard_cols:
                guards = {c: guards[c] for c in guard_cols}
            row = self.swap(statement, entity_id, observed, None, to_state,
                            merged.values(), guards.values())
            if row is not None:
                got.append(row)
        return got

    def find_fact_by_idempotency_key(self, entity_type: str, entity_id: str,
                                     key: str) -> tuple[str, str | None, str] | None:
        row: tuple[str, str | None, str] | None = self.execute(
            self.q("find_fact_by_idempotency_key"), (entity_type, entity_id, key)).fetchone()
        return row

    def append_facts(self, facts: Sequence[Sequence[Any]]) -> None:
        # Each fact as a copy ([:]), which for a Fact is a plain tuple: the drivers bind
        # a plain tuple's items in C, a tuple subclass's one by one through Python-level
        # indexing, a microsecond more a fact (sqlite3's cost, measured).
        if len(facts) == 1:
            self.execute(self.q("append_fact"), facts[0][:])
        elif facts:
            self.executemany(self.q("append_fact"), [f[:] for f in facts])

    def insert_entity(self, policy: EntityPolicy, row: dict[str, Any], *,
                      returning: tuple[str, ...] | None = None) -> Row:
        cols = tuple(row)
        key = ("insert1", policy.table, cols, returning)
        sql = self._texts.get(key)
        if sql is None:
            sql = self._texts[key] = self.q(
                "insert_entity", table=self.table(policy),
                columns=", ".join(quote(c) for c in cols), marks=self.marks(len(cols)),
                returning=" RETURNING *" if returning is None else
                " RETURNING " + ", ".join(quote(c) for c in returning) if returning else "")
        cur = self.execute(sql, list(row.values()))
        if returning is None:
            return self.dicts(cur)[0]
        return dict(zip(returning, cur.fetchone(), strict=True)) if returning else {}

    def insert_entities_with_facts(self, policy: EntityPolicy, columns: tuple[str, ...],
                                   rows: Sequence[tuple[Sequence[Any], Fact]],
                                   stored: tuple[str, ...]) -> None:
        # Two statements a row (a dialect that can do both in one overrides this).
        for values, fact in rows:
            after = self.insert_entity(policy, dict(zip(columns, values, strict=True)))
            patch = {**loads(fact.patch), **{c: after[c] for c in stored}}
            self.append_facts((fact._replace(patch=dumps(patch)),))

    def insert_entities(self, policy: EntityPolicy, columns: tuple[str, ...],
                        rows: Iterable[Sequence[Any]]) -> None:
        sql = self.q("insert_entities", table=self.table(policy),
                     columns=", ".join(quote(c) for c in columns),
                     marks=self.marks(len(columns)))
        self.executemany(sql, rows)

    def read_entities(self, policy: EntityPolicy, ids: Sequence[str], *,
                      columns: tuple[str, ...] | None = None) -> list[Row]:
        return self._chunked_rows("read_entities", policy, ids, columns="*" if columns is None
                                  else ", ".join(quote(c) for c in columns))

    def lock_key(self, key: str) -> None:
        return None

    @contextlib.contextmanager
    def savepoint(self) -> Iterator[None]:
        self.execute(self.q("savepoint"))
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # the connection may be gone already
                self.execute(self.q("rollback_to_savepoint"))
                self.execute(self.q("release_savepoint"))
            raise
        self.execute(self.q("release_savepoint"))

    # ------------------------------------------------------------ the log, verify, rebuild

    def read_facts(self, entity_type: str, entity_id: str) -> list[Row]:
        return self.dicts(self.execute(self.q("read_facts"), (entity_type, entity_id)))

    def read_facts_of(self, entity_type: str, ids: Sequence[str]) -> list[Row]:
        out: list[Row] = []
        ordered = sorted(set(ids))
        for i in range(0, len(ordered), CHUNK):
            part = ordered[i:i + CHUNK]
            sql = self.q("read_facts_of", marks=self.marks(len(part)))
            out += self.dicts(self.execute(sql, (entity_type, *part)))
        return out

    def stream_facts(self, entity_type: str) -> Iterator[tuple[str, str, int, Any]]:
        return self.stream(self.q("stream_facts"), (entity_type,))[1]

    def stream_entities(self, policy: EntityPolicy) -> Iterator[Row]:
        names, rows = self.stream(self.q("stream_entities", table=self.table(policy)))
        return (dict(zip(names, r, strict=True)) for r in rows)

    def delete_entities(self, policy: EntityPolicy) -> None:
        self.execute(self.q("delete_entities", table=self.table(policy)))
