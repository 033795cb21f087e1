"""PostgreSQL's transaction: the shared operations over psycopg 3, with its own text.

What differs from SQLite: many writers at once under READ COMMITTED, so a claim takes
its row with ``FOR UPDATE SKIP LOCKED`` (claimants skip each other's rows instead of
queueing behind them) and two claims of one concurrency key serialize on an advisory
lock; a submit notifies listening workers; a long read streams through a server-side
cursor; foreign keys are deferred with ``SET CONSTRAINTS``.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import re
from collections.abc import Collection, Iterable, Iterator, Sequence
from types import MappingProxyType
from typing import Any, ClassVar

import msgspec
import psycopg

from ledgerq.codec import dumps
from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.lifecycle.store import FACT_COLUMNS, ClaimFacts, Row, SentMove
from ledgerq.store.queries import Queries
from ledgerq.store.sqltx import SqlTx

QUERIES = Queries("ledgerq.store.postgres")
#: Rows per executemany batch when the rows come from a stream on the same connection.
BATCH = 2000
#: Rows a server-side cursor fetches per round trip.
ITERSIZE = 2000
_cursor_names = itertools.count()


def stale_plan(exc: BaseException) -> bool:
    """A prepared statement of this connection outlived its table's shape: another
    process altered the table (a migration by a newer release added or dropped a
    column), and a ``SELECT *``/``RETURNING *`` plan may not change its result type.
    Nothing of the unit was kept; it runs again once the connection forgets its plans."""
    return isinstance(exc, psycopg.errors.FeatureNotSupported) and \
        "cached plan must not change result type" in str(exc)


_QMARK = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?|%")


#: Where a fact (any sequence in FACT_COLUMNS order, a Fact or not) has its time and its
#: version, the fields that are not text.
_CREATED_AT = FACT_COLUMNS.index("created_at")
_VERSION = FACT_COLUMNS.index("entity_version")
#: A fact's other fields: text or None each.
_TEXT_FIELDS = operator.itemgetter(
    *(i for i, c in enumerate(FACT_COLUMNS) if i not in (_CREATED_AT, _VERSION)))
_TEXT_TYPES = frozenset((str, type(None)))
#: Where a fact has its patch.
_PATCH = FACT_COLUMNS.index("patch")
#: The types of values a COPY carries exactly (an int beyond 64 bits is refused by the
#: server, as it is as a parameter).
_PLAIN = frozenset((str, int, float, bool, type(None)))


def _as_json(fact: Sequence[Any]) -> bool:
    """Whether a fact's values survive a JSON document exactly: its time a finite float
    (or an int), its version a 64-bit int, every other field text or None. (Checked once
    per fact written: the text fields' types are taken in C, half the time of a loop.)"""
    created, version = fact[_CREATED_AT], fact[_VERSION]
    return type(version) is int and -(1 << 63) <= version < (1 << 63) \
        and (type(created) is int or (type(created) is float and math.isfinite(created))) \
        and _TEXT_TYPES.issuperset(map(type, _TEXT_FIELDS(fact)))


def _exact(value: Any) -> bool:
    """Whether a column value reads back from a JSON document as itself."""
    kind = type(value)
    return value is None or kind is str or kind is bool \
        or (kind is int and -(1 << 63) <= value < (1 << 63)) \
        or (kind is float and math.isfinite(value))


def _completed(fact: Sequence[Any], known: dict[str, Any]) -> Sequence[Any]:
    """``fact`` with ``known`` added to its patch (keys the patch does not have)."""
    if not known:
        return fact
    patch, more = fact[_PATCH], dumps(known)
    return (*fact[:_PATCH], more if patch == "{}" else f"{patch[:-1]},{more[1:]}",
            *fact[_PATCH + 1:])


def _embedded(json: Collection[str], values: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Column -> value as a JSON document carries them to be read back as the table's row
    type: a JSON column's text embedded as the JSON value it is (NULL stays null)."""
    return {c: msgspec.Raw(v) if c in json and v is not None else v for c, v in values}


_JSON = msgspec.json.Decoder()


def _json_text(value: Any) -> bool:
    """Whether ``value`` is the text of one JSON value other than null: embedded in a
    document as it is, it reads back as the text's cast to jsonb would (a document reads
    JSON's null as SQL NULL; text that is not one JSON value could change the document)."""
    if type(value) is not str:
        return False
    if value == "[]" or value == "{}":  # a move's evidence, nearly always
        return True
    try:
        return _JSON.decode(value) is not None
    except msgspec.DecodeError:
        return False


def _together(policy: EntityPolicy, run: Sequence[SentMove]) -> bool:
    """Whether moves of one shape can go as one statement with their terms as JSON
    documents: each a move that was not read first (its swap is the read) to another
    state, of its own row (two moves of one row must see each other, in order), every
    value carried exactly (a JSON column's text embedded as it is: see _json_text), and
    a fact JSON carries."""
    json = policy.json_columns
    if len({m.entity_id for m in run}) != len(run):
        return False
    for m in run:
        if m.version is not None or m.to_state is None or m.skip_locked \
                or not _as_json(m.fact):
            return False
        for c, v in m.changes.items():
            if c in json:
                if v is not None and not _json_text(v):
                    return False
            elif not _exact(v):
                return False
        if not all(_exact(v) and c not in json for c, v in m.guards.items()):
            return False
    return True


@functools.lru_cache(maxsize=256)
def qmark_to_psycopg(sql: str) -> str:
    """``?`` placeholders (outside quoted text) as ``%s``, a literal ``%`` as ``%%``: so a
    portable ad-hoc query runs on both backends."""
    if "%s" in sql or "%(" in sql:
        return sql

    def sub(m: re.Match[str]) -> str:
        tok = m.group(0)
        return "%s" if tok == "?" else "%%" if tok == "%" else tok

    return _QMARK.sub(sub, sql)


class PostgresTx(SqlTx):
    dialect = "postgresql"
    queries = QUERIES
    mark = "%s"
    no_limit = None
    _texts: ClassVar[dict[tuple[Any, ...], str]] = {}

    conn: psycopg.Connection[tuple[Any, ...]]

    def __init__(self, conn: Any, *, hold_first: bool = False) -> None:
        super().__init__(conn)
        #: Whether a first statement whose result nobody reads may be held back, so that
        #: a unit of that one statement runs as a transaction of its own (see
        #: :meth:`take_alone`). Only the backend's write units, which always end with
        #: :meth:`take_alone`, ask for it.
        self.hold_first = hold_first
        self._held: tuple[str, Sequence[Any]] | None = None
        self._sent = False

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Any:
        if "?" in sql:  # an ad-hoc statement in SQLite's paramstyle (ours never are)
            sql = qmark_to_psycopg(sql)
        self._send_held()
        return self.conn.execute(sql, params or None)

    def _execute_unread(self, sql: str, params: Sequence[Any]) -> None:
        """A statement whose result nobody reads: held back if it is the unit's first."""
        if self.hold_first and not self._sent and self._held is None:
            self._held = (sql, params)
        else:
            self.execute(sql, params)

    def _send_held(self) -> None:
        self._sent = True
        if self._held is not None:
            sql, params = self._held
            self._held = None
            self.execute(sql, params)

    def take_alone(self) -> tuple[str, Sequence[Any]] | None:
        """The unit's only statement, if it was held back and nothing else was sent: the
        backend then runs it as its own transaction (:meth:`run_alone`: one round trip
        instead of BEGIN, the statement and COMMIT) or sends it as usual. A statement
        is atomic by itself, so the unit is still all or nothing."""
        held, self._held = self._held, None
        return held

    def run_alone(self, sql: str, params: Sequence[Any]) -> None:
        """One statement as its own transaction. A failure is one of COMMIT's: its outcome
        is unknown if the connection died. The connection is left in transaction mode,
        or closed (the pool replaces it)."""
        self.conn.autocommit = True
        try:
            self.execute(sql, params)
        finally:
            try:
                self.conn.autocommit = False
            except psycopg.Error:
                self.conn.close()

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        # The rows may be a generator reading a server-side cursor of this connection
        # (rebuild): psycopg holds the connection's lock through executemany, so the
        # stream is read a batch at a time between calls, never inside one.
        self._send_held()
        it = iter(rows)
        with self.conn.cursor() as cur:
            while batch := list(itertools.islice(it, BATCH)):
                cur.executemany(sql, batch)

    def stream(self, sql: str, params: Sequence[Any] = ()
               ) -> tuple[list[str], Iterator[tuple[Any, ...]]]:
        self._send_held()
        cur = self.conn.cursor(name=f"ledgerq_stream_{next(_cursor_names)}")
        cur.itersize = ITERSIZE
        cur.execute(sql, params or None)
        return (self.names(cur) if cur.description else []), iter(cur)

    @staticmethod
    def names(cur: Any) -> list[str]:
        """The column names, read from the result itself: ``cur.description`` builds a
        Column object per column (~40 for a run's ``RETURNING *``), which cProfile put at
        about a quarter of a submit's client CPU on PostgreSQL."""
        res = cur.pgresult
        raw = [res.fname(i) or b"" for i in range(res.nfields)] if res is not None else []
        if all(name.isascii() for name in raw):
            return [name.decode("ascii") for name in raw]
        return [d.name for d in cur.description]  # decoded in the connection's encoding

    def is_database_failure(self, exc: BaseException) -> bool:
        return isinstance(exc, psycopg.OperationalError) or stale_plan(exc)

    stores_as_sent = True
    binds_json_numbers = False  # jsonb takes JSON text
    # Typed columns keep what they are sent; jsonb normalizes JSON text (none here).
    exact_types = MappingProxyType({"text": str, "integer": int, "float": float,
                                    "timestamp": float, "boolean": bool})

    def update_entities_with_facts(self, policy: EntityPolicy, moves: Sequence[SentMove]
                                   ) -> list[int | None]:
        # Per run of moves of one shape, in order: several that a JSON document carries
        # exactly (see _together) go as one statement; others one statement a move (the
        # swap in a CTE, the fact inserted from its RETURNING, so only where it matched,
        # with the version it left), sent together (psycopg pipelines an executemany).
        texts = [self._with_fact_text(policy, m) for m in moves]
        if len(moves) == 1:
            row = self.execute(texts[0], self._with_fact_params(moves[0])).fetchone()
            return [None if row is None else int(row[0])]
        self._send_held()
        out: list[int | None] = []
        start = 0
        while start < len(moves):
            end = start + 1
            while end < len(moves) and texts[end] == texts[start]:
                end += 1
            run = moves[start:end]
            if len(run) > 1 and _together(policy, run):
                out.extend(self._update_together(policy, run))
            else:
                out.extend(self._update_pipelined(texts[start], run))
            start = end
        return out

    @classmethod
    def _with_fact_params(cls, m: SentMove) -> list[Any]:
        return [*cls.update_params(m.entity_id, m.observed, m.version, m.to_state,
                                   m.changes.values(), m.guards.values()),
                *m.fact[:_VERSION], *m.fact[_VERSION + 1:]]  # (the version: the row's)

    def _update_pipelined(self, sql: str, run: Sequence[SentMove]) -> list[int | None]:
        out: list[int | None] = []
        with self.conn.cursor() as cur:
            cur.executemany(sql, [self._with_fact_params(m) for m in run], returning=True)
            while True:
                row = cur.fetchone()
                out.append(None if row is None else int(row[0]))
                if not cur.nextset():
                    break
        return out

    def _update_together(self, policy: EntityPolicy, run: Sequence[SentMove]
                         ) -> list[int | None]:
        """Moves of one shape as one statement: their terms as JSON documents, each move
        its row's entry, keyed by id (update_entities_with_facts in events.sql). A pass's
        ~25 pipelined statements, each adapted and pipelined by psycopg, become one
        statement of four parameters."""
        first = run[0]
        guard_cols, change_cols = tuple(first.guards), tuple(first.changes)
        key = ("update+facts", policy.table, guard_cols, change_cols)
        sql = self._texts.get(key)
        if sql is None:
            table = self.table(policy)
            sql = self._texts[key] = self.q(
                "update_entities_with_facts", table=table,
                assignment=self._assign_from_doc(table, ("status", *change_cols)),
                guard=self._guard_from_doc(table, ("status", *guard_cols)),
                fields=self.q("fact_fields", version="u.version", patch="(f->>13)::jsonb"))
        json = policy.json_columns
        patches = dumps({m.entity_id: {"status": m.to_state,
                                       **_embedded(json, m.changes.items())} for m in run})
        given = dumps({m.entity_id: {"status": m.observed, **m.guards} for m in run})
        facts = dumps({m.entity_id: m.fact for m in run})
        done = dict(self.execute(sql, (patches, [m.entity_id for m in run], given,
                                       facts)).fetchall())
        return [done.get(m.entity_id) for m in run]

    def _assign_from_doc(self, table: str, columns: Sequence[str]) -> str:
        """``columns`` set from each row's entry of a JSON object keyed by id."""
        return self.q("assign_from_doc", table=table,
                      columns=", ".join(quote(c) for c in columns),
                      values=", ".join(f"p.{quote(c)}" for c in columns))

    def _guard_from_doc(self, table: str, columns: Sequence[str]) -> str:
        """The row still has ``columns``' values its entry of a JSON object keyed by id
        gives."""
        return self.q("guard_from_doc", table=table, guards=" ".join(
            self.q("guard_join", column=quote(c), side="g") for c in columns))

    def append_facts(self, facts: Sequence[Sequence[Any]]) -> None:
        # Many facts: one statement, the facts one JSON document (encoded in C), instead
        # of a pipelined INSERT a fact, whose adaptation and pipeline cost psycopg ~100 us
        # more for a claim pass's 25. Facts JSON cannot carry exactly (a time that is not
        # a finite float, a version beyond 64 bits, a field that is not text) go the
        # usual way.
        if len(facts) <= 1 or not all(_as_json(f) for f in facts):
            super().append_facts(facts)
            return
        self.execute(self.q("append_facts", fields=self.q(
            "fact_fields", version="(f->>12)::bigint", patch="(f->>13)::jsonb")),
            (dumps(facts),))

    def _with_fact_text(self, policy: EntityPolicy, m: SentMove) -> str:
        """update_entity_with_fact's text for ``m``'s shape."""
        update = self.update_text(policy, m.to_state is None, tuple(m.changes),
                                  tuple(m.guards), m.version is None, m.skip_locked,
                                  ("version",))
        sql = self._texts.get(("update+fact", update))
        if sql is None:
            sql = self._texts[("update+fact", update)] = self.q("update_entity_with_fact",
                                                                update=update)
        return sql

    def _stored_object(self, policy: EntityPolicy, stored: tuple[str, ...]) -> str:
        """A JSON object of the stored values of ``stored`` of row ``r`` (JSON columns as
        their text), as a fact's patch records them."""
        json = set(policy.json_columns)
        pairs = [self.q("stored_json_text" if c in json else "stored_value",
                        key=c, column=quote(c)) for c in stored]
        return " || ".join(self.q("stored_object", pairs=", ".join(pairs[i:i + 50]))
                           for i in range(0, max(len(pairs), 1), 50))

    def insert_entities_with_facts(self, policy: EntityPolicy, columns: tuple[str, ...],
                                   rows: Sequence[tuple[Sequence[Any], Sequence[Any]]],
                                   stored: tuple[str, ...]) -> None:
        # Many rows of plain values: two COPYs (_copy_together), the least any statement
        # costs them; as one INSERT ... SELECT from JSON documents the server took twice
        # as long. Otherwise one statement a row: the row in a CTE, its fact from what
        # it stored, pipelined by executemany.
        if len(rows) > 1 and all(_PLAIN.issuperset(map(type, values))
                                 and _PLAIN.issuperset(map(type, fact)) for values, fact in rows):
            self._copy_together(policy, columns, rows, stored)
            return
        key = ("insert+fact", policy.table, columns, stored, policy.json_columns)
        sql = self._texts.get(key)
        if sql is None:
            sql = self._texts[key] = self.q(
                "insert_entities_with_facts", table=self.table(policy),
                columns=", ".join(quote(c) for c in columns), marks=self.marks(len(columns)),
                stored=self._stored_object(policy, stored))
        if len(rows) == 1:
            self._execute_unread(sql, [*rows[0][0], *rows[0][1]])
        else:
            self.executemany(sql, ([*values, *fact] for values, fact in rows))

    def _copy_together(self, policy: EntityPolicy, columns: tuple[str, ...],
                       rows: Sequence[tuple[Sequence[Any], Sequence[Any]]],
                       stored: tuple[str, ...]) -> None:
        """The rows, then their facts, each as one COPY. What only the database would
        know of a row (``stored``) is made known first, so each fact's patch can carry it:
        a JSON column's text as jsonb spells it (asked of the server at once for every
        distinct text: jsonb_spellings), and an unsent column's default as the spec gives
        it (sent with the row, which then stores exactly that)."""
        json = frozenset(policy.json_columns)
        sent = [(i, c) for i, c in enumerate(columns) if c in stored]
        unsent = tuple(c for c in stored if c not in columns)
        defaults = [policy.columns[c].default for c in unsent]
        texts = {values[i] for values, _ in rows for i, _ in sent}
        texts.update(d for c, d in zip(unsent, defaults, strict=True)
                     if c in json and isinstance(d, str))
        spelled: dict[str, str] = dict(self.execute(self.q("jsonb_spellings"), (
            list(texts),)).fetchall()) if texts else {}
        stored_defaults = {c: spelled[d] if c in json and isinstance(d, str) else d
                           for c, d in zip(unsent, defaults, strict=True)}
        with self.conn.cursor() as cur:
            with cur.copy(self.q("copy_entities", table=self.table(policy), columns=", ".join(
                    quote(c) for c in (*columns, *unsent)))) as copy:
                for values, _ in rows:
                    copy.write_row((*values, *defaults))
            with cur.copy(self.q("copy_facts")) as copy:
                for values, fact in rows:
                    copy.write_row(_completed(fact, {
                        **{c: spelled[values[i]] for i, c in sent}, **stored_defaults}))

    def claim_entities(self, policy: EntityPolicy, rows: Sequence[tuple[str, Row, Row]], *,
                       observed: str, to_state: str, changes: Row, limit: int) -> list[Row]:
        # One statement for the whole pass: the candidates in order as a JSON array read
        # back as the table's row type (so every value gets its column's type), locked in
        # that order up to ``limit`` (SKIP LOCKED; the lock re-checks status and guards on
        # the row's latest version); the swap finds the locked rows by key and checks them
        # once more, each taking its guard and patch values from its own entry of a JSON
        # object keyed by id.
        if not rows:
            return []
        sql = self._claim_text(policy, rows, changes, None)
        return self._claimed(rows, self.execute(sql, self._claim_params(
            rows, observed, to_state, changes, limit)))

    def claim_entities_with_facts(self, policy: EntityPolicy,
                                  rows: Sequence[tuple[str, Row, Row]], *, observed: str,
                                  to_state: str, changes: Row, limit: int,
                                  facts: ClaimFacts) -> list[Row]:
        # claim_entities' statement with each claimed row's fact inserted from what it
        # returned: one statement and one round trip, where the facts were a second.
        if not facts.exact:
            return super().claim_entities_with_facts(
                policy, rows, observed=observed, to_state=to_state, changes=changes,
                limit=limit, facts=facts)
        if not rows:
            return []
        f = facts.fields
        sql = self._claim_text(policy, rows, changes, facts.stored)
        return self._claimed(rows, self.execute(sql, [
            *self._claim_params(rows, observed, to_state, changes, limit), list(facts.ids),
            f.entity_type, f.previous_status, f.status, f.reason_code, f.reason_summary,
            f.evidence_refs, f.source, f.actor, f.created_at, f.metadata,
            dumps(facts.common), f.idempotency_key]))

    def _claim_text(self, policy: EntityPolicy, rows: Sequence[tuple[str, Row, Row]],
                    changes: Row, stored: tuple[str, ...] | None) -> str:
        """claim_entities' text for this shape of rows (with its facts: claim_entities_
        with_facts', the columns each fact reads from its row ``stored``)."""
        guard_cols = tuple(rows[0][1])
        patch_cols = tuple(rows[0][2])
        change_cols = tuple(changes)
        key = ("claim", policy.table, guard_cols, patch_cols, change_cols, stored,
               policy.json_columns)
        sql = self._texts.get(key)
        if sql is None:
            table = self.table(policy)
            assignments = [self.q("assign", column=quote(c)) for c in change_cols]
            if patch_cols:
                assignments.append(self._assign_from_doc(table, patch_cols))
            pick = self.q("claim_pick", table=table, pick_guards=" ".join(
                self.q("guard_join", column=quote(c), side="c") for c in guard_cols))
            swap = self.q("claim_swap", table=table, assignments=", ".join(assignments),
                          guard=self._guard_from_doc(table, guard_cols))
            if stored is None:
                sql = self.q("claim_entities", pick=pick, swap=swap)
            else:
                sql = self.q("claim_entities_with_facts", pick=pick, swap=swap,
                             stored=self._stored_object(policy, stored))
            self._texts[key] = sql
        return sql

    @staticmethod
    def _claim_params(rows: Sequence[tuple[str, Row, Row]], observed: str, to_state: str,
                      changes: Row, limit: int) -> list[Any]:
        """claim_entities' parameters, in its text's order."""
        given = dumps([{"id": i, **g} for i, g, _ in rows])
        patches = [dumps({i: p for i, _, p in rows})] if rows[0][2] else []
        guards = dumps({i: g for i, g, _ in rows})
        return [given, observed, limit, to_state, *changes.values(), *patches, observed,
                guards]

    def _claimed(self, rows: Sequence[tuple[str, Row, Row]], cur: Any) -> list[Row]:
        """The claimed rows as stored, in the given rows' order."""
        names = self.names(cur)
        stored = {r["id"]: r for r in (dict(zip(names, t, strict=True))
                                       for t in cur.fetchall())}
        return [stored[i] for i, _, _ in rows if i in stored]

    def notify_claimable(self) -> None:
        self.execute(self.q("notify_claimable"))

    def lock_key(self, key: str) -> None:
        self.execute(self.q("lock_key"), (key,))

    def lock_archives(self) -> None:
        self.execute(self.q("lock_archives"))

    def defer_constraints(self) -> None:
        self.execute(self.q("defer_constraints"))
