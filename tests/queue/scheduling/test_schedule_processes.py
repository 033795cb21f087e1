"""Schedulers on separate "hosts" (OS processes): each slot fires exactly once.

Four worker processes, each running its scheduler pass, fire a fast interval schedule
over a fixed window of slots; the database's slot key is the only coordination. Then one
is SIGKILLed inside a fire's transaction (before its commit): its slots are fired by the
others, none lost, none doubled. Both backends.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, add_schedule
from ledgerq.queue.scheduling.slots import IntervalCadence

HELPER = Path(__file__).resolve().parents[2] / "helpers" / "scheduler_proc.py"
APP = TaskApplication("command", {"argv": ["true"]}, "host")
EVERY = 0.1
#: Bounds every wait (a hang guard, not a timing assertion).
TIMEOUT = 180.0

pytestmark = pytest.mark.slow


def window(count: int, lead: float) -> tuple[float, list[float]]:
    """(start_at, the ``count`` slots after it), starting ``lead`` seconds from now."""
    cad = IntervalCadence(EVERY)
    start = cad.latest_at_or_before(time.time() + lead)
    assert start is not None
    slots, t = [], start
    for _ in range(count):
        nxt = cad.next_after(t)
        assert nxt is not None
        slots.append(nxt)
        t = nxt
    return start, slots


class Host:
    def __init__(self, target: str, worker_id: str, markers: Path, *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HELPER), "--db", target, "--worker-id", worker_id,
             "--markers", str(markers), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


async def wait_completed(db: StateDB, sid: str, count: int) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        row = await db.fetch_one(
            "SELECT COUNT(*) AS n FROM schedule_runs WHERE schedule_id = ? AND status = ?",
            (sid, "completed"))
        if row is not None and row["n"] >= count:
            return
        assert time.monotonic() < deadline, f"{row} of {count} completed"
        await asyncio.sleep(0.2)


async def check_exactly_once(db: StateDB, sid: str, slots: list[float]) -> list[str]:
    rows = await db.fetch_all(
        "SELECT id, slot_at, status FROM schedule_runs WHERE schedule_id = ? "
        "ORDER BY slot_at", (sid,))
    assert [float(r["slot_at"]) for r in rows] == slots  # every slot, once, nothing else
    assert {r["status"] for r in rows} == {"completed"}
    assert (await verify(db)).ok
    return [str(r["id"]) for r in rows]


async def test_four_scheduler_hosts_fire_each_of_100_slots_once(db_target: str,
                                                               tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    async with StateDB(db_target) as db:
        start, slots = window(100, lead=3.0)
        sid = await add_schedule(db, "fast", every=EVERY, application=APP, catch_up="all",
                                 start_at=start, until=slots[-1])
        hosts = [Host(db_target, f"host{i}:sched", markers) for i in range(4)]
        try:
            await wait_completed(db, sid, len(slots))
            # Past the window: nothing more is fired.
            await asyncio.sleep(5 * EVERY)
        finally:
            for h in hosts:
                h.stop()
        ids = await check_exactly_once(db, sid, slots)
        executed = Counter(line.split()[0] for line in markers.read_text().splitlines())
        assert executed == Counter(ids), "each run executed exactly once"
        firers = await db.fetch_all(
            "SELECT DISTINCT actor FROM status_transitions WHERE entity_type = ? "
            "AND reason_code = ?", ("schedule_run", "run.queued.scheduled"))
        assert {f["actor"] for f in firers} <= {f"host{i}:sched" for i in range(4)}


async def test_a_scheduler_killed_mid_fire_loses_no_slot_and_doubles_none(
        db_target: str, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    flag = tmp_path / "in-fire"
    async with StateDB(db_target) as db:
        start, slots = window(60, lead=2.0)
        sid = await add_schedule(db, "fast", every=EVERY, application=APP, catch_up="all",
                                 start_at=start, until=slots[-1])
        victim = Host(db_target, "victim:sched", markers, "--hang-in-fire", str(flag))
        hosts: list[Host] = []
        try:
            deadline = time.monotonic() + TIMEOUT
            while not flag.exists():  # the victim is inside its first fire, uncommitted
                assert victim.proc.poll() is None, victim.proc.stderr.read()  # type: ignore[union-attr]
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            hosts = [Host(db_target, f"host{i}:sched", markers) for i in range(3)]
            await asyncio.sleep(1.0)
            os.kill(victim.proc.pid, signal.SIGKILL)
            victim.proc.wait(10)
            await wait_completed(db, sid, len(slots))
            await asyncio.sleep(5 * EVERY)
        finally:
            victim.stop()
            for h in hosts:
                h.stop()
        await check_exactly_once(db, sid, slots)
        # The victim's fire never committed: no fact of it exists.
        victim_facts = await db.fetch_all(
            "SELECT id FROM status_transitions WHERE actor = ? AND reason_code = ?",
            ("victim:sched", "run.queued.scheduled"))
        assert victim_facts == []
