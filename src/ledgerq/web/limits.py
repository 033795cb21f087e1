"""Input limits applied before any handler runs: body size and JSON nesting depth.

The body limit is an ASGI middleware that reads the whole body (at most ``limit`` bytes)
before the application sees it, so a 413 is answered whether the client declared its
length or streamed it chunked, and nothing is parsed or written. The depth limit is a
scan of the raw bytes before ``json.loads``: Python's decoder recurses, and a body of a
million ``[`` would otherwise end as a RecursionError (a 500), not a refusal.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ledgerq.errors import InvalidInput


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps({"detail": f"request body exceeds {limit:,} bytes"}).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Refuse (413) any request whose body is larger than ``limit`` bytes."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.limit:
                    await _refuse(send, self.limit)
                    return
        chunks: list[bytes] = []
        size = 0
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
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


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
