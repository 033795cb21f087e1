"""The library's exception tree, rooted at :class:`LedgerqError`.

Each class also derives from the built-in the ADR-0071 queue raises for its case
(``ValueError`` for bad input, ``LookupError`` for a missing entity), so callers
written against that queue keep catching what they caught. This module imports
nothing from ledgerq: every package may raise these without an import cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class LedgerqError(Exception):
    """Every error ledgerq raises on purpose."""


class InvalidInput(LedgerqError, ValueError):
    """A request, application, spec or value was refused before anything was written."""


class IdempotencyConflict(InvalidInput):
    """An idempotency key already names a different request: a run submitted with a
    different application, or a move to another state (a ValueError like every
    refusal; the HTTP API answers it with 409, not 422)."""


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


class DatabaseUnavailable(DatabaseError):
    """The database or the connection to it failed (lost connection, server restart, a
    lock not granted in time, an I/O error): not the request's fault. The unit was rolled
    back; trying again later is safe. Workers back off and reconnect."""


class IntegrityViolation(DatabaseError, ValueError):
    """A constraint of the schema refused the write (a CHECK, a unique key, a foreign key,
    the log's append-only trigger); the unit was rolled back."""


class SpecError(InvalidInput):
    """A spec file (or a set of them) is invalid; ``problems`` lists every finding (each a
    ``ledgerq.lifecycle.SpecProblem`` naming its file and item).

    The message is one line per problem, so an error that reaches a log or a traceback
    still names every file and item.
    """

    def __init__(self, problems: Iterable[Any]) -> None:
        self.problems: list[Any] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class MissingExtra(LedgerqError, ImportError):
    """A feature needs an optional extra that is not installed; the message names the
    ``pip install`` that adds it."""


class MigrationRefused(LedgerqError, ValueError):
    """Specs conflict with the database in a way no version order explains."""


class IllegalTransition(InvalidInput):
    """The spec declares no edge from the entity's state to the one asked for (the
    message lists the states it allows)."""


class ActorNotAllowed(InvalidInput):
    """The edge is restricted to other actor types than the request's."""


class MissingColumns(InvalidInput):
    """The edge requires guard or patch columns the request does not give."""


class UnknownReason(InvalidInput):
    """The reason code is not one the entity's spec declares."""


class Conflict(LedgerqError, ValueError):
    """The move lost: the entity was not in the state the caller expected (``expect=``),
    a guard did not match, or another writer moved it first. Nothing was written."""


class TaskFailed(LedgerqError):
    """A task's run ended other than completed: ``await run.result()`` raises this.

    ``status`` is the state it ended in (``failed``, ``timed_out``, ``cancelled``, ...);
    ``error_type``, ``message`` and ``traceback`` are what the task raised (None when it
    raised nothing: a timeout, a cancel, a refusal).
    """

    def __init__(self, run_id: str, status: str, *, error_type: str | None = None,
                 message: str | None = None, traceback: str | None = None) -> None:
        self.run_id, self.status = run_id, status
        self.error_type, self.message, self.traceback = error_type, message, traceback
        why = f"{error_type}: {message}" if error_type else message or "no error recorded"
        super().__init__(f"run {run_id} ended {status}: {why}")


__all__ = ["ActorNotAllowed", "Conflict", "DatabaseDamaged", "DatabaseError",
           "DatabaseGone", "DatabaseUnavailable", "IdempotencyConflict", "IllegalTransition",
           "IntegrityViolation", "InvalidInput", "LedgerqError", "MigrationRefused",
           "MissingColumns", "MissingExtra", "NotFound", "SchemaMissing", "SpecError",
           "TaskFailed", "UnknownReason"]
