"""Scratch PostgreSQL databases and schemas for tests (never the test/postgres data)."""

from __future__ import annotations

import os
import urllib.parse

import psycopg

ADMIN_URL = os.environ.get("LEDGERQ_TEST_POSTGRES",
                           "postgresql://postgres@127.0.0.1:5432/postgres")


def unreachable() -> str | None:
    """Why PostgreSQL cannot be used, or None."""
    try:
        psycopg.connect(ADMIN_URL, connect_timeout=3).close()
    except psycopg.Error as exc:
        return str(exc).strip() or type(exc).__name__
    return None


def _with_db(url: str, dbname: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path=f"/{dbname}"))


def create_database(name: str | None = None) -> str:
    """A new empty database (dropped first if a crashed run left it); its URL."""
    name = name or f"ledgerq_test_{os.getpid()}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return _with_db(ADMIN_URL, name)


_session: list[str] = []


def session_database() -> str:
    """This test process's scratch database, created on first use (conftest drops it)."""
    if not _session:
        _session.append(create_database())
    return _session[0]


def drop_database(url: str) -> None:
    name = urllib.parse.urlsplit(url).path.lstrip("/")
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def schema_url(base: str, schema: str) -> str:
    """``base`` with ``search_path`` set to ``schema`` (libpq's ``options``)."""
    sep = "&" if "?" in base else "?"
    return base + sep + "options=" + urllib.parse.quote(f"-csearch_path={schema}")


def create_schema(base: str, schema: str) -> str:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return schema_url(base, schema)


def drop_schema(base: str, schema: str) -> None:
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


_machine_schema: list[str] = []


def fresh_target(backend: str, tmp: str) -> tuple[str, str | None]:
    """(a database target for one hypothesis example, the PostgreSQL schema it uses).

    On PostgreSQL one schema serves every example of this process: creating a schema's
    tables per example would cost more than the example. Each example starts from empty
    tables instead (TRUNCATE, with triggers off for the append-only log's refusal)."""
    if backend == "sqlite":
        return os.path.join(tmp, "machine.db"), None
    problem = unreachable()
    if problem is not None:
        import pytest

        if os.environ.get("LEDGERQ_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required (LEDGERQ_REQUIRE_POSTGRES=1): {problem}")
        pytest.skip(f"PostgreSQL not reachable: {problem}")
    base = session_database()
    if not _machine_schema:
        _machine_schema.append(f"machines_{os.getpid()}")
        return create_schema(base, _machine_schema[0]), _machine_schema[0]
    schema = _machine_schema[0]
    with psycopg.connect(schema_url(base, schema), autocommit=True) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s "
            "AND tablename <> 'ledgerq_schema'", (schema,))]
        if tables:
            conn.execute("SET session_replication_role = replica")
            conn.execute("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " CASCADE")
    return schema_url(base, schema), schema


def drop_target(schema: str | None) -> None:
    """Nothing to drop per example: the schema is reused (and goes with the database)."""
