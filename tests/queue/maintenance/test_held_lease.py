"""A queued run that still holds a lease is never claimed: ``stats`` counts it as stuck
and says why (the move that queued it kept the lease), on both backends."""

from __future__ import annotations

import time

from ledgerq import StateDB
from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, transition
from ledgerq.queue import TaskApplication, get_run, queue_stats, submit_task, worker_tick

OPS = Actor(type="operator", id="ops")


async def _ok(run: dict[str, object]) -> tuple[int, str]:
    return 0, ""


def _request(rid: str, src: str, dst: str, code: str) -> TransitionRequest:
    return TransitionRequest(entity_type="schedule_run", entity_id=rid, from_state=src,
                             to_state=dst, reason=StateReason(code=code), actor=OPS,
                             idempotency_key="")


async def test_a_queued_run_holding_a_lease_is_reported_stuck(db: StateDB) -> None:
    rid = await submit_task(db, TaskApplication("command", {"argv": ["true"]}))
    await transition(db, _request(rid, "queued", "running", "run.started.ok"),
                     patch={"leased_by": "w-gone", "lease_expires_at": time.time() + 300})
    # Queued again by a move that does not clear the lease (as a spec edge running ->
    # paused -> queued without clearing it would leave it).
    moved = await transition(db, _request(rid, "running", "queued",
                                          "run.queued.lease_expired"))
    assert moved.applied and (await get_run(db, rid))["leased_by"] == "w-gone"
    got = await worker_tick(db, worker_id="w1", execute=_ok)
    assert got["claimed"] == 0 and (await get_run(db, rid))["status"] == "queued"
    stats = await queue_stats(db)
    assert stats.stuck == 1
    (stuck,) = stats.stuck_runs
    assert stuck.id == rid and "still holds the lease of w-gone" in stuck.why
