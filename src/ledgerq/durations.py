"""Durations as operators type them (``90s``, ``10m``, ``1h30m``, ``2d``), parsed once.

Every option that takes a span of time (``ls --since``, ``retry --since``, ``wait
--timeout``, ``worker --max-runtime``) goes through :func:`parse_duration`, so each
accepts the same spellings and refuses a bad one with the same message, naming it.
"""

from __future__ import annotations

import math
import re

from ledgerq.errors import InvalidInput

#: Seconds per unit.
UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+")


def parse_duration(text: str, what: str = "duration") -> float:
    """Seconds in ``text``: one or more ``<number><unit>`` parts (units ms, s, m, h, d, w),
    or a bare number of seconds. InvalidInput names ``what`` and the value otherwise."""
    raw = text.strip().lower()
    seconds: float
    try:
        seconds = float(raw)
    except ValueError:
        if not _WHOLE.fullmatch(raw):
            raise InvalidInput(
                f"{what}: {text!r} is not a duration (e.g. 30s, 10m, 1h30m, 2d; units "
                f"{', '.join(UNITS)})") from None
        seconds = sum(float(n) * UNITS[u] for n, u in _PART.findall(raw))
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidInput(f"{what}: {text!r} is not a duration (a finite, non-negative "
                           "span is needed)")
    return seconds
