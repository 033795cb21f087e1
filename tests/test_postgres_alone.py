"""PostgreSQL: a unit that is one statement whose result nobody reads (``write(alone=True)``,
a plain submit) is sent from the event loop's thread on an asyncio connection, with no
hop to a pool thread; anything else still runs in a pool thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.codec import loads
from ledgerq.queue import TaskApplication, submit_task
from ledgerq.store.postgres.backend import ALONE_POOL_SIZE


@pytest.fixture
async def pgdb(pg_target: str) -> AsyncIterator[StateDB]:
    async with StateDB(pg_target) as handle:
        yield handle


def hops(db: StateDB, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per unit sent to a pool thread from now on."""
    backend: Any = db._backend
    sent: list[int] = []
    submit = backend._submit

    async def counted(fn: Any) -> Any:
        sent.append(1)
        return await submit(fn)

    monkeypatch.setattr(backend, "_submit", counted)
    return sent


def app(i: int, **kw: Any) -> TaskApplication:
    return TaskApplication("agent", {"i": i}, "host", **kw)


async def test_a_plain_submit_needs_no_pool_thread(pgdb: StateDB,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sent = hops(pgdb, monkeypatch)
    plain = [await submit_task(pgdb, app(i)) for i in range(3)]
    assert sent == []
    # A keyed submit takes its key's lock first (a statement it waits on): a pool thread.
    keyed = await submit_task(pgdb, app(9, idempotency_key="k"))
    assert sent == [1]
    rows = await pgdb.fetch_all("SELECT id FROM schedule_runs")
    assert {r["id"] for r in rows} == {*plain, keyed}


async def test_a_cancelled_caller_leaves_its_statement_to_commit(
        pgdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    backend: Any = pgdb._backend
    send = backend._send_alone
    started, release = asyncio.Event(), asyncio.Event()

    async def held_back(*args: Any) -> bool:
        started.set()
        await release.wait()
        return bool(await send(*args))

    monkeypatch.setattr(backend, "_send_alone", held_back)
    caller = asyncio.create_task(submit_task(pgdb, app(1)))
    await asyncio.wait_for(started.wait(), 10)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    for _ in range(200):  # the statement goes on without its caller, as in a pool thread
        row = await pgdb.fetch_one("SELECT count(*) AS n FROM schedule_runs")
        if row is not None and row["n"] == 1:
            break
        await asyncio.sleep(0.01)
    row = await pgdb.fetch_one("SELECT count(*) AS n FROM status_transitions")
    assert row is not None and row["n"] == 1


async def test_while_its_asyncio_connections_are_busy_a_submit_goes_to_a_pool_thread(
        pgdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    backend: Any = pgdb._backend
    send = backend._send_alone
    release = asyncio.Event()
    started: list[int] = []

    async def held_back(*args: Any) -> bool:
        started.append(1)
        await release.wait()
        return bool(await send(*args))

    monkeypatch.setattr(backend, "_send_alone", held_back)
    sent = hops(pgdb, monkeypatch)
    # (a given time: each its own unit, not joined with the others)
    busy = [asyncio.create_task(submit_task(pgdb, app(i), now=time.time()))
            for i in range(ALONE_POOL_SIZE)]
    while len(started) < ALONE_POOL_SIZE:
        await asyncio.sleep(0.01)
    # Every asyncio connection is taken: the next one does not wait for them.
    await asyncio.wait_for(submit_task(pgdb, app(99)), 10)
    assert sent == [1] and len(started) == ALONE_POOL_SIZE
    release.set()
    await asyncio.wait_for(asyncio.gather(*busy), 10)
    row = await pgdb.fetch_one("SELECT count(*) AS n FROM schedule_runs")
    assert row is not None and row["n"] == ALONE_POOL_SIZE + 1


async def test_units_sent_alone_keep_one_connection_out_of_the_pool(
        pgdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkout and return cost a sixth of a plain submit's CPU: one after another,
    units sent alone use the connection the last one used; closing gives it back."""
    backend: Any = pgdb._backend
    pool = backend._alone_pool
    taken: list[int] = []
    getconn = pool.getconn

    async def counted(*args: Any, **kwargs: Any) -> Any:
        taken.append(1)
        return await getconn(*args, **kwargs)

    monkeypatch.setattr(pool, "getconn", counted)
    sent = hops(pgdb, monkeypatch)
    ids = [await submit_task(pgdb, app(i)) for i in range(5)]
    assert taken == [1] and sent == []
    kept = backend._kept
    assert kept is not None and not kept.closed
    rows = await pgdb.fetch_all("SELECT id FROM schedule_runs")
    assert {r["id"] for r in rows} == set(ids)
    await pgdb.close()
    assert kept.closed and backend._kept is None


async def test_claim_facts_written_with_the_claims_equal_those_written_after_them(
        pgdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL writes a pass's claim facts in the claims' own statement, their patch
    partly built by the server from the rows as stored: the facts must be the ones the
    claims and a second statement wrote (compared with the dialect told it cannot)."""
    from ledgerq.lifecycle import StateReason
    from ledgerq.lifecycle.engine import apply_claims
    from ledgerq.queue.runs import worker_actor
    from ledgerq.store.postgres.tx import PostgresTx

    ids = [await submit_task(pgdb, app(i)) for i in range(4)]
    policy = pgdb.registry.entity("schedule_run")
    reason = StateReason(code="run.started.ok", summary="claimed by w",
                         evidence_refs=[{"kind": "lease", "n": 1}])
    actor = worker_actor("w")

    def claim(rid: str, token: str) -> Any:
        return lambda tx: apply_claims(
            tx, policy, [(rid, {"lease_attempts": 0, "leased_by": None},
                          {"leased_by": "w", "lease_expires_at": 1300.25,
                           "lease_token": token, "lease_attempts": 1})],
            "queued", "running", reason, actor, limit=1, now=1000.0)

    together = await pgdb.write(claim(ids[0], "t"))
    monkeypatch.setattr(PostgresTx, "stores_as_sent", False)
    after = await pgdb.write(claim(ids[1], "t"))
    assert len(together) == len(after) == 1

    async def fact(rid: str) -> dict[str, Any]:
        rows = await pgdb.fetch_all(
            "SELECT * FROM status_transitions WHERE entity_id = ? AND status = 'running'",
            (rid,))
        assert len(rows) == 1
        return {k: (loads(v) if k in ("patch", "evidence_refs", "metadata") else v)
                for k, v in rows[0].items() if k not in ("id", "entity_id")}

    assert await fact(ids[0]) == await fact(ids[1])
    patch = (await fact(ids[0]))["patch"]
    assert patch["lease_expires_at"] == 1300.25 and patch["updated_at"] == 1000.0
    assert loads(patch["status_evidence_refs"]) == [{"kind": "lease", "n": 1}]
