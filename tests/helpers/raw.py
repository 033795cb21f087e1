"""A plain driver connection to a test's database, around ledgerq: a hand edit.

Tests that forge rows, delete them or poke the log with SQL do it through this, on
either backend: the statements are written with ``?`` and run as ``%s`` on PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import psycopg

#: What a driver raises when the database refuses a statement, on either backend.
RAW_ERRORS = (sqlite3.DatabaseError, psycopg.Error)


class Raw:
    def __init__(self, target: str) -> None:
        self.postgres = target.startswith(("postgresql://", "postgres://"))
        if self.postgres:
            self.conn: Any = psycopg.connect(target, autocommit=True)
        else:
            self.conn = sqlite3.connect(target, isolation_level=None)
            self.conn.execute("PRAGMA busy_timeout = 5000")

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        if self.postgres:
            if sql == "PRAGMA foreign_keys = OFF":  # a hand edit that ignores references
                sql = "SET session_replication_role = replica"
            elif sql.startswith("PRAGMA"):
                return None  # SQLite's connection settings; nothing to set on PostgreSQL
            sql = sql.replace("?", "%s").replace("BEGIN IMMEDIATE", "BEGIN")
        return self.conn.execute(sql, params)

    def close(self) -> None:
        self.conn.close()


def raw(target: str) -> Raw:
    return Raw(target)


def refusal(target: str, name: str, *, event: str, message: str,
            table: str = "schedule_runs", when_id: str | None = None
            ) -> tuple[list[str], list[str]]:
    """(statements that make ``event`` on ``table`` raise ``message``, statements that undo
    it), in the target's dialect; ``when_id`` limits it to one row (UPDATE/DELETE only).

    Both raise as a constraint would (SQLite's RAISE(ABORT), PostgreSQL's
    integrity_constraint_violation), so the library sees the same error on either.
    """
    if target.startswith(("postgresql://", "postgres://")):
        cond = f"OLD.id = '{when_id}'" if when_id is not None else "TRUE"
        back = "OLD" if event == "DELETE" else "NEW"
        return ([f"CREATE FUNCTION {name}_fn() RETURNS trigger LANGUAGE plpgsql AS $$ "
                 f"BEGIN IF {cond} THEN RAISE EXCEPTION '{message}' "
                 f"USING ERRCODE = 'integrity_constraint_violation'; END IF; "
                 f"RETURN {back}; END $$",
                 f"CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW "
                 f"EXECUTE FUNCTION {name}_fn()"],
                [f"DROP TRIGGER {name} ON {table}", f"DROP FUNCTION {name}_fn()"])
    when = f" WHEN OLD.id = '{when_id}'" if when_id is not None else ""
    return ([f"CREATE TRIGGER {name} BEFORE {event} ON {table}{when} "
             f"BEGIN SELECT RAISE(ABORT, '{message}'); END"], [f"DROP TRIGGER {name}"])
