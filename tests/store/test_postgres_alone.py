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


@pytest.mark.parametrize("branch", ["closed by the server", "stale plan", "sent"])
async def test_a_connection_sent_alone_goes_back_to_the_pool_once(
        pgdb: StateDB, monkeypatch: pytest.MonkeyPatch, branch: str) -> None:
    """However a send ends (a connection the server closed, a plan to forget, a statement
    sent), the connection it took is returned once, even when returning it fails: a
    second return would hand the pool a connection it already holds."""
    from ledgerq.store.postgres import backend as module

    backend: Any = pgdb._backend
    pool = backend._alone_pool
    monkeypatch.setattr(pool, "max_lifetime", 0.0)  # every connection too old to keep
    returned: list[Any] = []

    async def failing_return(conn: Any) -> None:
        returned.append(conn)
        raise RuntimeError("the pool refused it")

    monkeypatch.setattr(pool, "putconn", failing_return)
    if branch == "closed by the server":
        monkeypatch.setattr(module, "_received_nothing", lambda conn: False)
        sql = "SELECT 1"
    elif branch == "stale plan":
        monkeypatch.setattr(module, "stale_plan", lambda exc: True)
        sql = "SELECT 1/0"
    else:
        sql = "SELECT 1"
    with pytest.raises(RuntimeError, match="refused"):
        await backend._send_alone(pool, sql, ())
    assert len(returned) == 1
