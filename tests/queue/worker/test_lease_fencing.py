"""Each claim gets a fresh lease token, so a lease the worker gave back can never write.

Owner and expiry alone can repeat: a worker that requeues a run on shutdown (or whose
retry is due at once) may claim it again at the same instant with the same TTL. The
token tells those two leases apart.
"""

from __future__ import annotations

from typing import Any

from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, submit_task
from ledgerq.queue.runs import move, no_lease
from ledgerq.queue.worker.functions import Executors, RunContext, claim_runs, execute_claimed

NOW = 1_000_000.0


async def test_a_returned_lease_cannot_finish_the_run_claimed_again_identically(
        db: StateDB) -> None:
    rid = await submit_task(db, TaskApplication("command", {"argv": ["true"]}, "host"), now=NOW)
    (first,) = (await claim_runs(db, worker_id="w1", now=NOW, lease_ttl=10)).claimed
    policy = db.registry.entity("schedule_run")
    back = await db.write(lambda conn: move(
        conn, policy, rid, "running", "queued", "run.queued.worker_shutdown",
        guard={"leased_by": "w1", "lease_expires_at": first["lease_expires_at"]},
        patch=no_lease(policy), now=NOW))
    assert back.applied
    (second,) = (await claim_runs(db, worker_id="w1", now=NOW, lease_ttl=10)).claimed
    # Same owner, same expiry: only the token differs.
    assert (second["leased_by"], second["lease_expires_at"]) == (
        first["leased_by"], first["lease_expires_at"])
    assert second["lease_token"] and second["lease_token"] != first["lease_token"]

    calls: list[str] = []

    async def execute(run: dict[str, Any]) -> tuple[int, str]:
        calls.append(run["id"])
        return 0, ""

    ctx = RunContext(worker_id="w1", lease_ttl=10, clock=lambda: NOW + 1,
                     executors=Executors(execute=execute))
    assert await execute_claimed(db, first, ctx) == "lost"
    row = await db.fetch_one("SELECT status, lease_token FROM schedule_runs WHERE id = ?", (rid,))
    assert row == {"status": "running", "lease_token": second["lease_token"]}
    assert await execute_claimed(db, second, ctx) == "completed"
    assert (await verify(db)).ok
