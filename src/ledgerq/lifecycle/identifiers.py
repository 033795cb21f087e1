"""What a spec may name: strict identifiers that are safe wherever SQL interpolates them.

Entity, table, column, index and state names and the parts of reason codes end up in
DDL and queries. Values bound as parameters need nothing, but names cannot be bound,
so every name a spec supplies must match :data:`IDENTIFIER` (``\\Z``-anchored: ``$``
would admit a trailing newline), stay within PostgreSQL's 63-byte name limit, and not
be a name ledgerq's own schema takes. SQL keywords are valid names (an ``order``
entity, a ``group`` column): every identifier is double-quoted in every statement.
Validation happens in the registry, before any database is opened.
"""

from __future__ import annotations

import functools
import re

IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*\Z")
REASON_CODE = re.compile(r"[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*\Z")
#: PostgreSQL truncates longer names (NAMEDATALEN - 1); two would then collide.
MAX_IDENTIFIER = 63

#: SQLite's keywords (sqlite.org/lang_keywords.html) and PostgreSQL's reserved words,
#: lower-cased: valid names, since every identifier is quoted; the tests use them.
SQL_KEYWORDS = frozenset("""
abort action add after all alter always analyze and as asc attach autoincrement before
begin between by cascade case cast check collate column commit conflict constraint
create cross current current_date current_time current_timestamp database default
deferrable deferred delete desc detach distinct do drop each else end escape except
exclude exclusive exists explain fail filter first following for foreign from full
generated glob group groups having if ignore immediate in index indexed initially inner
insert instead intersect into is isnull join key last left like limit match materialized
natural no not nothing notnull null nulls of offset on or order others outer over
partition plan pragma preceding primary query raise range recursive references regexp
reindex release rename replace restrict returning right rollback row rows savepoint
select set table temp temporary then ties to transaction trigger unbounded union unique
update using vacuum values view virtual when where window with without analyse any array
asymmetric authorization binary both concurrently current_catalog current_role
current_schema current_user fetch freeze grant ilike lateral leading localtime
localtimestamp only overlaps placing session_user similar some symmetric tablesample
trailing true false user variadic verbose
""".split())  # noqa: SIM905


def identifier_problem(name: object) -> str | None:
    """Why ``name`` cannot be a spec identifier, or None when it can."""
    if not isinstance(name, str) or not IDENTIFIER.match(name):
        return f"{name!r} must be a lower_snake_case identifier ([a-z_][a-z0-9_]*)"
    if len(name) > MAX_IDENTIFIER:
        return f"{name!r} is longer than {MAX_IDENTIFIER} characters"
    return None


def reason_code_problem(code: str) -> str | None:
    """Why ``code`` cannot be a reason code (domain.status.cause), or None."""
    if not REASON_CODE.match(code):
        return (f"malformed reason code {code!r}; expected domain.status.cause in "
                "lower_snake_case")
    if len(code) > 3 * MAX_IDENTIFIER:
        return f"reason code {code!r} is too long"
    return None


@functools.lru_cache(maxsize=4096)
def quote(name: str) -> str:
    """A validated identifier, double-quoted: a keyword means itself, and no name can
    start a second statement."""
    problem = identifier_problem(name)
    if problem is not None:
        raise ValueError(f"refusing to interpolate an identifier: {problem}")
    return f'"{name}"'
