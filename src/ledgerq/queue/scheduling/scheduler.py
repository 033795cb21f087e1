"""The scheduler pass: turn every due slot of every active schedule into one queued run.

Any number of passes may run at once, in any number of processes on any number of hosts
(one inside every ``ledgerq worker`` by default): there is no leader to elect and so no
split brain. Exactly one run per slot is the database's doing:

- the slot is half of a unique key (``uq_schedule_runs_slot`` on ``schedule_id,
  slot_at``), so two runs of one slot cannot both exist, whoever inserts them;
- a fire reads its schedule as a move reads a row (under the row's lock where writers run
  at once), so the fires of one schedule, and its pause or retirement, take turns; each
  then finds the slots the other fired (``run_for_slot``) and counts them as done rather
  than failing on the key.

A fire is an ordinary queued run (``run.queued.scheduled``, ``schedule_id`` and
``slot_at`` set) that the normal workers claim and execute under leases, retries and
timeouts. The pass first computes what is due from a read snapshot and takes the write
lock only for a schedule that has something to fire.

Which slots are due (see docs/queue.md, "Schedules"): those after the schedule's cursor
(its latest fired slot, or its ``fires_after`` floor: creation, start_at, resume) whose
time (plus the schedule's jitter) has come, capped by ``until``. ``catch_up`` decides
about slots whose time passed while no scheduler ran: ``all`` fires each of them
(``MAX_FIRES_PER_PASS`` per pass), ``latest`` only the latest, ``none`` only a slot whose
time came less than ``MISFIRE_GRACE_SECONDS`` ago.
"""

from __future__ import annotations

import functools
import hashlib
import math
import socket
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledgerq.codec import dumps, loads
from ledgerq.lifecycle.creation import create_entity
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.maintenance.stuck import StuckRows, describe, is_database_failure
from ledgerq.queue.runs import run_policy
from ledgerq.queue.scheduling.schedules import application_from_json, schedule_policy
from ledgerq.queue.scheduling.slots import Cadence, cadence, iso
from ledgerq.queue.submission.application import digest
from ledgerq.queue.submission.submit import run_row
from ledgerq.queue.worker import wakeup

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.scheduling.store import SchedulingTx

#: Under ``catch_up = "none"``, how late a slot may still fire (a scheduler that ticks a
#: little late is not a missed slot; one that was down for a minute is).
MISFIRE_GRACE_SECONDS = 60.0
#: Slots one schedule fires per pass under ``catch_up = "all"``; the next pass goes on
#: from there, so a long outage never makes one transaction unbounded.
MAX_FIRES_PER_PASS = 100
#: Schedules one pass looks at.
MAX_SCHEDULES = 10_000
SCHEDULER = Actor(type="scheduler", id="ledgerq.scheduler")
#: Schedules a pass could not fire, when the caller keeps no tracker of its own.
PROCESS_SCHEDULES = StuckRows(what="schedule")


def jitter_offset(schedule_id: str, slot: float, jitter: float) -> float:
    """The delay of one slot's fire in [0, jitter): derived from the schedule and the slot,
    so every host agrees on it (a random draw per host would fire at different times)."""
    if jitter <= 0:
        return 0.0
    h = hashlib.sha256(f"{schedule_id}:{slot!r}".encode()).digest()
    return jitter * (int.from_bytes(h[:8], "big") / 2.0 ** 64)


def _before(cad: Cadence, t: float) -> float | None:
    return cad.latest_at_or_before(math.nextafter(t, -math.inf))


def _cadence_and_cursor(schedule: dict[str, Any], latest_slot: float | None
                        ) -> tuple[Cadence, float]:
    """A stored schedule's cadence, and its cursor: its latest fired slot or its
    ``fires_after`` floor (creation, start_at, resume), whichever is later."""
    cad = cadence(cron=schedule["cron"], every_seconds=schedule["every_seconds"],
                  timezone=schedule["timezone"])
    cursor = float(schedule["fires_after"])
    if latest_slot is not None:
        cursor = max(cursor, float(latest_slot))
    return cad, cursor


