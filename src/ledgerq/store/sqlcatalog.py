"""The parts of a migration's :class:`~ledgerq.store.migrate.Catalog` both dialects share.

What a plan asks of the data (counts and a few ids), the recorded specs, and creating
or dropping an entity's table are the same statements on SQLite and PostgreSQL, named in
each dialect's ``*.sql``; written once here, over the dialect's SqlTx (its queries,
placeholder and connection). Reading the schema back and altering a table are each
dialect's own (``store/<dialect>/catalog.py``).
"""

from __future__ import annotations

from typing import Any

from ledgerq.lifecycle import evolution
from ledgerq.lifecycle.evolution import Normal
from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.registry import ColumnPolicy, EntityPolicy
from ledgerq.store import ddl
from ledgerq.store.migrate import Catalog
from ledgerq.store.sqltx import SqlTx


class SqlCatalog(Catalog):
    def __init__(self, tx: SqlTx, column_ddl: Any) -> None:
        self._sql = tx
        self.conn = tx.conn
        self._column_ddl = column_ddl

    def column_ddl(self, column: ColumnPolicy) -> str:
        return str(self._column_ddl(column))

    def run(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        cur = self._sql.execute(sql, params)
        return list(cur.fetchall()) if cur.description is not None else []

    def q(self, name: str, **fields: Any) -> str:
        return self._sql.q(name, **fields)

    # ------------------------------------------------------------ the data

    def _sample(self, table: str, where: str, params: tuple[Any, ...]
                ) -> tuple[int, list[str]]:
        t = quote(table)
        n = int(self.run(self.q("count_where", table=t, where=where), params)[0][0])
        if not n:
            return 0, []
        ids = self.run(self.q("ids_where", table=t, where=where,
                              limit=f"LIMIT {evolution.SAMPLE_IDS}"), params)
        return n, [r[0] for r in ids]

    def rows(self, table: str) -> tuple[int, list[str]]:
        return self._sample(table, "1 = 1", ())

    def rows_in(self, table: str, state: str) -> tuple[int, list[str]]:
        return self._sample(table, f"status = {self._sql.mark}", (state,))

    def holding(self, table: str, column: str, *, null: bool = False) -> tuple[int, list[str]]:
        return self._sample(table, f"{quote(column)} IS {'' if null else 'NOT '}NULL", ())

    def ids_in(self, table: str, state: str) -> list[str]:
        return [r[0] for r in self.run(self.q(
            "ids_where", table=quote(table), where=f"status = {self._sql.mark}", limit=""),
            (state,))]

    # ------------------------------------------------------------ the recorded specs

    def recorded(self) -> dict[str, Normal]:
        if "ledgerq_specs" not in self.tables():
            return {}
        return {r[0]: evolution.decode(r[1]) for r in self.run(self.q("recorded_specs"))}

    def record(self, normal: Normal, now: float) -> None:
        text = evolution.encode(normal)
        digest = evolution.spec_hash(normal)
        self.run(self.q("record_spec"), (normal["entity"], normal["table"], digest, text, now))
        self.run(self.q("record_spec_version"), (normal["entity"], digest, text, now))

    def forget(self, entity: str) -> None:
        self.run(self.q("forget_spec"), (entity,))

    # ------------------------------------------------------------ tables

    def create(self, policy: EntityPolicy) -> None:
        self.run(ddl.table_statement(policy, self._column_ddl))
        for statement in ddl.index_statements(policy).values():
            self.run(statement)

    def drop(self, table: str) -> None:
        self.run(f"DROP TABLE {quote(table)}")

    def tx(self) -> SqlTx:
        return self._sql
