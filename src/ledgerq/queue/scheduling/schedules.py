"""Schedules as data: adding, finding, pausing, resuming and retiring them.

A schedule is an entity of its own (``specs/schedule.toml``: active, paused, retired),
so each of these is one guarded move with its fact, like any other change. Its id is also
a row of ledgerq's own ``schedules`` table, which every run's ``schedule_id`` references:
that table stays the registry of schedule ids for every scheduler (an external one
records fires under its own ids through :func:`~ledgerq.queue.record_scheduled_fire`),
while ``schedule_definitions`` holds what ledgerq's scheduler needs to fire.

Everything is validated here, once, before a transaction (a bad cron expression is
quoted back, an unknown timezone named); :mod:`ledgerq.queue.scheduling.scheduler` trusts what is
stored.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ledgerq.codec import dumps, loads
from ledgerq.durations import check_instant
from ledgerq.errors import InvalidInput, NotFound
from ledgerq.lifecycle.creation import create_entity
from ledgerq.lifecycle.ids import new_id
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.lifecycle.registry import EntityPolicy
from ledgerq.queue import moves
from ledgerq.queue.moves import DEFAULT_QUEUE, Move
from ledgerq.queue.runs import perform
from ledgerq.queue.scheduling.slots import check_definition
from ledgerq.queue.submission.application import (
    RetryPolicy,
    TaskApplication,
    check_text,
    validate,
)

if TYPE_CHECKING:
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.scheduling.store import SchedulingTx

#: What ``catch_up`` may say: after every scheduler was down, fire the latest missed slot
#: once, every missed slot, or none of them.
CATCH_UP = ("latest", "all", "none")
#: What ``overlap`` may say: fire while the previous fire is unfinished, or skip the slot.
OVERLAP = ("allow", "skip")
#: Longest schedule name (it is shown in every listing and recorded on every fire).
MAX_NAME_LENGTH = 200
#: The most jitter a schedule may ask for (a day): more is a mistake, not a spread.
MAX_JITTER_SECONDS = 86400.0
OPERATOR = Actor(type="operator", id="ledgerq.schedule")
#: The states a schedule can still fire from (a name is unique among these).
LIVE = (moves.SCHEDULE_ADDED.target, moves.SCHEDULE_PAUSED.target)


def schedule_policy(db: Database[SchedulingTx]) -> EntityPolicy:
    """The schedule entity's policy, once the specs are known to allow every move made
    here; InvalidInput when the loaded specs declare no schedules at all."""
    registry = moves.check(db.registry)
    if moves.SCHEDULE_ENTITY not in registry.entities:
        raise InvalidInput("the loaded specs declare no schedule entity "
                           f"({moves.SCHEDULE_ENTITY!r}): schedules need specs/schedule.toml")
    return registry.entity(moves.SCHEDULE_ENTITY)


def application_to_json(app: TaskApplication) -> dict[str, Any]:
    """What a schedule stores of the application each fire runs."""
    out = {"action_kind": app.action_kind, "args": app.args,
           "execution_target": app.execution_target,
           "required_capabilities": list(app.required_capabilities),
           "library_ref": app.library_ref, "library_content_hash": app.library_content_hash,
           "retry": app.retry.to_dict() if app.retry else None,
           "timeout_seconds": app.timeout_seconds}
    # Each absent at its default, so schedules stored before they existed compare equal.
    if app.priority != 0:
        out["priority"] = app.priority
    if app.queue != DEFAULT_QUEUE:
        out["queue"] = app.queue
    return out


def application_from_json(data: dict[str, Any]) -> TaskApplication:
    retry = data.get("retry")
    return TaskApplication(
        data["action_kind"], dict(data["args"]), data["execution_target"],
        required_capabilities=list(data.get("required_capabilities") or []),
        library_ref=data.get("library_ref"), library_content_hash=data.get("library_content_hash"),
        retry=RetryPolicy.from_dict(retry) if retry else None,
        timeout_seconds=data.get("timeout_seconds"),
        # Absent from schedules stored before runs had them: the defaults.
        priority=data.get("priority", 0), queue=data.get("queue", DEFAULT_QUEUE))


def _finite(value: float | int | None, what: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInput(f"{what} must be a finite number (epoch seconds), not {value!r}")
    return float(value)


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput(f"a schedule needs a non-empty name, not {name!r}")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidInput(f"schedule name is {len(name)} characters; the limit is "
                           f"{MAX_NAME_LENGTH}")
    if not name.isprintable():
        raise InvalidInput(f"schedule name {name!r} holds unprintable characters")
    check_text(name, "name")
    return name


@dataclass(frozen=True)
class Definition:
    """A validated schedule, as it will be stored."""

    name: str
    cron: str | None
    every_seconds: float | None
    timezone: str
    catch_up: str
    overlap: str
    jitter: float
    application: TaskApplication
    start_at: float | None
    until: float | None

    @classmethod
    def build(cls, name: str, *, cron: str | None, every: float | int | str | None,
              application: TaskApplication, timezone: str, catch_up: str, overlap: str,
              jitter: float, start_at: float | None, until: float | None) -> Definition:
        _check_name(name)
        cron_expr, every_seconds = check_definition(cron, every, timezone)
        if catch_up not in CATCH_UP:
            raise InvalidInput(f"catch_up must be one of {', '.join(CATCH_UP)}, "
                               f"not {catch_up!r}")
        if overlap not in OVERLAP:
            raise InvalidInput(f"overlap must be one of {', '.join(OVERLAP)}, not {overlap!r}")
        spread = _finite(jitter, "jitter")
        if spread is None or not 0 <= spread <= MAX_JITTER_SECONDS:
            raise InvalidInput(f"jitter must be between 0 and {MAX_JITTER_SECONDS:g} seconds, "
                               f"not {jitter!r}")
        if not isinstance(application, TaskApplication):
            raise InvalidInput(f"application must be a TaskApplication, not "
                               f"{type(application).__name__}")
        if application.idempotency_key is not None:
            raise InvalidInput("a schedule's application takes no idempotency_key: each "
                               "slot fires once already (the slot is the key)")
        if application.depends_on:
            raise InvalidInput("a schedule's application takes no depends_on: a recurring "
                               "run cannot wait for fixed runs")
        app = validate(application)
        begin = None if start_at is None else check_instant(start_at, "start_at")
        end = None if until is None else check_instant(until, "until")
        if begin is not None and end is not None and end <= begin:
            raise InvalidInput(f"until ({end!r}) must be after start_at ({begin!r})")
        return cls(name, cron_expr, every_seconds, timezone, catch_up, overlap, spread,
                   app, begin, end)


async def add_schedule(db: Database[SchedulingTx], name: str, *, cron: str | None = None,
                       every: float | int | str | None = None,
                       application: TaskApplication, timezone: str = "UTC",
                       catch_up: str = "latest", overlap: str = "allow", jitter: float = 0.0,
                       start_at: float | None = None, until: float | None = None,
                       paused: bool = False, now: float | None = None,
                       actor: Actor = OPERATOR) -> str:
    """Add a schedule; returns its id. Exactly one of ``cron`` (five fields, in
    ``timezone``) and ``every`` (seconds, or ``"5m"``-style) says when it fires.

    Only slots after ``start_at`` (default: now) and up to ``until`` (default: no end)
    fire. ``jitter`` delays each fire by up to that many seconds, the same amount on
    every host (derived from the schedule and the slot). InvalidInput, before anything
    is written, for any invalid field or a name a live schedule already has.
    """
    d = Definition.build(name, cron=cron, every=every, application=application,
                         timezone=timezone, catch_up=catch_up, overlap=overlap, jitter=jitter,
                         start_at=start_at, until=until)
    policy = schedule_policy(db)
    ts = time.time() if now is None else check_instant(now, "now")
    created = moves.SCHEDULE_ADDED_PAUSED if paused else moves.SCHEDULE_ADDED

    def unit(tx: SchedulingTx) -> str:
        _, same = tx.read_page(policy, {"name": [d.name], "status": list(LIVE)}, ("id",), 1, 0)
        if same:
            raise InvalidInput(f"a schedule named {d.name!r} already exists "
                               f"(id {same[0]['id']}); retire it first or pick another name")
        sid = new_id()
        tx.ensure_schedule(sid, d.name, ts)
        return create_entity(tx, policy, {
            "id": sid, "status": created.target, "name": d.name, "cron": d.cron,
            "every_seconds": d.every_seconds, "timezone": d.timezone, "catch_up": d.catch_up,
            "overlap": d.overlap, "jitter": d.jitter,
            "application": dumps(application_to_json(d.application)),
            "fires_after": ts if d.start_at is None else d.start_at, "until": d.until,
        }, reason=StateReason(code=created.code), actor=actor, now=ts)

    return await db.write(unit)


def decode_schedule(policy: EntityPolicy, row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for col in policy.json_columns:
        if isinstance(out.get(col), str | bytes):
            out[col] = loads(out[col])
    return out


def _lookup(tx: SchedulingTx, policy: EntityPolicy, ref: str) -> dict[str, Any] | None:
    """By id, else by name: the live schedule of that name, else its latest retired one."""
    row = tx.read_entity(policy, ref)
    if row is not None:
        return row
    _, rows = tx.read_page(policy, {"name": [ref], "status": list(LIVE)}, tuple(policy.columns),
                           1, 0)
    if not rows:
        _, rows = tx.read_page(policy, {"name": [ref]}, tuple(policy.columns), 1, 0)
    return rows[0] if rows else None


async def get_schedule(db: Database[SchedulingTx], ref: str) -> dict[str, Any]:
    """One schedule by id or name (JSON decoded); NotFound when there is none."""
    policy = schedule_policy(db)
    row = await db.read(lambda tx: _lookup(tx, policy, ref))
    if row is None:
        raise NotFound(f"no schedule {ref!r}")
    return decode_schedule(policy, row)


async def list_schedules(db: Database[SchedulingTx], *, include_retired: bool = False,
                         limit: int = 1000) -> list[dict[str, Any]]:
    """Schedules newest first (retired ones only when asked), JSON decoded."""
    policy = schedule_policy(db)
    states = sorted(policy.states) if include_retired else list(LIVE)

    def unit(tx: SchedulingTx) -> list[dict[str, Any]]:
        return tx.read_page(policy, {"status": states}, tuple(policy.columns), limit, 0)[1]

    return [decode_schedule(policy, r) for r in await db.read(unit)]


async def _change(db: Database[SchedulingTx], ref: str, which: Move, *, actor: Actor,
                  now: float | None,
                  patch: dict[str, Any] | None = None) -> bool:
    policy = schedule_policy(db)
    ts = time.time() if now is None else now

    def unit(tx: SchedulingTx) -> bool:
        row = _lookup(tx, policy, ref)
        if row is None:
            raise NotFound(f"no schedule {ref!r}")
        status = row["status"]
        source = status if which.source == moves.ANY else which.source
        if status != source or not policy.allows(status, which.target):
            return False
        return perform(tx, policy, row["id"], which, from_state=status, actor=actor,
                       summary=f"{which.purpose} by {actor.type} {actor.id}",
                       patch=patch, now=ts).applied

    return await db.write(unit)


async def pause_schedule(db: Database[SchedulingTx], ref: str, *, actor: Actor = OPERATOR,
                         now: float | None = None) -> bool:
    """Stop firing; False when it was not active. Slots passing while paused never fire."""
    return await _change(db, ref, moves.SCHEDULE_PAUSED, actor=actor, now=now)


async def resume_schedule(db: Database[SchedulingTx], ref: str, *, actor: Actor = OPERATOR,
                          now: float | None = None) -> bool:
    """Fire again from now on; False when it was not paused."""
    ts = time.time() if now is None else now
    return await _change(db, ref, moves.SCHEDULE_RESUMED, actor=actor, now=ts,
                         patch={"fires_after": ts})


async def retire_schedule(db: Database[SchedulingTx], ref: str, *, actor: Actor = OPERATOR,
                          now: float | None = None) -> bool:
    """Never fire again (``ledgerq schedule rm``); its runs and history stay. False when
    it was retired already."""
    return await _change(db, ref, moves.SCHEDULE_RETIRED, actor=actor, now=now)
