"""A pass's runs that end in their executor's first step write their outcomes together.

Each outcome is still its own guarded move with its own fact; only the transaction is
shared. A run that waits goes on in its own task meanwhile, one whose write raises fails
alone, and an executor's result the log could not store fails its run instead of
leaving it running until its lease expires (and then running it again).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue import RetryPolicy, TaskApplication, Worker, claim_and_execute, submit_many
from ledgerq.queue.worker import outcomes as outcomes_mod

WORKER = "w-together"


@pytest.fixture
async def qdb(db_target: str) -> AsyncIterator[StateDB]:
    async with StateDB(db_target) as handle:
        yield handle


def apps(n: int, **args: Any) -> list[TaskApplication]:
    return [TaskApplication("agent", {"prompt": f"p{i}", **args}, "host") for i in range(n)]


def count_outcome_writes(db: StateDB) -> list[int]:
    """How many outcome writes each shared write unit held, from now on."""
    seen: list[int] = []
    real = db.write_together

    async def counting(fn: Any) -> Any:
        got = await real(fn)
        seen.append(len(got) if isinstance(got, list) else 1)
        return got

    db.write_together = counting  # type: ignore[method-assign]
    return seen


async def ends(db: StateDB) -> dict[str, tuple[str, str | None]]:
    """Each run's status and error_detail."""
    rows = await db.fetch_all("SELECT id, status, error_detail FROM schedule_runs")
    return {r["id"]: (r["status"], r["error_detail"]) for r in rows}


async def terminal_facts(db: StateDB) -> list[dict[str, Any]]:
    return await db.fetch_all(
        "SELECT id, entity_id, previous_status, status FROM status_transitions "
        "WHERE previous_status = 'running'")


async def test_runs_that_need_no_wait_write_their_outcomes_in_one_unit(qdb: StateDB) -> None:
    ids = await submit_many(qdb, apps(6))
    writes = count_outcome_writes(qdb)

    async def at_once(run: dict[str, Any]) -> tuple[int, str]:
        return (0, "") if run["action_args"]["prompt"] != "p3" else (7, "seven")

    assert await claim_and_execute(qdb, worker_id=WORKER, execute=at_once, limit=6) == 6
    assert writes == [6]
    got = await ends(qdb)
    assert {rid: got[rid][0] for rid in ids} == {
        rid: "failed" if i == 3 else "completed" for i, rid in enumerate(ids)}
    assert got[ids[3]][1] == "seven"
    facts = await terminal_facts(qdb)
    assert sorted(f["entity_id"] for f in facts) == sorted(ids)  # each its own fact
    assert len({f["id"] for f in facts}) == 6
    assert (await verify(qdb)).ok


async def test_a_run_that_waits_goes_on_while_the_others_are_written(qdb: StateDB) -> None:
    ids = await submit_many(qdb, apps(4))
    writes = count_outcome_writes(qdb)
    release = asyncio.Event()
    order: list[str] = []

    async def some_wait(run: dict[str, Any]) -> tuple[int, str]:
        if run["action_args"]["prompt"] == "p0":
            await release.wait()
        order.append(run["action_args"]["prompt"])
        return 0, ""

    async def let_it_finish() -> None:
        while (await ends(qdb))[ids[1]][0] != "completed":
            await asyncio.sleep(0.01)
        release.set()

    helper = asyncio.create_task(let_it_finish())
    assert await asyncio.wait_for(
        claim_and_execute(qdb, worker_id=WORKER, execute=some_wait, limit=4), 30) == 4
    await helper
    # The three that needed no wait were written first, together; the waiting one after.
    assert writes == [3, 1]
    assert sorted(order[:3]) == ["p1", "p2", "p3"] and order[3] == "p0"
    assert {s for s, _ in (await ends(qdb)).values()} == {"completed"}


