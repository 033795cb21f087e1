"""The operations of :class:`ledgerq.operations.Tx` over a DB-API connection, once.

Both dialects run the same Python for each operation: which statement (by name from
the dialect's ``queries.sql``), which parameters, what comes back. Only the text
differs, plus the few operations a dialect overrides (savepoints, deferred checks,
row locks, streaming). No SQL text lives here: every statement and every fragment
(an assignment, a guard term) is a named template of the dialect; this module joins
lists of quoted identifiers and fragments.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar, NamedTuple

from ledgerq.codec import dumps, loads
from ledgerq.lifecycle.facts import Fact, tuple_new
from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import SUCCEEDED, EntityPolicy
from ledgerq.operations import (
    CANDIDATE_COLUMNS,
    DEFAULT_QUEUE,
    PRIORITY_COLUMN,
    QUEUE_COLUMN,
    SLOT_COLUMN,
    ClaimFacts,
    Row,
    SentMove,
    Tx,
    expired_columns,
    lease_columns,
)
from ledgerq.store.queries import Queries

#: ledgerq's record of archives (schema version 4).
ARCHIVES_TABLE = "ledgerq_archives"
#: Ids bound per ``IN (...)`` statement (under SQLite's bound-parameter limit).
CHUNK = 500


class Swap(NamedTuple):
    """A compare-and-swap statement for one shape of move (:meth:`SqlTx.swap_statement`)."""

    text: str
    #: The columns it returns, in order; None: the whole row (named by the cursor).
    names: tuple[str, ...] | None


class SqlTx(Tx):
    """One transaction on a DB-API connection; subclasses name the dialect's queries."""

    queries: ClassVar[Queries]
    #: The dialect's positional placeholder.
    mark: ClassVar[str]
    #: What ``LIMIT ?`` takes for "no limit".
    no_limit: ClassVar[Any]

    #: Statement texts per shape (table, columns, ...), built once per dialect: a hot move
    #: (a lease renewal) must not rebuild its SQL on every call, and the driver finds its
    #: prepared statement by the text.
    _texts: ClassVar[dict[tuple[Any, ...], str]]

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    # ------------------------------------------------------------ plumbing

    def q(self, name: str, **fields: Any) -> str:
        return self.queries(name, **fields)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        raise NotImplementedError

    def stream(self, sql: str, params: Sequence[Any] = ()
               ) -> tuple[list[str], Iterator[tuple[Any, ...]]]:
        """Column names and the rows one at a time; a dialect whose cursor buffers the
        whole result overrides this."""
        cur = self.execute(sql, params)
        return self.names(cur), iter(cur)

    def marks(self, n: int) -> str:
        return ", ".join([self.mark] * n)

    @staticmethod
    def names(cur: Any) -> list[str]:
        """The column names of a cursor's result."""
        return [d[0] for d in cur.description]

    @classmethod
    def dicts(cls, cur: Any) -> list[Row]:
        names = cls.names(cur)
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]

    def hint(self, policy: EntityPolicy, state: str, column: str) -> str:
        """A term implied by ``status = state`` that lets the planner pick the partial
        index on ``column`` (SQLite needs it; PostgreSQL proves implication itself)."""
        return self.q("true")

    def table(self, policy: EntityPolicy) -> str:
        return quote(policy.table)

    def _chunked_rows(self, name: str, policy: EntityPolicy, ids: Sequence[str],
                      **fields: Any) -> list[Row]:
        out: list[Row] = []
        for i in range(0, len(ids), CHUNK):
            part = list(ids[i:i + CHUNK])
            sql = self.q(name, table=self.table(policy), marks=self.marks(len(part)),
                         **fields)
            out += self.dicts(self.execute(sql, part))
        return out

    def _limit(self, limit: int | None) -> Any:
        return self.no_limit if limit is None else limit

    # ------------------------------------------------------------ the engine

    def entity_for_move(self, policy: EntityPolicy, entity_id: str,
                        guard_cols: tuple[str, ...], *, skip_locked: bool = False
                        ) -> tuple[Any, ...] | None:
        key = ("select", policy.table, guard_cols, skip_locked)
        sql = self._texts.get(key)
        if sql is None:
            cols = ", ".join(["status", "version", *(quote(c) for c in guard_cols)])
            sql = self._texts[key] = self.q(
                "entity_for_move_skip_locked" if skip_locked else "entity_for_move",
                table=self.table(policy), columns=cols)
        row: tuple[Any, ...] | None = self.execute(sql, (entity_id,)).fetchone()
        return row

    def update_entity(self, policy: EntityPolicy, entity_id: str, *, observed: str,
                      version: int | None, to_state: str | None, changes: dict[str, Any],
                      guards: dict[str, Any], returning: tuple[str, ...] | None,
                      skip_locked: bool = False) -> Row | None:
        statement = self.swap_statement(policy, same_state=to_state is None,
                                        change_cols=tuple(changes), guard_cols=tuple(guards),
                                        read=version is not None, skip_locked=skip_locked,
                                        returning=returning)
        return self.swap(statement, entity_id, observed, version, to_state,
                         changes.values(), guards.values())

    def swap_statement(self, policy: EntityPolicy, *, same_state: bool,
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
        statement = self.swap_statement(
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

    def fact_by_idempotency_key(self, entity_type: str, entity_id: str,
                                key: str) -> tuple[str, str | None, str] | None:
        row: tuple[str, str | None, str] | None = self.execute(
            self.q("fact_by_idempotency_key"), (entity_type, entity_id, key)).fetchone()
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

    def entities_by_id(self, policy: EntityPolicy, ids: Sequence[str], *,
                       columns: tuple[str, ...] | None = None) -> list[Row]:
        return self._chunked_rows("entities_by_id", policy, ids, columns="*" if columns is None
                                  else ", ".join(quote(c) for c in columns))

    def entity_row(self, policy: EntityPolicy, entity_id: str) -> Row | None:
        rows = self.dicts(self.execute(self.q("entity_row", table=self.table(policy)),
                                       (entity_id,)))
        return rows[0] if rows else None

    def statuses(self, policy: EntityPolicy, ids: Sequence[str]) -> dict[str, str]:
        return {r["id"]: r["status"] for r in self._chunked_rows("statuses", policy, ids)}

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

    # ------------------------------------------------------------ submission

    def run_by_idempotency_key(self, policy: EntityPolicy, key: str) -> Row | None:
        rows = self.dicts(self.execute(
            self.q("run_by_idempotency_key", table=self.table(policy)), (key,)))
        return rows[0] if rows else None

    def ensure_schedule(self, schedule_id: str, name: str | None, created_at: float) -> None:
        self.execute(self.q("ensure_schedule"), (schedule_id, name, created_at))

    def waiting_runs(self, policy: EntityPolicy, ids: Sequence[str]) -> list[tuple[str, Any]]:
        return [(r["id"], r["depends_on"])
                for r in self._chunked_rows("waiting_runs", policy, ids)]

    def dependents_of(self, policy: EntityPolicy, run_ids: Sequence[str]
                      ) -> list[tuple[str, Any]]:
        rows = self._chunked_rows("dependents_of", policy, run_ids,
                                  hint=self.hint(policy, "waiting_dependency", "created_at"))
        # A dependent of runs in two chunks is found twice.
        return list({r["id"]: (r["id"], r["depends_on"]) for r in rows}.values())

    def notify_claimable(self) -> None:
        return None

    # ------------------------------------------------------------ schedules

    def latest_fire(self, policy: EntityPolicy, schedule_id: str) -> Row | None:
        rows = self.dicts(self.execute(self.q("latest_fire", table=self.table(policy)),
                                       (schedule_id,)))
        return rows[0] if rows else None

    def run_for_slot(self, policy: EntityPolicy, schedule_id: str, slot_at: float) -> str | None:
        row = self.execute(self.q("run_for_slot", table=self.table(policy)),
                           (schedule_id, slot_at)).fetchone()
        return None if row is None else str(row[0])

    def fire_in_progress(self, policy: EntityPolicy, schedule_id: str) -> str | None:
        ended: list[str | None] = [*sorted(policy.terminal)] or [None]
        sql = self.q("fire_in_progress", table=self.table(policy),
                     marks=self.marks(len(ended)))
        row = self.execute(sql, (schedule_id, *ended)).fetchone()
        return None if row is None else str(row[0])

    # ------------------------------------------------------------ workers

    def upsert_worker(self, worker_id: str, capabilities: str, targets: str, now: float,
                      hostname: str, pid: int, queues: str) -> None:
        self.execute(self.q("upsert_worker"),
                     (worker_id, capabilities, targets, now, hostname, pid, now, queues))

    def worker_heartbeat(self, worker_id: str) -> float | None:
        row = self.execute(self.q("worker_heartbeat"), (worker_id,)).fetchone()
        return None if row is None else float(row[0])

    def workers(self) -> list[Row]:
        return self.dicts(self.execute(self.q("workers")))

    def worker_rows(self) -> list[Row]:
        return self.dicts(self.execute(self.q("worker_rows")))

    def request_worker_stop(self, worker_id: str, now: float) -> bool:
        return self.execute(self.q("request_worker_stop"), (now, worker_id)).fetchone() \
            is not None

    def worker_stop_requested(self, worker_id: str) -> float | None:
        row = self.execute(self.q("worker_stop_requested"), (worker_id,)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def expired_leases(self, policy: EntityPolicy, now: float,
                       limit: int | None = None) -> list[Row]:
        sql = self.q("expired_leases", table=self.table(policy),
                     columns=", ".join(quote(c) for c in expired_columns(policy)),
                     hint=self.hint(policy, "running", "lease_expires_at"))
        return self.dicts(self.execute(sql, (now, self._limit(limit))))

    def due_retries(self, policy: EntityPolicy, now: float,
                    limit: int | None = None) -> list[Row]:
        sql = self.q("due_retries", table=self.table(policy),
                     hint=self.hint(policy, "retry_wait", "retry_due_at"))
        return self.dicts(self.execute(sql, (now, self._limit(limit))))

    def due_starts(self, policy: EntityPolicy, now: float,
                   limit: int | None = None) -> list[Row]:
        sql = self.q("due_starts", table=self.table(policy),
                     hint=self.hint(policy, "delayed", "not_before"))
        return self.dicts(self.execute(sql, (now, self._limit(limit))))

    def settled_waiting(self, policy: EntityPolicy, limit: int | None = None) -> list[str]:
        # None stands in for an empty list (``IN ()`` is not SQL): it matches no status.
        met = policy.states_with_outcome(SUCCEEDED)
        bad: list[str | None] = [*sorted(policy.terminal - met)] or [None]
        good: list[str | None] = [*sorted(met)] or [None]
        sql = self.q("settled_waiting", table=self.table(policy),
                     hint=self.hint(policy, "waiting_dependency", "created_at"),
                     bad=self.marks(len(bad)), met=self.marks(len(good)))
        return [r[0] for r in self.execute(sql, (*bad, *good, self._limit(limit))).fetchall()]

    def claim_page(self, policy: EntityPolicy, excluded_kinds: Sequence[str], queue: str,
                   after: tuple[int, float, str] | None, limit: int) -> list[Row]:
        if QUEUE_COLUMN not in policy.columns or PRIORITY_COLUMN not in policy.columns:
            # Specs that predate queues: every run is priority 0 in the default queue.
            if queue != DEFAULT_QUEUE:
                return []
            rows = self._claim_rows(policy, "claim_unqueued", excluded_kinds,
                                    (float("-inf"), "") if after is None else after[1:], limit)
            return [{**r, PRIORITY_COLUMN: 0, QUEUE_COLUMN: DEFAULT_QUEUE} for r in rows]
        # Two index ranges, each read in order: the rest of the cursor's priority level,
        # then every level below it (from the top when there is no cursor yet).
        rows = []
        if after is not None:
            rows = self._claim_rows(policy, "claim_level", excluded_kinds,
                                    (queue, *after), limit)
            if len(rows) >= limit:
                return rows
        below = () if after is None else (after[0],)
        return rows + self._claim_rows(policy, "claim_below", excluded_kinds,
                                       (queue, *below), limit - len(rows), bounded=bool(below))

    def _claim_rows(self, policy: EntityPolicy, name: str, excluded_kinds: Sequence[str],
                    keys: Sequence[object], limit: int, *, bounded: bool = False) -> list[Row]:
        key = (name, policy.table, len(excluded_kinds), SLOT_COLUMN in policy.columns, bounded)
        sql = self._texts.get(key)
        if sql is None:
            kinds = (self.q("kinds_excluded", marks=self.marks(len(excluded_kinds)))
                     if excluded_kinds else "")
            # Fires of ledgerq's own scheduler (a slot recorded) are queue rows; rows an
            # external scheduler recorded are never claimed (the ADR-0071 queue's rule). Specs
            # without the slot column predate the scheduler: every scheduled row is external.
            scope = self.q("claimable_scheduled" if SLOT_COLUMN in policy.columns
                           else "claimable_unscheduled")
            columns = [c for c in CANDIDATE_COLUMNS if c in policy.columns]
            sql = self._texts[key] = self.q(
                name, table=self.table(policy), columns=", ".join(columns),
                hint=self.hint(policy, "queued", QUEUE_COLUMN if name != "claim_unqueued"
                               else "queued_at"),
                kinds=kinds, scope=scope, bound=self.q("priority_below") if bounded else "")
        return self.dicts(self.execute(sql, (*keys, *excluded_kinds, limit)))

    def running_keys(self, policy: EntityPolicy) -> set[str]:
        sql = self.q("running_keys", table=self.table(policy),
                     hint=self.hint(policy, "running", "lease_expires_at"))
        return {r[0] for r in self.execute(sql).fetchall()}

    def key_running(self, policy: EntityPolicy, key: str) -> bool:
        sql = self.q("key_running", table=self.table(policy),
                     hint=self.hint(policy, "running", "concurrency_key"))
        return self.execute(sql, (key,)).fetchone() is not None

    def lock_key(self, key: str) -> None:
        return None

    def lease_rows(self, policy: EntityPolicy, ids: Sequence[str]) -> list[Row]:
        out: list[Row] = []
        for i in range(0, len(ids), CHUNK):
            part = list(ids[i:i + CHUNK])
            sql = self.q("lease_rows", table=self.table(policy),
                         columns=", ".join(quote(c) for c in lease_columns(policy)),
                         marks=self.marks(len(part)))
            out += self.dicts(self.execute(sql, part))
        return out

    # ------------------------------------------------------------ the log

    def facts_of(self, entity_type: str, entity_id: str) -> list[Row]:
        return self.dicts(self.execute(self.q("facts_of"), (entity_type, entity_id)))

    def facts_after(self, entity_type: str, after_id: str, limit: int) -> list[Row]:
        return self.dicts(self.execute(self.q("facts_after"), (after_id, entity_type, limit)))

    def fact_stream(self, entity_type: str) -> Iterator[tuple[str, str, int, Any]]:
        return self.stream(self.q("fact_stream"), (entity_type,))[1]

    def rows_in_id_order(self, policy: EntityPolicy) -> Iterator[Row]:
        names, rows = self.stream(self.q("rows_in_id_order", table=self.table(policy)))
        return (dict(zip(names, r, strict=True)) for r in rows)

    def count_facts(self) -> int:
        return int(self.execute(self.q("count_facts")).fetchone()[0])

    def delete_rows(self, policy: EntityPolicy) -> None:
        self.execute(self.q("delete_rows", table=self.table(policy)))

    # ------------------------------------------------------------ the archive

    def lock_archives(self) -> None:
        return None

    def mark_ended(self, policy: EntityPolicy, states: Sequence[str], before: float,
                   limit: int | None = None) -> int:
        listed: list[str | None] = [*states] or [None]
        sql = self.q("mark_ended", table=self.table(policy), marks=self.marks(len(listed)))
        return int(self.execute(sql, (policy.name, *listed, before,
                                      self._limit(limit))).rowcount)

    def unmark_referenced(self, policy: EntityPolicy, referrer: EntityPolicy,
                          column: str) -> int:
        sql = self.q("unmark_referenced", table=self.table(referrer), column=quote(column))
        return int(self.execute(sql, (policy.name, referrer.name)).rowcount)

    def unmark_dependencies(self, policy: EntityPolicy) -> int:
        sql = self.q("unmark_dependencies", table=self.table(policy))
        return int(self.execute(sql, (policy.name, policy.name)).rowcount)

    def unmark_leased(self, policy: EntityPolicy) -> int:
        return int(self.execute(self.q("unmark_leased"), (policy.name,)).rowcount)

    def marked_rows(self, policy: EntityPolicy) -> Iterator[Row]:
        names, rows = self.stream(self.q("marked_rows", table=self.table(policy)),
                                  (policy.name,))
        return (dict(zip(names, r, strict=True)) for r in rows)

    def marked_facts(self, entity_type: str) -> Iterator[Row]:
        names, rows = self.stream(self.q("marked_facts"), (entity_type,))
        return (dict(zip(names, r, strict=True)) for r in rows)

    def delete_marked(self, policy: EntityPolicy) -> tuple[int, int]:
        facts = self.execute(self.q("delete_marked_facts"), (policy.name, policy.name)).rowcount
        rows = self.execute(self.q("delete_marked_rows", table=self.table(policy)),
                            (policy.name,)).rowcount
        return int(facts), int(rows)

    def clear_marks(self) -> None:
        self.execute(self.q("clear_marks"))

    def record_archive(self, row: dict[str, Any]) -> None:
        cols = tuple(row)
        self.execute(self.q("record_archive", columns=", ".join(quote(c) for c in cols),
                            marks=self.marks(len(cols))), list(row.values()))

    def archives(self) -> list[Row]:
        # A database of an older schema opened read-only was not upgraded: no table, and
        # so no archive either.
        if ARCHIVES_TABLE not in {r[0] for r in self.execute(self.q("tables")).fetchall()}:
            return []
        return self.dicts(self.execute(self.q("archives")))

    # ------------------------------------------------------------ read models

    def run_page(self, policy: EntityPolicy, filters: dict[str, list[Any]],
                 columns: tuple[str, ...], limit: int, offset: int, *,
                 since: tuple[str, float] | None = None) -> tuple[int, list[Row]]:
        terms = [self.q("and_in_list", column=quote(c), marks=self.marks(len(v)))
                 for c, v in filters.items() if v]
        params = [x for v in filters.values() if v for x in v]
        if since is not None:
            terms.append(self.q("and_at_least", column=quote(since[0])))
            params.append(since[1])
        where = self.q("where", terms=" ".join(terms)) if terms else ""
        table = self.table(policy)
        total = self.execute(self.q("count_rows", table=table, where=where), params).fetchone()[0]
        rows = self.dicts(self.execute(
            self.q("run_page", table=table, where=where,
                   columns=", ".join(quote(c) for c in columns)), [*params, limit, offset]))
        return int(total), rows

    def run_page_before(self, policy: EntityPolicy, filters: dict[str, list[Any]],
                        columns: tuple[str, ...], before: tuple[float, str] | None,
                        limit: int) -> list[Row]:
        terms = [self.q("and_in_list", column=quote(c), marks=self.marks(len(v)))
                 for c, v in filters.items() if v]
        params = [x for v in filters.values() if v for x in v]
        if before is not None:
            terms.append(self.q("and_before"))
            params += list(before)
        where = self.q("where", terms=" ".join(terms)) if terms else ""
        return self.dicts(self.execute(
            self.q("run_page_before", table=self.table(policy), where=where,
                   columns=", ".join(quote(c) for c in columns)), [*params, limit]))

    def fact_counts(self) -> list[tuple[str, str, int]]:
        return [(r[0], r[1], int(r[2]))
                for r in self.execute(self.q("fact_counts")).fetchall()]

    def wait_histogram(self, entity_type: str, reason_code: str,
                       bounds: Sequence[float]) -> tuple[list[int], int, float]:
        buckets = " ".join(self.q("wait_bucket") for _ in bounds)
        row = self.execute(self.q("wait_histogram", buckets=buckets),
                           [*bounds, entity_type, reason_code]).fetchone()
        return [int(n or 0) for n in row[2:]], int(row[0]), float(row[1] or 0.0)

    def ids_matching(self, policy: EntityPolicy, piece: str, *, suffix: bool,
                     limit: int) -> list[str]:
        pattern = f"%{piece}" if suffix else f"{piece}%"
        sql = self.q("ids_like", table=self.table(policy))
        return [r[0] for r in self.execute(sql, (pattern, limit)).fetchall()]

    def status_counts(self, policy: EntityPolicy) -> dict[str, int]:
        rows = self.execute(self.q("status_counts", table=self.table(policy))).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    def oldest_queued_at(self, policy: EntityPolicy) -> float | None:
        table = self.table(policy)
        if QUEUE_COLUMN not in policy.columns or PRIORITY_COLUMN not in policy.columns:
            sql = self.q("oldest_queued_at", table=table,
                         hint=self.hint(policy, "queued", "queued_at"))
            value = self.execute(sql).fetchone()[0]
            return None if value is None else float(value)
        # No (queued_at) index: every submit and claim would maintain it for this query
        # alone. The claim order's index answers it level by level instead.
        hint = self.hint(policy, "queued", QUEUE_COLUMN)

        def one(name: str, *params: Any) -> Any:
            return self.execute(self.q(name, table=table, hint=hint), params).fetchone()

        oldest: float | None = None
        level = one("queued_level_first")
        while level is not None:
            queue, priority = level[0], level[1]
            at = one("queued_level_oldest", queue, priority)
            if at is not None and (oldest is None or at[0] < oldest):
                oldest = float(at[0])
            below = one("queued_level_below", queue, priority)
            level = (queue, below[0]) if below is not None else \
                one("queued_level_next_queue", queue)
        return oldest

    def running_by_worker(self, policy: EntityPolicy) -> dict[str, int]:
        sql = self.q("running_by_worker", table=self.table(policy),
                     hint=self.hint(policy, "running", "lease_expires_at"))
        return {r[0]: int(r[1]) for r in self.execute(sql).fetchall()}

    def stuck_runs(self, policy: EntityPolicy, kind: str, now: float, grace: float,
                   limit: int) -> tuple[int, list[tuple[str, str, str]]]:
        table = self.table(policy)
        params: list[Any]
        if kind == "undeclared":
            declared = sorted(policy.states)
            inner = self.q("stuck_undeclared", table=table, marks=self.marks(len(declared)))
            params = list(declared)
        elif kind == "lease":
            inner = self.q("stuck_lease", table=table,
                           hint=self.hint(policy, "running", "lease_expires_at"))
            params = [now - grace, grace]
        elif kind == "retry":
            inner = self.q("stuck_retry", table=table,
                           hint=self.hint(policy, "retry_wait", "retry_due_at"))
            params = [now - grace, grace]
        elif kind == "waiting":
            inner = self.q("stuck_waiting", table=table,
                           hint=self.hint(policy, "waiting_dependency", "created_at"))
            params = []
        else:
            raise ValueError(f"unknown kind of stuck run {kind!r}")
        count = int(self.execute(self.q("count_of", inner=inner), params).fetchone()[0])
        sample = [(r[0], r[1], r[2]) for r in self.execute(
            self.q("limited", inner=inner), [*params, limit]).fetchall()] if count else []
        return count, sample
