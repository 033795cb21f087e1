"""What every route shares: the handle it reads, and the refusals its document lists."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from ledgerq.store.db import StateDB
from ledgerq.web.models import Error

_UNAVAILABLE = {"model": Error, "description": "The database is unavailable; retry later."}
#: Refusals of every read route (401 only when the server requires a token for reads).
READ: dict[int | str, dict[str, Any]] = {
    # Starlette's TrustedHostMiddleware answers it, before any route, in plain text.
    400: {"description": "The Host header names no host this server answers to (the "
                         "guard against DNS rebinding on a loopback bind).",
          "content": {"text/plain": {"schema": {"type": "string"}}}},
    401: {"model": Error, "description": "Missing or wrong bearer token."},
    503: _UNAVAILABLE,
}
#: Refusals of every mutating route.
WRITE: dict[int | str, dict[str, Any]] = {
    **READ,
    403: {"model": Error, "description": "The server has no token: it is read-only."},
}


def db_of(request: Request) -> StateDB:
    """The handle writes go to (the primary)."""
    db: StateDB = request.app.state.db
    return db


def reads_of(request: Request) -> StateDB:
    """The handle reads go to: a read replica's (``ledgerq serve --read-db``), else the
    one writes go to."""
    db: StateDB = request.app.state.read_db
    return db
