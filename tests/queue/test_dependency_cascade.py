"""Cascades through dependencies cost what they move and come in bounded transactions;
dependency cycles are found and counted as stuck.

Cancelling the head of a chain cancels every run down the chain, each with its own
fact, in transactions of at most ``CASCADE_CHUNK`` waiting runs, with other writers in
between; the graph is read once per transaction, however deep the cascade goes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledgerq import StateDB
from ledgerq.lifecycle.engine import create_entity
from ledgerq.lifecycle.models import Actor, StateReason
from ledgerq.projections import verify
from ledgerq.queue import (
    TaskApplication,
    cancel_task,
    claim_and_execute,
    dependencies,
    promote_due,
    queue_stats,
    submit_task,
)
from ledgerq.queue.dependencies import waiting_on_cycles
from ledgerq.queue.maintenance import promotion
from ledgerq.queue.submission.application import digest
from ledgerq.queue.submission.submit import run_row

OPERATOR = Actor(type="operator", id="ops")
CHUNK = 20


def task(**kw: Any) -> TaskApplication:
    return TaskApplication("command", {"argv": ["true"]}, "host", **kw)


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dependencies, "CASCADE_CHUNK", CHUNK)
    monkeypatch.setattr(promotion, "SWEEP_CHUNK", CHUNK)


async def chain(db: StateDB, n: int) -> list[str]:
    ids = [await submit_task(db, task())]
    for _ in range(n - 1):
        ids.append(await submit_task(db, task(depends_on=[ids[-1]])))
    return ids


async def statuses(db: StateDB) -> dict[str, str]:
    return {r["id"]: r["status"] for r in await db.fetch_all(
        "SELECT id, status FROM schedule_runs", ())}


def count_units(db: StateDB, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Per write unit from now on, how many times it read the whole dependency graph."""
    units: list[int] = []
    real = db.write

    async def counting(fn: Any, **kw: Any) -> Any:
        reads = 0

        def unit(tx: Any) -> Any:
            nonlocal reads
            real_read = tx.list_all_waiting

            def read(policy: Any) -> Any:
                nonlocal reads
                reads += 1
                return real_read(policy)

            tx.list_all_waiting = read
            try:
                return fn(tx)
            finally:
                del tx.list_all_waiting
        got = await real(unit, **kw)
        units.append(reads)
        return got

    monkeypatch.setattr(db, "write", counting)
    return units


