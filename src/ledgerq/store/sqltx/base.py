"""The plumbing every operation of :class:`~ledgerq.store.sqltx.SqlTx` runs on.

Which statement (by name, from the dialect's ``*.sql``), rendered with quoted,
validated identifiers; the connection's ``execute``; rows as dicts. Nothing here holds
SQL text.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.naming import named_states
from ledgerq.lifecycle.registry import EntityPolicy, sql_literal
from ledgerq.lifecycle.store import Row
from ledgerq.store.queries import Queries

#: Ids bound per ``IN (...)`` statement (under SQLite's bound-parameter limit).
CHUNK = 500
#: Columns of the runs table the store's statements name (their SQL spells them), which
#: specs that predate them lack: the claim order's queue and priority, and the slot a fire
#: of ledgerq's scheduler records.
QUEUE_COLUMN = "queue"
PRIORITY_COLUMN = "priority"
SLOT_COLUMN = "slot_at"


class SqlBase:
    """One transaction on a DB-API connection; subclasses name the dialect's queries."""

    #: ``"sqlite"`` or ``"postgresql"``.
    dialect: str
    queries: ClassVar[Queries]
    #: The dialect's positional placeholder.
    mark: ClassVar[str]
    #: What ``LIMIT ?`` takes for "no limit".
    no_limit: ClassVar[Any]

    #: Statement texts per shape (table, columns, ...), built once per dialect: a hot move
    #: (a lease renewal) must not rebuild its SQL on every call, and the driver finds its
    #: prepared statement by the text.
    _texts: ClassVar[dict[tuple[Any, ...], str]]

    #: The DB-API connection (set by :class:`~ledgerq.store.sqltx.SqlTx`'s ``__init__``).
    conn: Any

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
        """A term implied by ``status = {state}`` (``state``: a name code gives a state,
        :mod:`ledgerq.lifecycle.naming`) that lets the planner pick the partial index on
        ``column`` (SQLite needs it; PostgreSQL proves implication itself)."""
        return self.q("true")

    def table(self, policy: EntityPolicy) -> str:
        return quote(policy.table)

    def of(self, name: str, policy: EntityPolicy, **fields: Any) -> str:
        """Query ``name`` about ``policy``'s rows: its ``{table}``, and each state the
        code acting on them names (``{queued}``, ...) as a literal of the state the name
        stands for (:mod:`ledgerq.lifecycle.naming`)."""
        return self.q(name, table=self.table(policy), **self.states(policy), **fields)

    def states(self, policy: EntityPolicy) -> dict[str, str]:
        """The states code names for ``policy``'s entity, as SQL literals, by name."""
        return _literals(policy.name)

    def _chunked_rows(self, name: str, policy: EntityPolicy, ids: Sequence[str],
                      **fields: Any) -> list[Row]:
        out: list[Row] = []
        for i in range(0, len(ids), CHUNK):
            part = list(ids[i:i + CHUNK])
            sql = self.of(name, policy, marks=self.marks(len(part)), **fields)
            out += self.dicts(self.execute(sql, part))
        return out

    def _limit(self, limit: int | None) -> Any:
        return self.no_limit if limit is None else limit

    def _in_lists(self, filters: dict[str, list[Any]]) -> tuple[list[str], list[Any]]:
        """The WHERE terms (and their parameters) of ``filters``: each column in its list
        (an empty list: no term)."""
        terms = [self.q("and_in_list", column=quote(c), marks=self.marks(len(v)))
                 for c, v in filters.items() if v]
        return terms, [x for v in filters.values() if v for x in v]


#: Entity -> (its named states, as :func:`_literals` rendered them).
_LITERALS: dict[str, tuple[Mapping[str, str], dict[str, str]]] = {}


def _literals(entity: str) -> dict[str, str]:
    """The states code names for ``entity``, as SQL string literals (the registry checked
    each state is an identifier; quoted all the same), by name."""
    named = named_states(entity)
    hit = _LITERALS.get(entity)
    if hit is None or hit[0] is not named:
        hit = _LITERALS[entity] = (named, {n: sql_literal(s) for n, s in named.items()})
    return hit[1]
