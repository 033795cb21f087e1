"""The HTTP server under slow and hostile clients: uvicorn, with its connections bounded.

uvicorn reads a request's headers for as long as a client cares to send them, and keeps
every connection it accepts: 320 connections holding partial headers (slowloris) under
a 300-file limit made ``/healthz`` fail with "Too many open files". So each connection
here must complete a request's headers within :data:`HEADER_SECONDS` of being accepted
(or of its previous response), or it is closed; and the server holds at most
:func:`max_connections` connections, well below the file limit: a connection beyond
that evicts the oldest one that is waiting for headers (the slow ones; a request in
progress is never cut), or is closed at once when none is. A new client, a health
check among them, therefore gets in however many slow ones are open. Bodies are bounded
in size and time, and read only from clients with the token
(:class:`~ledgerq.web.limits.BodyLimit`); idle keep-alive connections close after
uvicorn's ``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
import resource
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

#: The longest a connection may take to send a request's headers.
HEADER_SECONDS = 10.0
#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE_SECONDS = 5.0
#: Connections at most, whatever the file limit allows.
CONNECTION_CEILING = 1000
#: Files kept for everything else the server opens (database, logs, the dashboard's files).
FILE_RESERVE = 100


def max_connections() -> int:
    """Connections the server holds at once: below the process's open-file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return CONNECTION_CEILING
    return max(8, min(CONNECTION_CEILING, soft - FILE_RESERVE))


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a deadline for headers and a cap on connections."""

    cap = CONNECTION_CEILING
    header_seconds = HEADER_SECONDS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.accepted_at = time.monotonic()
        if len(self.connections) > self.cap and not self._evict():
            transport.abort()  # no slow connection to give way: this one is shed at once
            return
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def _arm(self) -> None:
        """Close the connection unless a request's headers arrive within the deadline."""
        self._waiting_since = time.monotonic()
        armed = self.cycle
        self.loop.call_later(self.header_seconds, self._headers_due, armed)

    def _headers_due(self, armed: Any) -> None:
        if self.cycle is armed and not self.transport.is_closing():
            self.transport.abort()

    def _waiting(self) -> bool:
        """Whether the connection is between requests (no request in progress)."""
        return self.cycle is None or self.cycle.response_complete

    def _evict(self) -> bool:
        """Close the connection that has waited longest for headers; whether one was."""
        idle = [c for c in self.connections
                if c is not self and isinstance(c, GuardedH11Protocol) and c._waiting()
                and not c.transport.is_closing()]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: getattr(c, "_waiting_since", c.accepted_at))
        oldest.transport.abort()
        return True


def run(app: Any, *, host: str, port: int) -> None:
    """Serve ``app`` until interrupted, with the guards above."""
    GuardedH11Protocol.cap = max_connections()
    uvicorn.run(app, host=host, port=port, log_level="warning", server_header=False,
                proxy_headers=False, http=GuardedH11Protocol,
                timeout_keep_alive=int(KEEP_ALIVE_SECONDS))
