"""Slot generation with fixed clocks: intervals, cron in UTC and in a zone with DST, and a
hypothesis property against a brute-force minute-by-minute reference.

The reference walks real time (UTC) minute by minute and reads the wall clock there
(``astimezone``, which is never ambiguous): a minute is a slot when the wall clock has
reached a time it never showed before and some minute the expression matches lies in
what it skipped to get there (one minute normally, the whole gap when clocks jump
forward); a wall-clock time shown again (clocks went back) is never a slot. It shares
nothing with ledgerq.queue.scheduling.slots but the definition.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ledgerq.errors import InvalidInput
from ledgerq.queue.scheduling.slots import (
    CronCadence,
    IntervalCadence,
    check_cron,
    check_definition,
    parse_every,
    zone,
)

NY = ZoneInfo("America/New_York")
MINUTE = timedelta(minutes=1)


def at(*parts: int, tz: ZoneInfo = NY, fold: int = 0) -> float:
    return datetime(*parts, tzinfo=tz, fold=fold).timestamp()  # type: ignore[misc]


def walk(cad: CronCadence | IntervalCadence, start: float, end: float) -> list[float]:
    out, t = [], start
    while (nxt := cad.next_after(t)) is not None and nxt <= end:
        out.append(nxt)
        t = nxt
    return out


def local(t: float, tz: ZoneInfo = NY) -> str:
    return datetime.fromtimestamp(t, tz).isoformat()


# ------------------------------------------------------------------ intervals


def test_interval_slots_are_multiples_since_the_epoch() -> None:
    cad = IntervalCadence(300.0)
    assert cad.next_after(1000.0) == 1200.0
    assert cad.next_after(1200.0) == 1500.0  # strictly after
    assert cad.latest_at_or_before(1200.0) == 1200.0  # at or before
    assert cad.latest_at_or_before(1199.9) == 900.0
    assert walk(cad, 0.0, 1500.0) == [300.0, 600.0, 900.0, 1200.0, 1500.0]


def test_fractional_intervals_never_repeat_or_skip_a_slot() -> None:
    cad = IntervalCadence(0.1)
    slots = walk(cad, 1_700_000_000.0, 1_700_000_100.0)
    assert len(slots) == 1000 and len(set(slots)) == 1000
    assert all(cad.latest_at_or_before(s) == s for s in slots)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("2h", 7200.0), ("1d", 86400.0),
    (" 1.5m ", 90.0), (30, 30.0), (0.5, 0.5)])
def test_every_accepts_seconds_and_units(text: str | float, seconds: float) -> None:
    assert parse_every(text) == seconds


@pytest.mark.parametrize("bad", ["5 minutes", "-5m", "0", "m", "", 0, -1, float("nan"), True])
def test_every_refuses_what_is_not_an_interval(bad: object) -> None:
    with pytest.raises(InvalidInput, match="every"):
        parse_every(bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ cron, validation


@pytest.mark.parametrize(("expr", "why"), [
    ("61 * * * *", "Bad minute"), ("* 25 * * *", "Bad hour"),
    ("* * * *", "has 4 field"), ("* * * * * *", "has 6 field"), ("@daily", "has 1 field"),
    ("0 0 31 2 *", "Bad day-of-month")])
def test_a_bad_expression_names_itself(expr: str, why: str) -> None:
    with pytest.raises(InvalidInput) as err:
        check_cron(expr)
    assert repr(expr) in str(err.value) and why in str(err.value)


def test_unknown_timezones_and_missing_or_double_cadences_are_refused() -> None:
    with pytest.raises(InvalidInput, match="unknown timezone 'Mars/Olympus'"):
        zone("Mars/Olympus")
    with pytest.raises(InvalidInput, match="exactly one of cron"):
        check_definition(None, None, "UTC")
    with pytest.raises(InvalidInput, match="exactly one of cron"):
        check_definition("* * * * *", "5m", "UTC")
    assert check_definition("0  2 * *   1-5", None, "Europe/Berlin") == ("0 2 * * 1-5", None)


# ------------------------------------------------------------------ cron, fixed clocks


def test_weekdays_at_two_in_a_zone() -> None:
    cad = CronCadence("0 2 * * 1-5", NY)
    slots = walk(cad, at(2024, 6, 7, 12), at(2024, 6, 14, 12))  # Fri noon .. next Fri noon
    assert [local(s) for s in slots] == [
        "2024-06-10T02:00:00-04:00", "2024-06-11T02:00:00-04:00", "2024-06-12T02:00:00-04:00",
        "2024-06-13T02:00:00-04:00", "2024-06-14T02:00:00-04:00"]


def test_dst_forward_a_slot_in_the_gap_fires_once_after_it() -> None:
    # 2024-03-10: New York's clocks go 01:59:59 EST -> 03:00:00 EDT; 02:30 never happens.
    cad = CronCadence("30 2 * * *", NY)
    slots = walk(cad, at(2024, 3, 8, 12), at(2024, 3, 12, 12))
    assert [local(s) for s in slots] == [
        "2024-03-09T02:30:00-05:00", "2024-03-10T03:00:00-04:00",  # not skipped
        "2024-03-11T02:30:00-04:00", "2024-03-12T02:30:00-04:00"]


def test_dst_back_a_repeated_time_fires_once() -> None:
    # 2024-11-03: 01:59:59 EDT -> 01:00:00 EST; 01:30 happens twice and fires once.
    cad = CronCadence("30 1 * * *", NY)
    slots = walk(cad, at(2024, 11, 1, 12), at(2024, 11, 5, 12))
    assert [local(s) for s in slots] == [
        "2024-11-02T01:30:00-04:00", "2024-11-03T01:30:00-04:00",  # the first 01:30 only
        "2024-11-04T01:30:00-05:00", "2024-11-05T01:30:00-05:00"]
    # From inside the repeated hour (the second 01:10), the next slot is tomorrow's.
    assert local(cad.next_after(at(2024, 11, 3, 1, 10, fold=1))) == "2024-11-04T01:30:00-05:00"
    assert local(cad.latest_at_or_before(at(2024, 11, 3, 1, 45, fold=1))) == \
        "2024-11-03T01:30:00-04:00"


def test_hourly_across_both_transitions_one_slot_per_wall_clock_hour() -> None:
    cad = CronCadence("0 * * * *", NY)
    spring = walk(cad, at(2024, 3, 10, 0, 30), at(2024, 3, 10, 4, 30))
    assert [local(s) for s in spring] == [
        "2024-03-10T01:00:00-05:00", "2024-03-10T03:00:00-04:00", "2024-03-10T04:00:00-04:00"]
    autumn = walk(cad, at(2024, 11, 3, 0, 30), at(2024, 11, 3, 3, 30))
    assert [local(s) for s in autumn] == [
        "2024-11-03T01:00:00-04:00", "2024-11-03T02:00:00-05:00", "2024-11-03T03:00:00-05:00"]


def test_utc_cron_ignores_every_zone() -> None:
    cad = CronCadence("*/15 * * * *", ZoneInfo("UTC"))
    t0 = datetime(2024, 3, 10, 6, 50, tzinfo=UTC).timestamp()
    assert len(walk(cad, t0, t0 + 3600)) == 4


# ------------------------------------------------------------------ the property


def reference(expr_fields: tuple[set[int], set[int], set[int], set[int], set[int]],
              restricted: tuple[bool, bool], tz: ZoneInfo, start: float, end: float
              ) -> list[float]:
    """Slots in (start, end] by brute force, minute by minute in real time."""
    minutes, hours, doms, months, dows = expr_fields
    dom_restricted, dow_restricted = restricted

    def matches(n: datetime) -> bool:
        if n.minute not in minutes or n.hour not in hours or n.month not in months:
            return False
        dom_ok, dow_ok = n.day in doms, (n.isoweekday() % 7) in dows
        if dom_restricted and dow_restricted:
            return dom_ok or dow_ok  # cron: a day field starting with * defers to the other
        return dom_ok and dow_ok

    out: list[float] = []
    u = datetime.fromtimestamp(start, UTC).replace(second=0, microsecond=0)
    seen = u.astimezone(tz).replace(tzinfo=None)  # the wall clock's high-water mark
    u += MINUTE
    while u.timestamp() <= end:
        wall = u.astimezone(tz).replace(tzinfo=None)
        if wall > seen:
            n = seen + MINUTE
            while n <= wall:  # one minute, or the whole gap clocks jumped over
                if matches(n):
                    if u.timestamp() > start:
                        out.append(u.timestamp())
                    break
                n += MINUTE
            seen = wall
        u += MINUTE
    return out


def field(lo: int, hi: int) -> st.SearchStrategy[tuple[str, set[int]]]:
    """One cron field as text and the values it means."""
    star = st.just(("*", set(range(lo, hi + 1))))
    step = st.integers(2, max(2, (hi - lo) // 2)).map(
        lambda k: (f"*/{k}", set(range(lo, hi + 1, k))))
    values = st.sets(st.integers(lo, hi), min_size=1, max_size=3).map(
        lambda vs: (",".join(map(str, sorted(vs))), vs))
    ranged = st.tuples(st.integers(lo, hi), st.integers(lo, hi)).map(
        lambda p: (f"{min(p)}-{max(p)}", set(range(min(p), max(p) + 1))))
    return st.one_of(star, step, values, ranged)


#: The most days each month has (February: in a leap year).
MONTH_DAYS = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30, 7: 31, 8: 31, 9: 30, 10: 31, 11: 30,
              12: 31}
ZONES = ["UTC", "America/New_York", "Europe/Berlin", "Australia/Lord_Howe",
         "Pacific/Chatham", "America/Sao_Paulo"]
#: Windows around DST changes (and ordinary days), as UTC starts.
STARTS = [datetime(2024, 3, 9, 18, tzinfo=UTC), datetime(2024, 3, 30, 18, tzinfo=UTC),
          datetime(2024, 11, 2, 18, tzinfo=UTC), datetime(2024, 10, 26, 18, tzinfo=UTC),
          datetime(2024, 4, 6, 10, tzinfo=UTC), datetime(2024, 9, 28, 10, tzinfo=UTC),
          datetime(2018, 11, 3, 12, tzinfo=UTC), datetime(2024, 6, 15, 0, tzinfo=UTC)]


@given(minute=field(0, 59), hour=field(0, 23), dom=field(1, 31), month=field(1, 12),
       dow=field(0, 6), tz_name=st.sampled_from(ZONES), start=st.sampled_from(STARTS),
       offset=st.integers(0, 3600))
def test_slots_match_a_brute_force_reference(
        minute: tuple[str, set[int]], hour: tuple[str, set[int]], dom: tuple[str, set[int]],
        month: tuple[str, set[int]], dow: tuple[str, set[int]], tz_name: str,
        start: datetime, offset: int) -> None:
    # Days of the month that no month of the expression has (30 February) name no instant
    # where the days must match as well as the weekdays: cron refuses such an expression
    # (test_a_bad_expression_names_itself), so it is outside this property.
    days_and_weekdays = dom[0].startswith("*") or dow[0].startswith("*")
    assume(not days_and_weekdays
           or any(d <= MONTH_DAYS[m] for d in dom[1] for m in month[1]))
    tz = ZoneInfo(tz_name)
    expr = " ".join(f[0] for f in (minute, hour, dom, month, dow))
    t0 = start.timestamp() + offset
    t1 = t0 + 36 * 3600
    cad = CronCadence(check_cron(expr), tz)
    want = reference((minute[1], hour[1], dom[1], month[1], dow[1]),
                     (not dom[0].startswith("*"), not dow[0].startswith("*")), tz, t0, t1)
    assert walk(cad, t0, t1) == want, expr
    # The latest slot at or before any instant is the last of the reference's up to it.
    for probe in (t0 + 1800, t0 + 7 * 3600 + 17, t1):
        upto = [s for s in want if s <= probe]
        if upto:
            assert cad.latest_at_or_before(probe) == upto[-1], (expr, probe)


# ------------------------------------------------------------------ check times


@given(every=st.sampled_from([60.0, 300.0, 3600.0, 0.5]),
       cron=st.sampled_from([None, "*/5 * * * *", "30 2 * * *", "0 9 * * 1-5"]),
       jitter=st.sampled_from([0.0, 30.0, 500.0, 7200.0]),
       catch_up=st.sampled_from(["latest", "all", "none"]),
       cursor_back=st.floats(0, 20_000), fired_back=st.none() | st.floats(0, 20_000),
       now=st.floats(1_700_000_000, 1_700_100_000),
       until_ahead=st.none() | st.floats(-5_000, 50_000),
       probes=st.lists(st.floats(0, 1), min_size=5, max_size=20))
def test_no_slot_comes_due_before_its_check_time(
        every: float, cron: str | None, jitter: float, catch_up: str, cursor_back: float,
        fired_back: float | None, now: float, until_ahead: float | None,
        probes: list[float]) -> None:
    """The scheduler skips a schedule until its check time: so at no instant between
    now and then may a slot be due (brute force over probe instants, and just before)."""
    from ledgerq.queue.scheduling.scheduler import due_slots, next_check

    row = {"id": "sched-1", "cron": cron, "every_seconds": None if cron else every,
           "timezone": "America/New_York", "jitter": jitter, "catch_up": catch_up,
           "fires_after": now - cursor_back,
           "until": None if until_ahead is None else now + until_ahead}
    latest = None if fired_back is None else now - fired_back
    check = next_check(row, latest, now)
    assert check >= now
    if check == now:
        assert due_slots(row, latest, now)
        return
    end = min(check, now + 3 * 86400)
    for p in [*probes, 1.0]:
        t = now + p * (end - now)
        t = min(t, float(math.nextafter(check, -math.inf))) if t >= check else t
        assert not due_slots(row, latest, t), (t, check)