def due_slots(schedule: dict[str, Any], latest_slot: float | None, now: float) -> list[float]:
    """The slots of ``schedule`` (a stored row) to fire at ``now``, oldest first."""
    cad, cursor = _cadence_and_cursor(schedule, latest_slot)
    sid, jitter, until = schedule["id"], float(schedule["jitter"]), schedule["until"]

    def due_at(slot: float) -> float:
        return slot + jitter_offset(sid, slot, jitter)

    if schedule["catch_up"] == "all":
        out: list[float] = []
        slot = cad.next_after(cursor)
        while (slot is not None and len(out) < MAX_FIRES_PER_PASS
               and (until is None or slot <= until) and due_at(slot) <= now):
            out.append(slot)
            slot = cad.next_after(slot)
        return out
    # The latest slot whose (jittered) time has come.
    latest = cad.latest_at_or_before(now if until is None else min(now, float(until)))
    while latest is not None and latest > cursor and due_at(latest) > now:
        latest = _before(cad, latest)
    if latest is None or latest <= cursor:
        return []
    if schedule["catch_up"] == "latest" or now - due_at(latest) <= MISFIRE_GRACE_SECONDS:
        return [latest]
    return []


@dataclass
class FirePass:
    """What one pass did."""

    #: Runs created queued, one per fired slot.
    fired: list[str] = field(default_factory=list)
    #: Runs created skipped (``overlap = "skip"`` while the previous fire was unfinished).
    skipped: list[str] = field(default_factory=list)
    #: Slots another scheduler had fired already: done, not an error.
    already: int = 0
    #: Schedules this pass could not fire (id -> why): each is skipped for a while and
    #: logged once (see :class:`~ledgerq.queue.maintenance.stuck.StuckRows`), and every
    #: other schedule fires as usual.
    failed: dict[str, str] = field(default_factory=dict)


#: Slots a check looks back over for one whose jittered time is still to come.
_PENDING_LOOKBACK = 64


def next_check(schedule: dict[str, Any], latest_slot: float | None, now: float) -> float:
    """A time before which no slot of ``schedule`` comes due: ``now`` when one is due
    already, ``inf`` when none ever will (as things stand: a change of the row, which
    bumps its version, calls for a new check).

    A slot comes due at its time plus its jitter, so besides the next slot after ``now``
    the slots of the last ``jitter`` seconds whose jittered time is still ahead count.
    """
    if due_slots(schedule, latest_slot, now):
        return now
    cad, cursor = _cadence_and_cursor(schedule, latest_slot)
    jitter, until = float(schedule["jitter"]), schedule["until"]
    upcoming = cad.next_after(now)
    times = [upcoming] if upcoming is not None and (until is None or upcoming <= until) else []
    if jitter > 0:
        slot = cad.latest_at_or_before(now if until is None else min(now, float(until)))
        for _ in range(_PENDING_LOOKBACK):
            if slot is None or slot <= cursor or slot <= now - jitter:
                break
            at = slot + jitter_offset(schedule["id"], slot, jitter)
            if at > now:
                times.append(at)
            slot = _before(cad, slot)
        else:
            times.append(now + 1.0)  # more slots in the window than looked at: soon again
    return min(times, default=math.inf)


class NextChecks:
    """When each active schedule next needs a look, computed once per change of its row.

    A scheduler pass runs every poll interval in every worker; computing every
    schedule's slots on each (cron iteration in a timezone) made an idle worker's CPU
    grow with the number of schedules (3,000 daily schedules: half a core). A pass now
    reads each schedule's id and version, and computes only for a schedule that is new,
    changed, or whose check time has come. Fires by other schedulers only move a cursor
    forward, which a check time computed earlier never misses (it is at most early).
    """

    def __init__(self) -> None:
        self.at: dict[str, tuple[int, float]] = {}

    def wanted(self, sid: str, version: int, now: float) -> bool:
        known = self.at.get(sid)
        return known is None or known[0] != version or known[1] <= now

    def keep(self, seen: set[str]) -> None:
        for sid in [s for s in self.at if s not in seen]:
            del self.at[sid]


