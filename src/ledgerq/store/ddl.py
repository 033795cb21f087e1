"""The projection tables' DDL in the standard SQL both dialects accept.

``CREATE TABLE IF NOT EXISTS`` with the spec's columns and the status ``CHECK``, and its
partial indexes, are the same statements on SQLite and PostgreSQL; what differs is each
column's type and clauses, which the dialect renders (``store/<dialect>/schema.py``
passes its ``column_ddl``). Every name is a registry-validated identifier, quoted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from ledgerq.lifecycle.identifiers import quote
from ledgerq.lifecycle.naming import named_entity, named_states
from ledgerq.lifecycle.registry import ColumnPolicy, EntityPolicy, Registry, sql_literal

_ON_DELETE = {"cascade": "CASCADE", "set_null": "SET NULL", "restrict": "RESTRICT"}


def column_ddl(column: ColumnPolicy, *, types: Mapping[str, str],
               booleans: tuple[str, str], reference_suffix: str = "") -> str:
    """One column's type and constraints, rendered from the closed vocabulary only.

    ``types`` maps each logical type to the dialect's, ``booleans`` spells true and false
    in a default, ``reference_suffix`` follows every REFERENCES clause (PostgreSQL's
    ``DEFERRABLE``)."""
    parts = [types[column.type]]
    if column.primary_key:
        parts.append("PRIMARY KEY")
    if column.not_null:
        parts.append("NOT NULL")
    if column.default is not None:
        parts.append(f"DEFAULT {literal(column.default, booleans)}")
    if column.references is not None:
        parts.append(f"REFERENCES {quote(column.references)}(id)")
        if column.on_delete is not None:
            parts.append(f"ON DELETE {_ON_DELETE[column.on_delete]}")
        if reference_suffix:
            parts.append(reference_suffix)
    return " ".join(parts)


def literal(value: bool | int | float | str, booleans: tuple[str, str]) -> str:
    if isinstance(value, bool):
        return booleans[0] if value else booleans[1]
    if isinstance(value, int | float):
        return repr(value)
    return sql_literal(value)


def projection_ddl(policy: EntityPolicy, column_ddl: Callable[[ColumnPolicy], str]) -> str:
    return "\n".join([table_statement(policy, column_ddl), *index_statements(policy).values()])


def table_statement(policy: EntityPolicy, column_ddl: Callable[[ColumnPolicy], str], *,
                    name: str | None = None) -> str:
    """The projection table's CREATE TABLE; ``name`` creates it under another name (a
    SQLite table rebuild's new table), references still naming the real tables."""
    cols = []
    for column_name, column in policy.columns.items():
        decl = column_ddl(column)
        if column_name == "status":
            decl = f"{decl} {policy.status_check()}"
        cols.append(f"  {quote(column_name)} {decl}")
    table = quote(name or policy.table)
    return f"CREATE TABLE IF NOT EXISTS {table} (\n" + ",\n".join(cols) + "\n);"


def index_statements(policy: EntityPolicy) -> dict[str, str]:
    """Each index's CREATE INDEX, by index name."""
    table = quote(policy.table)
    out = {}
    for ix in policy.indexes:
        unique = "UNIQUE " if ix.unique else ""
        terms = [f"{quote(c)} IS NOT NULL" for c in ix.not_null]
        if ix.status_in is not None:
            terms.append(f"status IN ({', '.join(sql_literal(s) for s in ix.status_in)})")
        where = f" WHERE {' AND '.join(terms)}" if terms else ""
        out[ix.name] = (
            f"CREATE {unique}INDEX IF NOT EXISTS {quote(ix.name)} "
            f"ON {table}({', '.join(_key(c, ix.descending) for c in ix.columns)}){where};"
        )
    return out


def _key(column: str, descending: frozenset[str]) -> str:
    """One key column of an index (both dialects spell a descending key alike)."""
    return f"{quote(column)} DESC" if column in descending else quote(column)


def runs_ddl(template: str, registry: Registry) -> str | None:
    """A dialect's DDL that names the run entity's table as ``{runs}`` (``workers``, the
    wake-up trigger) with the table the spec names, or None when the registry has no run
    entity (the engine alone)."""
    # The entity whose rows a worker leases (the queue names it): ``workers`` references it.
    entity = named_entity("runs")
    runs = next((p for p in registry.policies() if p.name == entity), None)
    if runs is None:
        return None
    # ``{terminal}``: the spec's terminal states as SQL string literals (identifier-safe
    # names: the registry checked them).
    terminal = ", ".join(sql_literal(s) for s in sorted(runs.terminal))
    ddl = template.replace("{runs}", quote(runs.table)).replace("{terminal}", terminal)
    # ``{queued}``, ...: the states the queue names (ledgerq.lifecycle.naming).
    for name, state in named_states(runs.name).items():
        ddl = ddl.replace("{" + name + "}", sql_literal(state))
    return ddl
