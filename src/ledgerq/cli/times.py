"""Times an operator types: durations (``30s``, ``5m``, ``1h30m``) and ISO 8601 instants.

One parser for every option that takes them, so ``--delay`` and any later ``--since``
read ``90``, ``90s`` and ``1m30s`` alike and name a bad value the same way.
"""

from __future__ import annotations

import math
import re
from datetime import datetime

#: Seconds per unit of a duration.
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a plain number of seconds, or units summed (``1h30m``)."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        parts = _PART.findall(value)
        if not parts or "".join(n + u for n, u in parts) != value:
            raise ValueError(f"{text!r} is not a duration: expected seconds or units such "
                             "as 30s, 5m, 2h, 1d, 1h30m") from None
        seconds = sum(float(n) * UNITS[u] for n, u in parts)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{text!r} is not a duration: it must be finite and not negative")
    return seconds


def parse_instant(text: str) -> float:
    """Epoch seconds of an ISO 8601 time; one without an offset is in local time."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 time (e.g. 2026-12-03T14:00 or "
                         "2026-12-03T14:00:00+01:00)") from None
    return moment.timestamp() if moment.tzinfo is not None else moment.astimezone().timestamp()