async def test_cancelling_the_head_of_a_chain_goes_in_bounded_transactions(
        db: StateDB, small_chunks: None, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = await chain(db, 5 * CHUNK + 3)
    units = count_units(db, monkeypatch)
    assert await cancel_task(db, ids[0], actor=OPERATOR)
    got = await statuses(db)
    assert all(got[i] == "cancelled" for i in ids)
    # Six transactions of at most CHUNK waiting runs each, the graph read once in each:
    # linear, where a lookup per cancelled run was quadratic.
    assert len(units) == 6 and all(n == 1 for n in units)
    facts = await db.fetch_all(
        "SELECT entity_id FROM status_transitions WHERE reason_code = "
        "'run.cancelled.dependency_failed'", ())
    assert sorted(f["entity_id"] for f in facts) == sorted(ids[1:])
    assert (await verify(db)).ok


async def test_other_writers_get_in_between_the_chunks_of_a_cascade(
        db: StateDB, small_chunks: None) -> None:
    ids = await chain(db, 4 * CHUNK)
    order: list[str] = []

    async def cancel() -> None:
        await cancel_task(db, ids[0], actor=OPERATOR)
        order.append("cancel")

    async def submit() -> None:
        await asyncio.sleep(0)
        await submit_task(db, task())
        order.append("submit")

    await asyncio.gather(cancel(), submit())
    assert order == ["submit", "cancel"]
    assert all(s == "cancelled" for i, s in (await statuses(db)).items() if i in ids[1:])


async def test_a_run_with_many_dependents_settles_them_in_chunks(
        db: StateDB, small_chunks: None) -> None:
    """The failed run's own write settles one chunk (it never holds the loop for the
    whole cascade); the dependency sweep settles the rest, a chunk per transaction."""
    head = await submit_task(db, task())
    fan = [await submit_task(db, task(depends_on=[head])) for _ in range(3 * CHUNK + 5)]

    async def fails(run: dict[str, Any]) -> tuple[int, str]:
        return 1, "no"

    await claim_and_execute(db, worker_id="w", execute=fails)
    got = await statuses(db)
    assert sum(got[i] == "cancelled" for i in fan) == CHUNK
    assert (await promote_due(db))["cancelled"] == len(fan) - CHUNK
    assert all(s == "cancelled" for i, s in (await statuses(db)).items() if i in fan)
    assert (await verify(db)).ok


async def test_a_dependency_cycle_is_stuck_and_cancelling_one_member_ends_it(
        db: StateDB) -> None:
    """Submission cannot make a cycle; rows created with chosen ids can, and stats
    names them as stuck instead of saying nothing while they wait forever."""
    policy = db.registry.entity("schedule_run")
    app = task()
    base = run_row(app, 1e9, "host", "waiting_dependency", [], digest(app), policy=policy)

    def make(rid: str, dep: str) -> Any:
        return lambda tx: create_entity(tx, policy, {**base, "id": rid,
                                                     "depends_on": json.dumps([dep])},
                                        reason=StateReason(
                                            code="run.waiting_dependency.submitted"),
                                        actor=OPERATOR)

    for rid, dep in (("cyc-a", "cyc-b"), ("cyc-b", "cyc-a"), ("cyc-c", "cyc-a")):
        await db.write(make(rid, dep))
    stats = await queue_stats(db)
    assert stats.stuck == 3
    why = {s.id: s.why for s in stats.stuck_runs}
    assert why["cyc-c"].startswith("waits on a dependency cycle: cyc-")
    assert "cyc-a" in why["cyc-c"] and "cyc-b" in why["cyc-c"]
    assert await cancel_task(db, "cyc-a", actor=OPERATOR)
    assert {i: s for i, s in (await statuses(db)).items() if i.startswith("cyc")} == {
        "cyc-a": "cancelled", "cyc-b": "cancelled", "cyc-c": "cancelled"}
    assert (await queue_stats(db)).stuck == 0


def _on_cycle_brute(edges: dict[str, list[str]]) -> set[str]:
    """Nodes that reach a node that reaches itself (through waiting nodes only)."""
    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [d for d in edges[start] if d in edges]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo += [d for d in edges[n] if d in edges]
        return seen
    cyclic = {n for n in edges if n in reach(n)}
    return {n for n in edges if n in cyclic or reach(n) & cyclic}


@given(st.dictionaries(st.sampled_from("abcdefgh"),
                       st.lists(st.sampled_from("abcdefghij"), max_size=3), max_size=8))
def test_waiting_on_cycles_finds_exactly_the_runs_that_can_never_settle(
        edges: dict[str, list[str]]) -> None:
    found = waiting_on_cycles((rid, json.dumps(deps)) for rid, deps in edges.items())
    assert set(found) == _on_cycle_brute(edges)
    for cycle in found.values():  # each named cycle is one
        assert all(cycle[(i + 1) % len(cycle)] in edges[c] for i, c in enumerate(cycle))


async def test_a_big_cascade_never_costs_another_run_its_lease(tmp_path: Any) -> None:
    """A run with thousands of dependents fails while another run is executing under a
    short lease on the same worker: the cascade's transactions are bounded, so the
    worker's event loop keeps renewing the other run's lease and it runs exactly once.
    (One transaction for the whole cascade blocked SQLite's inline writer, i.e. the
    loop, for seconds: the other run's lease expired, it was reaped and ran again.)"""
    from ledgerq.queue import Worker, submit_many

    async with StateDB(str(tmp_path / "c.db")) as db:
        head = await submit_task(db, TaskApplication("agent", {"prompt": "head"}, "host"))
        await submit_many(db, [TaskApplication("agent", {"prompt": f"d{i}"}, "host",
                                               depends_on=[head]) for i in range(3000)])
        await submit_task(db, TaskApplication("agent", {"prompt": "long"}, "host"))
        ran: list[str] = []

        async def execute(run: dict[str, Any]) -> tuple[int, str]:
            ran.append(run["action_args"]["prompt"])
            if run["action_args"]["prompt"] == "long":
                await asyncio.sleep(4.0)
                return 0, ""
            await asyncio.sleep(0.5)
            return 1, "head failed"

        worker = Worker(db, worker_id="w", capacity=2, execute=execute, lease_ttl=2.0,
                        check_interval=0.2, poll_interval=0.05, lock_dir=None,
                        handle_signals=False)
        serving = asyncio.create_task(worker.run())
        try:
            async with asyncio.timeout(60):
                while worker.outcomes["completed"] < 1:
                    await asyncio.sleep(0.05)
        finally:
            await worker.stop()
            await serving
        assert sorted(ran) == ["head", "long"]
        got = await statuses(db)
        assert sum(s == "cancelled" for s in got.values()) == 3000
        assert (await verify(db)).ok
