"""A queued run that still holds a lease is never claimed: ``stats`` counts it as stuck
and says why (the move that queued it kept the lease), on both backends."""

from __future__ import annotations

import time
from pathlib import Path

from evolution_support import PAUSED, PAUSED_CODES, SpecDir
from ledgerq import StateDB
from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, load_registry, transition
from ledgerq.queue import TaskApplication, get_run, queue_stats, submit_task, worker_tick

OPS = Actor(type="operator", id="ops")


async def _ok(run: dict[str, object]) -> tuple[int, str]:
    return 0, ""


def _request(rid: str, src: str, dst: str, code: str) -> TransitionRequest:
    return TransitionRequest(entity_type="schedule_run", entity_id=rid, from_state=src,
                             to_state=dst, reason=StateReason(code=code), actor=OPS,
                             idempotency_key="")


async def test_a_queued_run_holding_a_lease_is_reported_stuck(db_target: str,
                                                             tmp_path: Path) -> None:
    # The docs' old trap: running -> paused without clearing the lease (specs check
    # refuses such an edge; loading still accepts it), then paused -> queued.
    specs = SpecDir(tmp_path / "specs").append(PAUSED.replace('clears = ["lease"]\n', ""))
    async with StateDB(db_target, registry=load_registry(specs.codes(PAUSED_CODES).path)) as db:
        await _held(db)


async def _held(db: StateDB) -> None:
    rid = await submit_task(db, TaskApplication("command", {"argv": ["true"]}))
    await transition(db, _request(rid, "queued", "running", "run.started.ok"),
                     patch={"leased_by": "w-gone", "lease_expires_at": time.time() + 300})
    await transition(db, _request(rid, "running", "paused", "run.paused.operator"))
    moved = await transition(db, _request(rid, "paused", "queued", "run.queued.resumed"))
    assert moved.applied and (await get_run(db, rid))["leased_by"] == "w-gone"
    got = await worker_tick(db, worker_id="w1", execute=_ok)
    assert got["claimed"] == 0 and (await get_run(db, rid))["status"] == "queued"
    stats = await queue_stats(db)
    assert stats.stuck == 1
    (stuck,) = stats.stuck_runs
    assert stuck.id == rid and "still holds the lease of w-gone" in stuck.why