async def test_an_outcome_write_that_raises_fails_alone(
        qdb: StateDB, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    ids = await submit_many(qdb, apps(3))
    real = outcomes_mod.apply_moves

    def apply_moves(tx: Any, policy: Any, writes: Any) -> Any:
        moved = real(tx, policy, writes)  # their writes are there, and must be rolled back
        if any(w.entity_id == ids[1] for w in writes):
            raise RuntimeError("this run's write broke")
        return moved

    monkeypatch.setattr(outcomes_mod, "apply_moves", apply_moves)

    async def at_once(run: dict[str, Any]) -> tuple[int, str]:
        return 0, ""

    assert await claim_and_execute(qdb, worker_id=WORKER, execute=at_once, limit=3) == 3
    got = await ends(qdb)
    assert [got[rid][0] for rid in ids] == ["completed", "running", "completed"]
    assert sorted(f["entity_id"] for f in await terminal_facts(qdb)) == \
        sorted([ids[0], ids[2]])
    assert f"run {ids[1]}: supervisor failed" in caplog.text
    assert (await verify(qdb)).ok


@pytest.mark.parametrize(("raised", "returned", "stored"), [
    (None, (1, "bad\x00byte"), "bad\ufffdbyte"),
    (ValueError("lone \udcff surrogate"), None, "ValueError: lone \ufffd surrogate"),
    (None, (1, "ok ünïcode"), "ok ünïcode"),
])
async def test_an_executor_text_the_log_cannot_store_is_made_storable(
        qdb: StateDB, raised: Exception | None, returned: tuple[int, str] | None,
        stored: str) -> None:
    (rid,) = await submit_many(qdb, apps(1))

    async def executor(run: dict[str, Any]) -> tuple[int, str]:
        if raised is not None:
            raise raised
        assert returned is not None
        return returned

    await claim_and_execute(qdb, worker_id=WORKER, execute=executor)
    assert (await ends(qdb))[rid] == ("failed", stored)


@pytest.mark.parametrize("returned", [
    ("0", ""), (True, ""), (0, 5), 0, None, (0, "", "extra"), (2**63, "too big")])
async def test_an_executor_result_that_is_no_exit_code_and_detail_fails_its_run(
        qdb: StateDB, returned: Any) -> None:
    (rid,) = await submit_many(qdb, apps(1))

    async def executor(run: dict[str, Any]) -> Any:
        return returned

    await claim_and_execute(qdb, worker_id=WORKER, execute=executor)
    status, detail = (await ends(qdb))[rid]
    assert status == "failed"
    assert detail is not None and detail.startswith(f"executor returned {returned!r}")


async def test_a_worker_counts_the_outcomes_it_writes_together(qdb: StateDB) -> None:
    await submit_many(qdb, apps(30))

    async def at_once(run: dict[str, Any]) -> tuple[int, str]:
        return (0, "") if run["action_args"]["prompt"] != "p7" else (1, "no")

    worker = Worker(qdb, worker_id=WORKER, capacity=10, claim_limit=10, execute=at_once,
                    poll_interval=0.05, lock_dir=None, handle_signals=False)
    serving = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(30):
            while sum(worker.outcomes.values()) < 30:
                await asyncio.sleep(0.01)
    finally:
        await worker.stop()
        await serving
    assert dict(worker.outcomes) == {"completed": 29, "failed": 1}
    assert worker.max_active == 0  # none needed a task of its own


@pytest.mark.parametrize("waits_first", [False, True])
async def test_an_executor_that_cancels_itself_fails_its_run_alone(
        qdb: StateDB, waits_first: bool) -> None:
    """A CancelledError the executor raises itself (at once, or after a wait) is its run's
    failure: the pass's other runs end as usual and the run is not left running."""
    ids = await submit_many(qdb, apps(3))

    async def executor(run: dict[str, Any]) -> tuple[int, str]:
        if run["action_args"]["prompt"] == "p1":
            if waits_first:
                await asyncio.sleep(0)
            raise asyncio.CancelledError
        return 0, ""

    assert await claim_and_execute(qdb, worker_id=WORKER, execute=executor, limit=3) == 3
    got = await ends(qdb)
    assert [got[rid][0] for rid in ids] == ["completed", "failed", "completed"]
    assert got[ids[1]][1] == "CancelledError: the executor was cancelled"


async def test_the_dependents_of_runs_ended_together_are_settled_in_the_same_write(
        qdb: StateDB) -> None:
    a, b = await submit_many(qdb, apps(2))
    on_a, on_both = await submit_many(qdb, [
        TaskApplication("agent", {"prompt": "after a"}, "host", depends_on=[a]),
        TaskApplication("agent", {"prompt": "after both"}, "host", depends_on=[a, b])])
    writes = count_outcome_writes(qdb)

    async def at_once(run: dict[str, Any]) -> tuple[int, str]:
        return (0, "") if run["id"] == a else (1, "b failed")

    assert await claim_and_execute(qdb, worker_id=WORKER, execute=at_once, limit=2) == 2
    assert writes == [2]
    got = await ends(qdb)
    assert (got[a][0], got[b][0]) == ("completed", "failed")
    assert got[on_a][0] == "queued"  # released: its one dependency succeeded
    assert got[on_both] == ("cancelled", f"dependency {b} ended failed")
    assert (await verify(qdb)).ok


async def test_an_outcome_the_log_refuses_fails_its_run_once(qdb: StateDB) -> None:
    """A result the log cannot store (a float JSON does not carry exactly) is the
    worker's failure, not the task's: the run ends failed once, saying why, instead of
    staying running until its lease expires and then running again."""
    from ledgerq.queue import reap_expired_leases
    from ledgerq.queue.worker.finished import Finished

    (rid,) = await submit_many(qdb, [TaskApplication(
        "agent", {"prompt": "p"}, "host", retry=RetryPolicy(3, 0.0))])
    calls: list[str] = []

    async def executor(run: dict[str, Any]) -> Finished:
        calls.append(run["id"])
        return Finished(exit_code=0, result={"big": 2.0 ** 60})

    await claim_and_execute(qdb, worker_id=WORKER, execute=executor)
    status, detail = (await ends(qdb))[rid]
    assert status == "failed"
    assert detail is not None and detail.startswith(
        "the worker could not record this run's outcome (completed): InvalidInput")
    assert "2**53" in detail
    await reap_expired_leases(qdb, now=4e9)
    await claim_and_execute(qdb, worker_id=WORKER, execute=executor, now=4e9)
    assert calls == [rid]
    assert (await verify(qdb)).ok
