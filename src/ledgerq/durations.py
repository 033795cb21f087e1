"""Times as operators type them: durations (``90s``, ``10m``, ``1h30m``, ``2d``) and ISO
8601 instants, each parsed in one place.

Every option that takes a span of time (``ls --since``, ``retry --since``, ``wait
--timeout``, ``worker --max-runtime``, ``submit --delay``, a schedule's ``every``) goes
through :func:`parse_duration`, so each accepts the same spellings and refuses a bad one
with the same message, naming it; ``submit --at`` goes through :func:`parse_instant`.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

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


def parse_instant(text: str, what: str = "time") -> float:
    """Epoch seconds of an ISO 8601 time; one without an offset is in local time."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"{what}: {text!r} is not an ISO 8601 time (e.g. 2026-12-03T14:00 "
                           "or 2026-12-03T14:00:00+01:00)") from None
    return moment.timestamp() if moment.tzinfo is not None else moment.astimezone().timestamp()