#: Check times of the schedules of each database handle, when the caller keeps none.
_CHECKS: weakref.WeakKeyDictionary[Any, NextChecks] = weakref.WeakKeyDictionary()


def _plan(tx: SchedulingTx, spol: EntityPolicy, rpol: EntityPolicy, now: float,
          skip: frozenset[str], checks: NextChecks
          ) -> tuple[list[str], dict[str, str], dict[str, tuple[int, float]]]:
    """Ids of the active schedules with a slot due (a read: no write lock), those whose
    slots cannot be computed (id -> why), each apart from the others, and new check
    times (id -> (version, time))."""
    _, heads = tx.read_page(spol, {"status": [moves.FIRING]}, ("id", "version"),
                            MAX_SCHEDULES, 0)
    due: list[str] = []
    failed: dict[str, str] = {}
    checked: dict[str, tuple[int, float]] = {}
    for head in heads:
        sid = head["id"]
        if sid in skip or not checks.wanted(sid, int(head["version"]), now):
            continue
        row = tx.read_entity(spol, sid)
        if row is None or row["status"] != moves.FIRING:
            continue
        latest = tx.read_latest_fire(rpol, sid)
        try:
            at = next_check(row, None if latest is None else latest["slot_at"], now)
        except Exception as exc:  # a stored value no cadence can use: this schedule only
            failed[sid] = describe(exc)
            continue
        if at <= now:
            due.append(sid)
        else:
            checked[sid] = (int(row["version"]), at)
    checks.keep({h["id"] for h in heads})
    return due, failed, checked


def fire_schedule(tx: SchedulingTx, spol: EntityPolicy, rpol: EntityPolicy, schedule_id: str,
                  now: float, actor: Actor, host: str) -> FirePass:
    """Fire one schedule's due slots (in-transaction); what it did."""
    result = FirePass()
    # The schedule's row read as a move reads it: fires of one schedule, and a pause or
    # retirement committing meanwhile, take turns; what is read next is then current.
    found = tx.read_for_move(spol, schedule_id, ())
    if found is None or found[0] != moves.FIRING:
        return result
    row = tx.read_entity(spol, schedule_id)
    assert row is not None
    latest = tx.read_latest_fire(rpol, schedule_id)
    slots = due_slots(row, None if latest is None else latest["slot_at"], now)
    if not slots:
        return result
    app = application_from_json(loads(row["application"]))
    fingerprint = digest(app)
    for slot in slots:
        if tx.find_run_for_slot(rpol, schedule_id, slot) is not None:
            result.already += 1
            continue
        busy = tx.find_fire_in_progress(rpol, schedule_id) if row["overlap"] == "skip" else None
        which = moves.FIRED if busy is None else moves.OVERLAP_SKIPPED
        values = run_row(app, now, host, which.target, [], fingerprint, policy=rpol)
        values.update({
            "schedule_id": schedule_id, "slot_at": slot,
            "trigger_context": dumps({"schedule": row["name"], "schedule_id": schedule_id,
                                      "slot_at": slot, "slot": iso(slot, row["timezone"])}),
        })
        summary = f"schedule {row['name']} slot {iso(slot, row['timezone'])}"
        if busy is not None:
            why = f"previous fire {busy} had not ended (overlap = skip)"
            values.update({"ended_at": now, "error_detail": why, "queued_at": None})
            summary += f": {why}"
        run_id = create_entity(tx, rpol, values, reason=StateReason(code=which.code,
                                                                    summary=summary),
                               actor=actor, now=now)
        (result.fired if busy is None else result.skipped).append(run_id)
    return result


