"""The library's exception tree, rooted at :class:`LedgerqError`.

Each class also derives from the built-in the architecture record specifies for its
case (``ValueError`` for bad input, ``LookupError`` for a missing entity), so callers
written against the record keep catching what they caught. This module imports
nothing from ledgerq: every package may raise these without an import cycle.
"""

from __future__ import annotations


class LedgerqError(Exception):
    """Every error ledgerq raises on purpose."""


class InvalidInput(LedgerqError, ValueError):
    """A request, application, spec or value was refused before anything was written."""


class NotFound(LedgerqError, LookupError):
    """The entity (or run) named does not exist."""


class DatabaseError(LedgerqError):
    """The database cannot be used as asked; nothing was written by the failing call."""


class DatabaseDamaged(DatabaseError):
    """The database file fails its integrity check (or SQLite reported it malformed).

    Writes are refused once a handle has seen this: writing into a damaged file can
    spread the damage into pages that were still good.
    """


class SchemaMissing(DatabaseError):
    """A read-only open found no ledgerq schema (read-only access never creates one)."""


class DatabaseGone(DatabaseError):
    """The database file was deleted or replaced under an open handle."""


__all__ = ["DatabaseDamaged", "DatabaseError", "DatabaseGone", "InvalidInput", "LedgerqError",
           "NotFound", "SchemaMissing"]
