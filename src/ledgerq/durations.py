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

#: The latest instant ledgerq stores: 9999-12-31T23:59:59Z. Every time a caller gives
#: (a submit's ``now``, ``not_before``, a schedule's start) must lie in [0, MAX_EPOCH]:
#: every renderer and ``datetime`` can show it, and adding a duration to it stays finite.
MAX_EPOCH = 253_402_300_799.0
#: The longest span ledgerq stores (a timeout, a retry delay, a schedule's interval):
#: 100 years. Longer spans mean "never" and overflow the clocks that add them.
MAX_DURATION = 100 * 365.25 * 86400.0

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


def check_instant(value: object, what: str) -> float:
    """``value`` as epoch seconds within [0, :data:`MAX_EPOCH`], or InvalidInput naming
    ``what``: a time far outside that range breaks every renderer and clock after it."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0 <= value <= MAX_EPOCH):
        raise InvalidInput(f"{what} must be epoch seconds between 0 and {MAX_EPOCH:.0f} "
                           f"(9999-12-31), got {value!r}")
    return float(value)


def check_span(value: object, what: str, *, positive: bool = False) -> float:
    """``value`` as seconds within [0, :data:`MAX_DURATION`] (above 0 if ``positive``),
    or InvalidInput naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and 0 <= value <= MAX_DURATION) or (positive and value <= 0):
        low = "above 0" if positive else "at least 0"
        raise InvalidInput(f"{what} must be a number of seconds {low} and at most "
                           f"{MAX_DURATION:.0f} (100 years), got {value!r}")
    return float(value)


def parse_instant(text: str, what: str = "time") -> float:
    """Epoch seconds of an ISO 8601 time; one without an offset is in local time."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidInput(f"{what}: {text!r} is not an ISO 8601 time (e.g. 2026-12-03T14:00 "
                           "or 2026-12-03T14:00:00+01:00)") from None
    return moment.timestamp() if moment.tzinfo is not None else moment.astimezone().timestamp()
