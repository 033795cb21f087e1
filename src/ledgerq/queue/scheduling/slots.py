"""When a schedule's slots fall: cron expressions in a timezone, and fixed intervals.

Pure functions of the definition and an instant, so every scheduler on every host
computes the same slots, to the same float: the slot is half of the unique key that makes
a fire happen once (``uq_schedule_runs_slot``), so two hosts must never disagree on it.

Cron expressions are parsed and iterated by cronsim (docs/decisions.md says why) over
*naive local wall-clock time*, where there is no DST; each matching wall-clock minute is
then resolved to one instant in the schedule's timezone:

- a wall-clock time that exists once is that instant;
- one that exists twice (clocks go back) is its first occurrence, so it fires once;
- one that does not exist (clocks go forward) becomes the first instant after the gap,
  so it is not skipped; matches that collapse onto one instant (an hourly schedule across
  a one-hour gap) are one slot.

Resolution is monotone (a later wall-clock time never resolves earlier), which is what
lets :meth:`CronCadence.next_after` walk forward without ever doubling or losing a slot.
Interval slots are the multiples of the interval since the Unix epoch (``every=300``
fires at :00, :05, ... UTC), independent of the timezone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ledgerq.durations import MAX_DURATION, parse_duration
from ledgerq.errors import InvalidInput

#: The smallest interval accepted: below it a scheduler loop (polling every 0.2 s by
#: default) could not keep up, and every slot would be a catch-up.
MIN_EVERY_SECONDS = 0.1
#: Fields of a cron expression: minute hour day-of-month month day-of-week.
CRON_FIELDS = 5
#: cronsim's reverse search is strict: starting a second later includes the start itself.
_ONE_SECOND = timedelta(seconds=1)


class Cadence(Protocol):
    """A schedule's slots as instants (epoch seconds)."""

    def next_after(self, t: float) -> float | None:
        """The first slot strictly after ``t`` (None: there is none)."""

    def latest_at_or_before(self, t: float) -> float | None:
        """The last slot at or before ``t`` (None: there is none)."""


def parse_every(value: float | int | str) -> float:
    """Seconds of an interval: a positive number, or ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"``."""
    if isinstance(value, bool):
        raise InvalidInput(f"every must be a number of seconds or like '5m', not {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = parse_duration(value, "every")
        except InvalidInput:
            raise InvalidInput(f"every {value!r} is not an interval: give seconds or a "
                               "duration such as '90s', '5m', '2h', '1h30m'") from None
    else:
        raise InvalidInput(f"every must be a number of seconds or like '5m', not {value!r}")
    if not math.isfinite(seconds) or not MIN_EVERY_SECONDS <= seconds <= MAX_DURATION:
        raise InvalidInput(f"every must be at least {MIN_EVERY_SECONDS:g} s and at most "
                           f"{MAX_DURATION:.0f} s (100 years), not {value!r}")
    return seconds


def zone(name: str) -> ZoneInfo:
    """The IANA timezone ``name``; InvalidInput naming it when it is unknown."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise InvalidInput(f"timezone must be an IANA name such as 'Europe/Berlin', "
                           f"not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(f"unknown timezone {name!r} (an IANA name such as 'UTC' or "
                           "'America/New_York')") from None


def check_cron(expr: str) -> str:
    """``expr`` normalized (single spaces), or InvalidInput quoting it and saying why."""
    if not isinstance(expr, str):
        raise InvalidInput(f"cron must be a string, not {expr!r}")
    fields = expr.split()
    if len(fields) != CRON_FIELDS:
        raise InvalidInput(f"cron expression {expr!r} has {len(fields)} field(s); it needs "
                           "5: minute hour day-of-month month day-of-week")
    normalized = " ".join(fields)
    try:
        CronSim(normalized, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise InvalidInput(f"cron expression {expr!r} is invalid: {exc}") from None
    return normalized


@dataclass(frozen=True)
class IntervalCadence:
    """Slots at every multiple of ``every`` seconds since the Unix epoch."""

    every: float

    def _slot(self, k: int) -> float:
        return k * self.every

    def latest_at_or_before(self, t: float) -> float | None:
        k = math.floor(t / self.every)
        # The division can land one off either way; the slot itself decides.
        while self._slot(k) > t:
            k -= 1
        while self._slot(k + 1) <= t:
            k += 1
        return self._slot(k)

    def next_after(self, t: float) -> float | None:
        k = math.floor(t / self.every) + 1
        while self._slot(k - 1) > t:
            k -= 1
        while self._slot(k) <= t:
            k += 1
        return self._slot(k)


@dataclass(frozen=True)
class CronCadence:
    """Slots where ``expr`` matches the wall clock of ``tz`` (see the module docstring)."""

    expr: str
    tz: ZoneInfo

    def local(self, t: float) -> datetime:
        """The naive wall-clock time at instant ``t``, to the second."""
        return datetime.fromtimestamp(math.floor(t), self.tz).replace(tzinfo=None, fold=0)

    def resolve(self, n: datetime) -> float:
        """The instant a naive wall-clock time fires at: its first occurrence, or the end
        of the gap it falls in."""
        first = n.replace(tzinfo=self.tz, fold=0).timestamp()
        if self.local(first) == n:
            return first
        # In a gap: fold=0 reads n with the offset before the change (past the gap's
        # end), fold=1 with the one after (before its start). The end is the first whole
        # second whose wall clock is past n: found by bisection between the two.
        lo = math.floor(n.replace(tzinfo=self.tz, fold=1).timestamp())
        hi = math.ceil(first)
        if lo > hi:
            lo, hi = hi, lo
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if self.local(mid) > n:
                hi = mid
            else:
                lo = mid
        return float(hi)

    def _matches_after(self, n: datetime) -> CronSim:
        return CronSim(self.expr, n)

    def next_after(self, t: float) -> float | None:
        for n in self._matches_after(self.local(t)):
            at = self.resolve(n)
            if at > t:  # earlier matches of a repeated hour resolved to its first pass
                return at
        return None

    def latest_at_or_before(self, t: float) -> float | None:
        start = self.local(t) + _ONE_SECOND
        best: datetime | None = next(CronSim(self.expr, start, reverse=True), None)
        if best is None:
            return None
        # Wall-clock times after local(t) can still resolve at or before t (the rest of an
        # hour being repeated): walk forward while they do.
        for n in self._matches_after(best):
            if self.resolve(n) > t:
                break
            best = n
        return self.resolve(best)


def cadence(*, cron: str | None, every_seconds: float | None, timezone: str) -> Cadence:
    """The cadence of a stored definition (already validated by :func:`check_definition`)."""
    if cron is not None:
        return CronCadence(cron, zone(timezone))
    if every_seconds is None:
        raise InvalidInput("a schedule needs cron or every")
    return IntervalCadence(float(every_seconds))


def check_definition(cron: str | None, every: float | int | str | None,
                     timezone: str) -> tuple[str | None, float | None]:
    """Validate the when of a schedule once, at the boundary: (cron, every_seconds)."""
    zone(timezone)
    if (cron is None) == (every is None):
        raise InvalidInput("a schedule needs exactly one of cron (an expression such as "
                           "'*/5 * * * *') and every (seconds, or like '5m')")
    if cron is not None:
        return check_cron(cron), None
    assert every is not None
    return None, parse_every(every)


def iso(t: float, tz: str = "UTC") -> str:
    """An instant as ISO 8601 in ``tz`` (for messages and listings)."""
    return datetime.fromtimestamp(t, zone(tz) if tz != "UTC" else UTC).isoformat(
        timespec="seconds")
