"""Scratch schemas: an empty namespace per test in an existing PostgreSQL database.

A schema is the unit PostgreSQL isolates cheaply: a connection whose ``search_path`` is
the schema sees only its tables, so many tests share one database (and its server)
without seeing each other's rows. Dropping the schema drops everything in it.
"""

from __future__ import annotations

import urllib.parse

import psycopg
from psycopg import sql


def schema_url(base: str, schema: str) -> str:
    """``base`` with ``search_path`` set to ``schema`` (libpq's ``options``)."""
    sep = "&" if "?" in base else "?"
    return base + sep + "options=" + urllib.parse.quote(f"-csearch_path={schema}")


def create_schema(base: str, schema: str) -> str:
    """An empty schema ``schema`` (dropped first if a crashed run left it); the URL of a
    connection that uses it."""
    name = sql.Identifier(schema)
    with psycopg.connect(base, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(name))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(name))
    return schema_url(base, schema)


def drop_schema(base: str, schema: str) -> None:
    with psycopg.connect(base, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


__all__ = ["create_schema", "drop_schema", "schema_url"]
