"""Bearer-token authentication: who may read and who may write.

One token per server (``LEDGERQ_API_TOKEN`` or ``--token-file``), compared in constant
time (:func:`hmac.compare_digest` over the UTF-8 bytes) so a client cannot learn it a
byte at a time from response timings. Writes always need it; reads need it unless the
server runs with ``--public-read``. A server started without a token is local-only (the
config refuses anything else) and read-only: every write answers 403.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

#: The OpenAPI security scheme, and the parser of ``Authorization: Bearer <token>``.
bearer = HTTPBearer(auto_error=False, description="The server's API token.")

UNAUTHORIZED = {"WWW-Authenticate": 'Bearer realm="ledgerq"'}
#: Why a write is refused by a server started without a token.
READ_ONLY = ("this server has no API token, so it is read-only: start it with "
             "LEDGERQ_API_TOKEN or --token-file")


def token_matches(expected: str, presented: str) -> bool:
    """Constant-time comparison of the presented token with the configured one."""
    return hmac.compare_digest(expected.encode("utf-8", "surrogatepass"),
                               presented.encode("utf-8", "surrogatepass"))


def _check(request: Request, credentials: HTTPAuthorizationCredentials | None,
           *, write: bool, costly: bool = False) -> None:
    config = request.app.state.config
    expected: str | None = config.token
    if expected is None:
        if write:
            raise HTTPException(403, READ_ONLY)
        return
    if not write and not costly and config.public_read:
        return
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(401, "missing bearer token (Authorization: Bearer <token>)",
                            headers=UNAUTHORIZED)
    if not token_matches(expected, credentials.credentials):
        raise HTTPException(401, "wrong bearer token", headers=UNAUTHORIZED)


Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]


async def require_read(request: Request, credentials: Credentials) -> None:
    """Dependency of every read route."""
    _check(request, credentials, write=False)


async def require_costly_read(request: Request, credentials: Credentials) -> None:
    """Dependency of reads that fold the whole log (``/api/verify``: seconds at a few
    hundred thousand facts): the token even under ``--public-read``, so an anonymous
    caller cannot keep the database busy."""
    _check(request, credentials, write=False, costly=True)


async def require_write(request: Request, credentials: Credentials) -> None:
    """Dependency of every mutating route."""
    _check(request, credentials, write=True)
