"""JSON for JSON columns and fact payloads: msgspec, compact and float-exact."""

from __future__ import annotations

from typing import Any

import msgspec

_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder()


def dumps(value: Any) -> str:
    return _encoder.encode(value).decode()


def dumpb(value: Any) -> bytes:
    """:func:`dumps` as UTF-8 bytes, what a hash takes (no round trip through a str)."""
    return _encoder.encode(value)


def loads(text: str | bytes | None) -> Any:
    if text is None:
        return None
    return _decoder.decode(text)


#: What goes to the database as JSON text (a tuple: ``dict | list | tuple`` is rebuilt
#: per call).
CONTAINERS = (dict, list, tuple)


def to_sql(value: Any) -> Any:
    """Containers go to the database as JSON text; scalars as they are."""
    if isinstance(value, CONTAINERS):
        return dumps(value)
    return value
