"""Optional features and the extra that installs each.

The core install (the library, the ``ledgerq`` command, SQLite) stays small; PostgreSQL
and the HTTP server are extras most users never need. A feature whose extra is missing
says so in one line naming the ``pip install`` that adds it, instead of an ImportError
from deep inside a driver.
"""

from __future__ import annotations

import importlib.util

from ledgerq.errors import MissingExtra

#: extra -> (what it enables, the top-level modules it installs)
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "postgres": ("PostgreSQL", ("psycopg", "psycopg_pool")),
    "server": ("ledgerq serve (the HTTP API and dashboard)", ("fastapi", "uvicorn")),
    "testing": ("ledgerq.testing (stateful tests of a lifecycle, its transitions model)",
                ("hypothesis", "transitions")),
}


def missing(extra: str) -> str | None:
    """The first module of ``extra`` that is not installed, or None when all are."""
    _, modules = EXTRAS[extra]
    for module in modules:
        if importlib.util.find_spec(module) is None:
            return module
    return None


def require(extra: str) -> None:
    """Raise :class:`MissingExtra` naming the install command when ``extra`` is absent."""
    module = missing(extra)
    if module is not None:
        feature, _ = EXTRAS[extra]
        raise MissingExtra(f"{feature} needs the {extra!r} extra ({module} is not "
                           f"installed): pip install 'ledgerq[{extra}]'")


__all__ = ["EXTRAS", "missing", "require"]
