"""Exit codes and the one ``ledgerq: error:`` line every failure ends as.

Commands call :func:`die` rather than raising so that no failure, however deep, can
reach the user as a traceback or as more than one line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import typer

from ledgerq.cli.render import printable
from ledgerq.errors import DatabaseError
from ledgerq.queue.submission.application import check_text

#: Exit codes.
OK, DOMAIN_FAILURE, USAGE_ERROR = 0, 1, 2


def report(message: str) -> None:
    """The one error line: whitespace runs collapsed, unsafe characters escaped."""
    line = printable(" ".join(str(message).split()))
    sys.stderr.write(f"ledgerq: error: {line}\n")
    sys.stderr.flush()


def die(message: str, code: int = USAGE_ERROR) -> NoReturn:
    """One line on stderr, then exit with ``code``."""
    report(message)
    raise typer.Exit(code)


def text_option(value: str, option: str) -> str:
    """A value that is stored as text (and so must be UTF-8), or a usage error naming it."""
    try:
        check_text(value, option)
    except ValueError as exc:
        die(str(exc))
    return value


def check_choice(what: str, values: list[str], allowed: list[str]) -> None:
    """Refuse an unknown filter value up front: a typo would otherwise match nothing and
    look like an empty queue."""
    for v in values:
        if v not in allowed:
            die(f"unknown {what} {v!r}; expected one of {', '.join(allowed)}")


#: SQLite's words for a file whose pages are not what it wrote.
_DAMAGE_WORDS = ("malformed", "not a database", "corrupt")


def database_message(exc: BaseException, path: Path | str | None = None) -> str:
    """The one line for a database failure: ``database is damaged: <file>: ...`` for damage.

    The library's own errors (DatabaseDamaged, SchemaMissing, ...) already name the file;
    a bare sqlite3 error gets the path put in front.
    """
    if isinstance(exc, DatabaseError):
        return str(exc) or type(exc).__name__
    text = str(exc) or type(exc).__name__
    where = f"{path}: " if path is not None else ""
    if any(word in text.lower() for word in _DAMAGE_WORDS):
        return f"database is damaged: {where}{text}"
    return f"database error: {where}{text}"
