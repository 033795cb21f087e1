"""Input limits applied before any handler runs: who may send a body, how large and how
slowly, and JSON nesting depth.

The body limit is an ASGI middleware that reads the whole body (at most ``limit`` bytes,
within ``BODY_SECONDS``) before the application sees it, so a 413 is answered whether the
client declared its length or streamed it chunked, and nothing is parsed or written.
Only a request that carries the server's token is read at all: every route that takes a
body is a write, so an anonymous body is refused from its headers (401, or 403 on a
server without a token) and never buffered; 200 anonymous clients each trickling a
megabyte otherwise held 200 MB. The depth limit is a
scan of the raw bytes before ``json.loads``: Python's decoder recurses, and a body of a
million ``[`` would otherwise end as a RecursionError (a 500), not a refusal.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledgerq.errors import InvalidInput
from ledgerq.web.auth import READ_ONLY, UNAUTHORIZED, token_matches

#: The longest a client may take to send a request's body.
BODY_SECONDS = 10.0


async def _answer(send: Send, status: int, detail: str,
                  headers: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    """A JSON error, and the connection closed after it (its body was never read)."""
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send: Send, limit: int) -> None:
    await _answer(send, 413, f"request body exceeds {limit:,} bytes")


class BodyLimit:
    """Refuse a body from a client without the token (401/403) before reading it, a body
    larger than ``limit`` bytes (413), and one not sent within ``BODY_SECONDS`` (408)."""

    def __init__(self, app: ASGIApp, limit: int, token: str | None = None,
                 seconds: float = BODY_SECONDS) -> None:
        self.app = app
        self.limit = limit
        self.token = token
        self.seconds = seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = 0
        chunked = False
        authorization = b""
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"authorization":
                authorization = value
        if declared > self.limit:
            await _refuse(send, self.limit)
            return
        if (declared or chunked) and not self._authorized(authorization):
            # The route decides its own refusal for a body-less request; a body is only
            # ever a write's, and is not read for a client that may not write.
            if self.token is None:
                await _answer(send, 403, READ_ONLY)
            else:
                await _answer(send, 401, "a request with a body needs the bearer token "
                              "(Authorization: Bearer <token>)",
                              tuple((k.lower().encode(), v.encode())
                                    for k, v in UNAUTHORIZED.items()))
            return
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.seconds):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    part = message.get("body", b"")
                    size += len(part)
                    if size > self.limit:
                        await _refuse(send, self.limit)
                        return
                    chunks.append(part)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await _answer(send, 408, f"the request body did not arrive within "
                          f"{self.seconds:g} s")
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


    def _authorized(self, header: bytes) -> bool:
        if self.token is None:
            return False
        scheme, _, presented = header.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and token_matches(self.token, presented.strip())


def json_depth_exceeds(raw: bytes, limit: int) -> bool:
    """Whether ``raw`` nests arrays/objects deeper than ``limit`` (strings skipped)."""
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def _no_constant(name: str) -> Any:
    raise InvalidInput(f"the body is not valid JSON: {name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise InvalidInput(f"the body is not valid JSON: {text[:40]} overflows a number")
    return value


def parse_json(raw: bytes, max_depth: int) -> Any:
    """The body as JSON, or InvalidInput saying why not (never a RecursionError)."""
    if json_depth_exceeds(raw, max_depth):
        raise InvalidInput(f"the body nests JSON deeper than {max_depth} levels")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the body is not UTF-8: byte {exc.start}") from None
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"the body is not valid JSON: {exc.msg} at line {exc.lineno} "
                           f"column {exc.colno}") from None
    except RecursionError:  # pragma: no cover - the scan above bounds the depth
        raise InvalidInput("the body nests JSON too deeply") from None
