"""What one ``ledgerq serve`` process is configured with, checked before it binds."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ledgerq.errors import InvalidInput

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
#: A request body larger than this is refused with 413 before it is parsed (1 MiB; the
#: library accepts ``args`` of up to 1 MiB, so the largest need ``--max-body`` raised).
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
#: JSON nested deeper than this is refused before it is decoded (the library's own limit
#: on ``args`` is 64 levels; this bounds the decoder for every other field too).
DEFAULT_MAX_JSON_DEPTH = 100
TOKEN_ENV = "LEDGERQ_API_TOKEN"
#: The names a loopback server answers to, beside the address it is bound to.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_origin(text: str) -> bool:
    """Whether ``text`` is a browser origin: ``http(s)://host[:port]`` and nothing else."""
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018  (a port that is not a number raises)
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and bool(parts.hostname)
            and not (parts.path or parts.query or parts.fragment or parts.username)
            and text == text.strip() and not text.endswith(":"))


@dataclass(frozen=True)
class ServeConfig:
    """One server's settings. ``token`` None: reads are open and writes are refused (403)."""

    db: str
    token: str | None = None
    public_read: bool = False
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_json_depth: int = DEFAULT_MAX_JSON_DEPTH
    cors_origins: tuple[str, ...] = ()
    specs: str | None = None
    #: A read replica's URL: reads come from it, writes go to ``db`` (the primary).
    read_db: str | None = None
    #: ``db`` goes through a transaction pooler; ``listen_url``: the server's own URL.
    pooled: bool = False
    listen_url: str | None = None
    #: Hosts the Host header may name (DNS-rebinding defence); empty: any.
    allowed_hosts: tuple[str, ...] = field(default=())

    def check(self) -> None:
        """Refuse a configuration that would expose the queue: no token off loopback."""
        if self.token is not None and not self.token.strip():
            raise InvalidInput("the API token is empty")
        if self.token is not None and not (self.token.isascii() and self.token.isprintable()):
            # HTTP headers carry bytes a server reads as Latin-1: only printable ASCII
            # arrives as it was typed.
            raise InvalidInput("the API token must be printable ASCII")
        if self.token is None and not is_loopback(self.host):
            raise InvalidInput(
                f"refusing to serve on {self.host} without a token: set {TOKEN_ENV} or "
                "pass --token-file (or bind 127.0.0.1)")
        if self.max_body_bytes < 1 or self.max_json_depth < 1:
            raise InvalidInput("body and depth limits must be >= 1")
        for origin in self.cors_origins:
            self._check_origin(origin)

    def _check_origin(self, origin: str) -> None:
        """A CORS origin is ``scheme://host[:port]`` (what a browser sends), or ``*``
        only where every read needs the token: a wildcard on an open server lets any web
        page a user visits read the queue through the user's browser."""
        if origin == "*":
            if self.token is None or self.public_read:
                raise InvalidInput(
                    "--cors-origin '*' lets any web page read the queue through a "
                    "visitor's browser: it needs an API token and no --public-read")
            return
        if not _is_origin(origin):
            raise InvalidInput(f"--cors-origin {origin!r} is not an origin: give "
                               "scheme://host[:port], e.g. https://ops.example.com")

    def hosts(self) -> list[str]:
        """The Host header values accepted: on a loopback bind only loopback names, so a
        page of another site cannot reach the API by rebinding its DNS name to 127.0.0.1."""
        if self.allowed_hosts:
            return list(self.allowed_hosts)
        if is_loopback(self.host):
            # The address it is bound to as well (127.0.0.2 is loopback too), in both
            # spellings an IPv6 Host header may take.
            bound = self.host.strip("[]")
            return list(dict.fromkeys([*LOOPBACK_NAMES, bound, f"[{bound}]" if ":" in bound
                                       else bound]))
        return ["*"]