async def fire_due(db: Database[SchedulingTx], *, now: float | None = None,
                   actor: Actor = SCHEDULER, host: str | None = None,
                   stuck: StuckRows | None = None,
                   checks: NextChecks | None = None) -> FirePass:
    """One scheduler pass over every active schedule; safe to run anywhere, at any time,
    as often as wanted (each slot still yields exactly one run).

    Each schedule is fired apart from the others, as runs are moved apart: one whose
    stored definition cannot be fired (a value written around the bounds
    :func:`~ledgerq.queue.add_schedule` checks) is reported in ``failed``, logged once
    and skipped for a while by ``stuck``, and every other schedule fires as usual. A
    failure of the database itself fails the pass. ``checks`` keeps when each schedule
    next needs a look (see :class:`NextChecks`; default: one per database handle)."""
    spol, rpol = schedule_policy(db), run_policy(db)
    tracker = PROCESS_SCHEDULES if stuck is None else stuck
    ts = time.time() if now is None else now
    hostname = host or socket.gethostname()
    result = FirePass()
    skip = tracker.skipping()
    known = _CHECKS.setdefault(db, NextChecks()) if checks is None else checks
    due, result.failed, checked = await db.read(
        lambda tx: _plan(tx, spol, rpol, ts, skip, known))
    known.at.update(checked)
    for sid in due:
        # One transaction per schedule: one schedule's trouble never blocks another's fires.
        # The unit returns what it did (a unit may run again after a lost connection).
        try:
            done = await db.write(functools.partial(fire_schedule, spol=spol, rpol=rpol,
                                                    schedule_id=sid, now=ts, actor=actor,
                                                    host=hostname))
        except Exception as exc:
            if is_database_failure(exc):
                raise
            result.failed[sid] = describe(exc)
            continue
        result.fired += done.fired
        result.skipped += done.skipped
        result.already += done.already
    for sid, why in result.failed.items():
        tracker.report(sid, "scheduler", why)
    tracker.tried(due)
    if result.fired:
        path = getattr(db, "path", None)
        if isinstance(path, str):
            wakeup.notify(path)
    return result


def next_fire(schedule: dict[str, Any], latest_slot: float | None, now: float) -> float | None:
    """When the schedule next fires (its next slot's time, jitter included), as far as can
    be told at ``now``; None when it is not active or has no slot left. A slot already due
    and not yet fired is reported as due now."""
    if schedule["status"] != moves.FIRING:
        return None
    if due_slots(schedule, latest_slot, now):
        return now
    cad, cursor = _cadence_and_cursor(schedule, latest_slot)
    slot = cad.next_after(max(cursor, now))
    until = schedule["until"]
    if slot is None or (until is not None and slot > until):
        return None
    return slot + jitter_offset(schedule["id"], slot, float(schedule["jitter"]))


async def schedule_overview(db: Database[SchedulingTx], *, include_retired: bool = False,
                            ref: str | None = None, now: float | None = None
                            ) -> list[dict[str, Any]]:
    """Schedules (or the one named ``ref``) with ``next_fire_at`` and ``last_fire`` (id,
    status, slot_at, ended_at, exit_code of the fire with the latest slot, or None)."""
    from ledgerq.queue.scheduling.schedules import get_schedule, list_schedules

    rpol = run_policy(db)
    ts = time.time() if now is None else now
    rows = ([await get_schedule(db, ref)] if ref is not None
            else await list_schedules(db, include_retired=include_retired))
    ids = [r["id"] for r in rows]
    latest = await db.read(lambda tx: {i: tx.read_latest_fire(rpol, i) for i in ids})
    out = []
    for r in rows:
        last = latest[r["id"]]
        slot = None if last is None else last["slot_at"]
        try:
            when = next_fire(r, slot, ts)
        except (ArithmeticError, ValueError, OSError):  # the pass reports it; show the rest
            when = None
        out.append({**r, "last_fire": last, "next_fire_at": when})
    return out
