"""Rows as readers get them: JSON columns decoded, and the keyset cursors of pages.

Shared by the queue's read models and the entity handles, so a page of runs and a page
of orders decode and continue the same way.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from typing import Any

from ledgerq.codec import dumps, loads
from ledgerq.errors import InvalidInput


def decode_json(row: dict[str, Any], columns: Iterable[str]) -> dict[str, Any]:
    """``row`` with each of ``columns`` that holds JSON text decoded (invalid JSON is
    left as text: hand-written garbage stays visible)."""
    out = dict(row)
    for col in columns:
        value = out.get(col)
        if isinstance(value, str | bytes):
            try:
                out[col] = loads(value)
            except Exception:
                out[col] = value  # hand-written garbage stays visible as text
    return out


def floats_as_floats(values: dict[str, Any], float_columns: Iterable[str]) -> dict[str, Any]:
    """``values`` (a fact's patch, or a fold of several) with each float column's value a
    float: the log is JSON, where a whole-number float such as 4.4e16 may read back as an
    integer (PostgreSQL's jsonb keeps it as a decimal), and an int sent to a float column
    stays an int in the fact while the column holds the float. Changed in place."""
    for column in float_columns:
        value = values.get(column)
        if type(value) is int:
            values[column] = float(value)
    return values


def encode_cursor(created_at: float, row_id: str) -> str:
    """An opaque cursor: the (created_at, id) of the last row on a page, base64url JSON."""
    raw = dumps([created_at, row_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    """The position a cursor names; InvalidInput for anything :func:`encode_cursor` did not
    make (a cursor is input from a URL)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        value = loads(raw)
    except Exception:
        value = None
    position: float | None = None
    if (isinstance(value, list) and len(value) == 2 and not isinstance(value[0], bool)
            and isinstance(value[0], int | float) and isinstance(value[1], str)
            and "\x00" not in value[1]):
        try:
            position = float(value[0])  # (an integer of 400 digits overflows a float)
        except OverflowError:
            position = None
    if position is None or not math.isfinite(position):
        raise InvalidInput(f"cursor {cursor[:40]!r} is not a cursor this server made")
    return position, value[1]


__all__ = ["decode_cursor", "decode_json", "encode_cursor"]
