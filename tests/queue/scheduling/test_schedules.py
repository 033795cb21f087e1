"""Schedules on both backends with fixed clocks: fires, catch-up, DST, pause/resume,
overlap, the slot key, concurrent fires, and opening a previous release's database.

Every fire here is ``fire_due(db, now=...)`` at a chosen instant: nothing waits for time.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from evolution_support import fill_v1
from ledgerq import StateDB
from ledgerq.errors import IntegrityViolation, InvalidInput, NotFound
from ledgerq.lifecycle import transition
from ledgerq.lifecycle.engine import create_entity
from ledgerq.lifecycle.models import Actor, StateReason, TransitionRequest
from ledgerq.projections import history, verify
from ledgerq.queue import (
    TaskApplication,
    add_schedule,
    claim_and_execute,
    fire_due,
    get_schedule,
    list_schedules,
    pause_schedule,
    record_scheduled_fire,
    resume_schedule,
    retire_schedule,
)
from ledgerq.queue.scheduling.scheduler import (
    MISFIRE_GRACE_SECONDS,
    jitter_offset,
    schedule_overview,
)

APP = TaskApplication("command", {"argv": ["true"]}, "host")
NY = ZoneInfo("America/New_York")
T0 = 1_699_999_800.0  # a multiple of 300 s (and so of 60 s)
OPERATOR = Actor(type="operator", id="test")


async def fires(db: StateDB, sid: str) -> list[dict[str, object]]:
    return await db.fetch_all(
        "SELECT id, slot_at, status, status_reason_code, fired_at FROM schedule_runs "
        "WHERE schedule_id = ? ORDER BY slot_at", (sid,))


async def slots(db: StateDB, sid: str) -> list[float]:
    return [float(r["slot_at"]) for r in await fires(db, sid)]  # type: ignore[arg-type]


# ------------------------------------------------------------------ basics


async def test_an_interval_schedule_fires_one_queued_run_per_slot(db: StateDB) -> None:
    sid = await add_schedule(db, "five", every="5m", application=APP, now=T0)
    assert (await fire_due(db, now=T0 + 299)).fired == []
    done = await fire_due(db, now=T0 + 300)
    assert len(done.fired) == 1
    again = await fire_due(db, now=T0 + 301)  # the same slot: already fired
    assert again.fired == [] and again.already == 0
    await fire_due(db, now=T0 + 600.5)
    assert await slots(db, sid) == [T0 + 300, T0 + 600]
    [first, _] = await fires(db, sid)
    assert first["status"] == "queued" and first["status_reason_code"] == "run.queued.scheduled"
    facts = await history(db, "schedule_run", str(first["id"]))
    assert [f["reason_code"] for f in facts] == ["run.queued.scheduled"]
    assert facts[0]["source"] == "scheduler"
    sched = await history(db, "schedule", sid)
    assert [f["reason_code"] for f in sched] == ["schedule.active.created"]
    assert (await verify(db)).ok


async def test_a_fire_is_claimed_and_executed_by_the_normal_workers(db: StateDB) -> None:
    sid = await add_schedule(db, "every-minute", cron="* * * * *", application=APP, now=T0)
    await fire_due(db, now=T0 + 60)
    ran: list[str] = []

    async def execute(row: dict[str, object]) -> tuple[int, str]:
        ran.append(str(row["id"]))
        return 0, ""

    await claim_and_execute(db, worker_id="w1", execute=execute, now=T0 + 61)
    [run] = await fires(db, sid)
    assert ran == [run["id"]] and run["status"] == "completed"
    # An external scheduler's fire (no slot) keeps the ADR-0071 queue's rule: never claimed.
    ext = await record_scheduled_fire(db, schedule_id="cron-host", action_kind="agent",
                                      args={}, status="running", now=T0)
    res = await transition(db, TransitionRequest(
        entity_type="schedule_run", entity_id=ext, from_state="running", to_state="queued",
        reason=StateReason(code="run.queued.lease_expired"), actor=OPERATOR,
        idempotency_key="x"), patch={"queued_at": T0})
    assert res.applied
    await claim_and_execute(db, worker_id="w1", execute=execute, now=T0 + 62)
    assert ran == [run["id"]]


async def test_validation_happens_before_anything_is_written(db: StateDB) -> None:
    bad = [
        ({"cron": "61 * * * *"}, "'61 * * * *' is invalid: Bad minute"),
        ({"cron": "* * * *"}, "has 4 field"),
        ({"every": "5 minutes"}, "not an interval"),
        ({"cron": "0 2 * * *", "timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        ({}, "exactly one of cron"),
        ({"every": 60, "catch_up": "some"}, "catch_up must be one of latest, all, none"),
        ({"every": 60, "overlap": "queue"}, "overlap must be one of allow, skip"),
        ({"every": 60, "jitter": -1}, "jitter"),
        ({"every": 1e18}, "at most"),
        ({"every": 1e300}, "at most"),
        ({"every": "99999999999999999999999999d"}, "at most"),
        ({"every": 60, "start_at": -1e15}, "start_at must be epoch seconds"),
        ({"every": 60, "until": 1e300}, "until must be epoch seconds"),
    ]
    for kwargs, message in bad:
        with pytest.raises(InvalidInput, match=message.replace("*", r"\*")):
            await add_schedule(db, "x", application=APP, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="execution_target"):
        await add_schedule(db, "x", every=60, application=TaskApplication("command", {
            "argv": ["true"]}, "moon"))
    with pytest.raises(InvalidInput, match="idempotency_key"):
        await add_schedule(db, "x", every=60, application=TaskApplication(
            "command", {"argv": ["true"]}, "host", idempotency_key="k"))
    assert await list_schedules(db, include_retired=True) == []
    await add_schedule(db, "x", every=60, application=APP)
    with pytest.raises(InvalidInput, match="already exists"):
        await add_schedule(db, "x", every=60, application=APP)


async def test_a_schedule_that_cannot_fire_never_stops_the_others(
        db: StateDB, caplog: pytest.LogCaptureFixture) -> None:
    """A stored definition no cadence can use (written around the bounds add_schedule
    checks: a hand edit, an older release) fails alone, is logged once and skipped for a
    while; every other schedule fires, and every listing still shows them all."""
    from ledgerq.cli.render import fmt_ts
    from ledgerq.queue.maintenance.stuck import StuckRows

    bad = await add_schedule(db, "bad", cron="* * * * *", catch_up="all", application=APP,
                             now=T0)
    huge = await add_schedule(db, "huge", every=60, application=APP, now=T0)
    good = await add_schedule(db, "good", every=60, application=APP, now=T0)
    await db.write(lambda c: c.execute(
        "UPDATE schedule_definitions SET fires_after = ? WHERE id = ?", (-1e15, bad)))
    await db.write(lambda c: c.execute(
        "UPDATE schedule_definitions SET every_seconds = ? WHERE id = ?", (1e300, huge)))
    stuck = StuckRows(what="schedule")
    caplog.set_level("WARNING", "ledgerq.worker")
    done = await fire_due(db, now=T0 + 61, stuck=stuck)
    assert set(done.failed) == {bad}
    assert "year" in done.failed[bad] or "range" in done.failed[bad]
    assert await slots(db, good) == [T0 + 60]
    assert await slots(db, bad) == []
    # Skipped by the next passes (logged once), while the good one goes on.
    again = await fire_due(db, now=T0 + 121, stuck=stuck)
    assert again.failed == {} and await slots(db, good) == [T0 + 60, T0 + 120]
    logged = [r for r in caplog.records if bad in r.getMessage()]
    assert len(logged) == 1 and "schedule" in logged[0].getMessage()
    # Every renderer survives the stored values.
    shown = {r["id"]: r for r in await schedule_overview(db, now=T0 + 130)}
    assert shown[bad]["next_fire_at"] is None and shown[good]["next_fire_at"] == T0 + 180
    assert fmt_ts(shown[huge]["next_fire_at"]).endswith("(not a time)")
    assert fmt_ts(-1e15) == "-1000000000000000.0 (not a time)"


# ------------------------------------------------------------------ catch-up


@pytest.mark.parametrize(("mode", "expected"), [
    ("all", [T0 + 300 * k for k in range(1, 13)]),
    ("latest", [T0 + 3600]),
    ("none", []),
])
async def test_catch_up_after_every_scheduler_was_down(db: StateDB, mode: str,
                                                       expected: list[float]) -> None:
    sid = await add_schedule(db, "s", every=300, application=APP, catch_up=mode, now=T0)
    # Down for an hour; back 90 s after the latest slot (past the misfire grace).
    await fire_due(db, now=T0 + 3600 + MISFIRE_GRACE_SECONDS + 30)
    assert await slots(db, sid) == expected
    # Then on time again, whatever the mode.
    await fire_due(db, now=T0 + 3900 + 1)
    assert (await slots(db, sid))[-1] == T0 + 3900


async def test_catch_up_none_still_fires_a_slot_that_is_a_little_late(db: StateDB) -> None:
    sid = await add_schedule(db, "s", every=300, application=APP, catch_up="none", now=T0)
    await fire_due(db, now=T0 + 300 + MISFIRE_GRACE_SECONDS - 1)
    assert await slots(db, sid) == [T0 + 300]


async def test_catch_up_all_is_bounded_per_pass_and_goes_on(db: StateDB) -> None:
    sid = await add_schedule(db, "s", every=1, application=APP, catch_up="all", now=T0)
    first = await fire_due(db, now=T0 + 250)
    assert len(first.fired) == 100
    await fire_due(db, now=T0 + 250)
    await fire_due(db, now=T0 + 250)
    assert await slots(db, sid) == [T0 + k for k in range(1, 251)]


async def test_start_at_and_until_bound_the_slots(db: StateDB) -> None:
    sid = await add_schedule(db, "s", every=60, application=APP, catch_up="all",
                             start_at=T0 + 600, until=T0 + 900, now=T0)
    await fire_due(db, now=T0 + 5000)
    assert await slots(db, sid) == [T0 + 660, T0 + 720, T0 + 780, T0 + 840, T0 + 900]


async def test_jitter_delays_each_fire_the_same_everywhere(db: StateDB) -> None:
    sid = await add_schedule(db, "s", every=300, application=APP, jitter=30, now=T0)
    delay = jitter_offset(sid, T0 + 300, 30)
    assert 0 <= delay < 30 and delay == jitter_offset(sid, T0 + 300, 30)
    await fire_due(db, now=T0 + 300 + delay - 0.01)
    assert await slots(db, sid) == []
    await fire_due(db, now=T0 + 300 + delay)
    assert await slots(db, sid) == [T0 + 300]


# ------------------------------------------------------------------ DST


def ny(*parts: int, fold: int = 0) -> float:
    return datetime(*parts, tzinfo=NY, fold=fold).timestamp()  # type: ignore[misc]


async def test_dst_forward_and_back_fire_each_daily_slot_once(db: StateDB) -> None:
    gap = await add_schedule(db, "gap", cron="30 2 * * *", timezone="America/New_York",
                             application=APP, catch_up="all", now=ny(2024, 3, 9, 12),
                             until=ny(2024, 3, 12))
    rep = await add_schedule(db, "rep", cron="30 1 * * *", timezone="America/New_York",
                             application=APP, catch_up="all", now=ny(2024, 11, 2, 12),
                             until=ny(2024, 11, 5))
    # A scheduler ticking every 10 minutes of real time across each transition (until
    # keeps each schedule to its own few days).
    for start in (ny(2024, 3, 9, 23), ny(2024, 11, 2, 23)):
        t = start
        while t < start + 6 * 3600:
            await fire_due(db, now=t)
            t += 600
        await fire_due(db, now=start + 28 * 3600)
    assert [datetime.fromtimestamp(s, NY).isoformat() for s in await slots(db, gap)] == [
        "2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"]
    assert [datetime.fromtimestamp(s, NY).isoformat() for s in await slots(db, rep)] == [
        "2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"]


# ------------------------------------------------------------------ pause, resume, retire


async def test_pause_resume_and_retire(db: StateDB) -> None:
    sid = await add_schedule(db, "s", every=60, application=APP, catch_up="all", now=T0)
    await fire_due(db, now=T0 + 60)
    assert await pause_schedule(db, "s", now=T0 + 90)
    assert not await pause_schedule(db, "s", now=T0 + 91)  # already paused
    await fire_due(db, now=T0 + 400)
    assert await slots(db, sid) == [T0 + 60]
    assert await resume_schedule(db, sid, now=T0 + 400)
    await fire_due(db, now=T0 + 400)  # the slots of the pause never fire, even under "all"
    assert await slots(db, sid) == [T0 + 60]
    await fire_due(db, now=T0 + 420)
    assert await slots(db, sid) == [T0 + 60, T0 + 420]
    assert await retire_schedule(db, "s", now=T0 + 430)
    assert not await retire_schedule(db, sid, now=T0 + 431)
    await fire_due(db, now=T0 + 10_000)
    assert await slots(db, sid) == [T0 + 60, T0 + 420]
    codes = [f["reason_code"] for f in await history(db, "schedule", sid)]
    assert codes == ["schedule.active.created", "schedule.paused.operator",
                     "schedule.active.resumed", "schedule.retired.operator"]
    assert (await get_schedule(db, sid))["status"] == "retired"
    assert await list_schedules(db) == []
    # The name is free again; the retired one (and its runs) stay.
    again = await add_schedule(db, "s", every=60, application=APP, now=T0 + 500)
    assert (await get_schedule(db, "s"))["id"] == again
    assert len(await list_schedules(db, include_retired=True)) == 2
    with pytest.raises(NotFound):
        await pause_schedule(db, "nope")


async def test_a_schedule_added_paused_fires_nothing(db: StateDB) -> None:
    sid = await add_schedule(db, "s", every=60, application=APP, paused=True, now=T0)
    await fire_due(db, now=T0 + 600)
    assert await slots(db, sid) == []
    [row] = await schedule_overview(db, now=T0 + 600)
    assert row["next_fire_at"] is None and row["last_fire"] is None


# ------------------------------------------------------------------ overlap


async def test_overlap_skip_records_a_skipped_fact(db: StateDB) -> None:
    sid = await add_schedule(db, "s", every=60, application=APP, overlap="skip", now=T0)
    await fire_due(db, now=T0 + 60)
    skipped = await fire_due(db, now=T0 + 120)  # the first is still queued
    assert skipped.fired == [] and len(skipped.skipped) == 1
    rows = await fires(db, sid)
    assert [(r["status"], r["status_reason_code"]) for r in rows] == [
        ("queued", "run.queued.scheduled"), ("skipped", "run.skipped.overlap")]
    [fact] = await history(db, "schedule_run", skipped.skipped[0])
    assert rows[0]["id"] in fact["reason_summary"]
    # Once the previous fire has ended, the next slot fires again.
    await claim_and_execute(db, worker_id="w", execute=_ok, now=T0 + 121)
    await fire_due(db, now=T0 + 180)
    assert [r["status"] for r in await fires(db, sid)][-1] == "queued"
    # overlap="allow" (the default) fires regardless.
    other = await add_schedule(db, "t", every=60, application=APP, now=T0)
    await fire_due(db, now=T0 + 300)
    assert {r["status"] for r in await fires(db, other)} == {"queued"}


async def _ok(row: dict[str, object]) -> tuple[int, str]:
    return 0, ""


# ------------------------------------------------------------------ exactly once


async def test_the_database_refuses_a_second_run_for_a_slot(db: StateDB) -> None:
    sid = await add_schedule(db, "s", every=60, application=APP, now=T0)
    await fire_due(db, now=T0 + 60)
    policy = db.registry.entity("schedule_run")
    with pytest.raises(IntegrityViolation):
        await db.write(lambda tx: create_entity(tx, policy, {
            "status": "queued", "schedule_id": sid, "slot_at": T0 + 60,
            "trigger_context": "{}", "action_kind": "command", "action_args": "{}",
            "fired_at": T0, "queued_at": T0}, reason=StateReason(code="run.queued.scheduled"),
            actor=OPERATOR))


async def test_concurrent_fires_of_one_slot_make_one_run(db_target: str) -> None:
    async with StateDB(db_target) as first:
        sid = await add_schedule(first, "s", every=60, application=APP, catch_up="all",
                                 now=T0)
    handles = [StateDB(db_target) for _ in range(4)]
    for h in handles:
        await h.open()
    try:
        for k in range(1, 6):  # five rounds, each four handles firing one slot at once
            done = await asyncio.gather(*(fire_due(h, now=T0 + 60 * k) for h in handles))
            assert sum(len(d.fired) for d in done) == 1, done
        assert await slots(handles[0], sid) == [T0 + 60 * k for k in range(1, 6)]
        assert (await verify(handles[0])).ok
    finally:
        for h in handles:
            await h.close()


# ------------------------------------------------------------------ visibility


async def test_overview_shows_next_fire_and_last_outcome(db: StateDB) -> None:
    sid = await add_schedule(db, "s", every=300, application=APP, now=T0)
    [row] = await schedule_overview(db, now=T0 + 10)
    assert row["next_fire_at"] == T0 + 300 and row["last_fire"] is None
    await fire_due(db, now=T0 + 300)
    await claim_and_execute(db, worker_id="w", execute=_ok, now=T0 + 301)
    [row] = await schedule_overview(db, ref="s", now=T0 + 302)
    assert row["id"] == sid and row["next_fire_at"] == T0 + 600
    assert row["last_fire"]["slot_at"] == T0 + 300
    assert row["last_fire"]["status"] == "completed"


# ------------------------------------------------------------------ upgrades


async def test_a_previous_release_database_opens_and_schedules(db_target: str) -> None:
    made = await fill_v1(db_target)
    async with StateDB(db_target) as db:  # the new packaged specs: migrates on open
        assert db.migration is not None
        got = await db.fetch_all("SELECT id, status FROM schedule_runs ORDER BY id")
        assert sorted(r["id"] for r in got) == sorted(made["all"])
        sid = await add_schedule(db, "s", every=60, application=APP, now=T0)
        await fire_due(db, now=T0 + 60)
        assert await slots(db, sid) == [T0 + 60]
        assert (await verify(db)).ok
    async with StateDB(db_target) as db:
        assert db.migration is None  # already at these specs


async def test_a_read_only_open_of_an_unmigrated_database_lists_runs(db_target: str,
                                                                     tmp_path: Path) -> None:
    made = await fill_v1(db_target)
    from ledgerq.queue import list_runs

    async with StateDB(db_target, readonly=True) as db:
        page = await list_runs(db)
        assert page.total == len(made["all"])
