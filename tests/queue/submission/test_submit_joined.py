"""Submits made in the same turn of the event loop share one write unit
(ledgerq.queue.submission.joined), on both backends: the same rows and facts as one unit each,
every caller its own id, and a refusal still the refused caller's alone."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerq import StateDB
from ledgerq.codec import loads
from ledgerq.errors import DatabaseUnavailable, IdempotencyConflict, InvalidInput
from ledgerq.lifecycle import Actor
from ledgerq.projections import history, verify
from ledgerq.queue import TaskApplication, submit_task
from ledgerq.queue.submission import application as application_mod
from ledgerq.queue.submission import joined, submit


def app(i: int, **kw: Any) -> TaskApplication:
    return TaskApplication("agent", {"prompt": f"task {i}"}, "host", **kw)


def count_writes(db: StateDB, monkeypatch: pytest.MonkeyPatch) -> list[Callable[..., Any]]:
    """The units ``db`` is asked to write from now on."""
    units: list[Callable[..., Any]] = []
    write = db.write

    async def counted(fn: Callable[..., Any], **kw: Any) -> Any:
        units.append(fn)
        return await write(fn, **kw)

    monkeypatch.setattr(db, "write", counted)
    return units


async def stored_prompts(db: StateDB) -> dict[str, str]:
    rows = await db.fetch_all("SELECT id, action_args FROM schedule_runs")
    return {r["id"]: loads(r["action_args"])["prompt"] for r in rows}


async def test_submits_made_in_one_turn_share_one_unit(db: StateDB,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    units = count_writes(db, monkeypatch)
    ids = await asyncio.gather(*(submit_task(db, app(i)) for i in range(40)))
    assert len(units) == 1
    assert len(set(ids)) == 40
    # Each caller got the id of its own application's row, with its own creation fact.
    assert await stored_prompts(db) == {rid: f"task {i}" for i, rid in enumerate(ids)}
    for rid in ids[:3]:
        facts = await history(db, "schedule_run", rid)
        assert [f["status"] for f in facts] == ["queued"]
    assert (await verify(db)).ok


async def test_a_submit_alone_in_its_turn_is_written_at_once(db: StateDB,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    units = count_writes(db, monkeypatch)
    await asyncio.sleep(0.05)  # the handle's own tasks (a pool's workers) settle first
    for i in range(3):
        await submit_task(db, app(i))
    assert len(units) == 3
    assert db not in joined._open  # no joint was ever opened


async def test_a_joint_takes_at_most_its_limit(db: StateDB,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    units = count_writes(db, monkeypatch)
    ids = await asyncio.gather(*(submit_task(db, app(i))
                                 for i in range(joined.MAX_JOINED + 10)))
    assert len(units) == 2
    assert len(set(ids)) == joined.MAX_JOINED + 10
    assert await stored_prompts(db) == {rid: f"task {i}" for i, rid in enumerate(ids)}


async def test_callers_of_different_actors_are_not_joined(db: StateDB,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    units = count_writes(db, monkeypatch)
    alice = Actor(type="operator", id="alice")
    ids = await asyncio.gather(submit_task(db, app(0)), submit_task(db, app(1), actor=alice),
                               submit_task(db, app(2)))
    assert len(units) == 2
    actors = {rid: (await history(db, "schedule_run", rid))[0]["actor"] for rid in ids}
    assert actors == {ids[0]: "ledgerq.submit", ids[1]: "alice", ids[2]: "ledgerq.submit"}


async def test_a_refused_submit_in_a_joint_is_refused_alone(
        db: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    units = count_writes(db, monkeypatch)
    # Valid as an application, refused inside the transaction: the column holds 64 bits.
    # (Submission bounds a timeout at 100 years first; lifted here, so that the write is
    # what refuses it.)
    monkeypatch.setattr(application_mod, "check_span", lambda value, what, **kw: value)
    too_long = app(99, timeout_seconds=2**63)
    got = await asyncio.gather(*(submit_task(db, app(i)) for i in range(5)),
                               submit_task(db, too_long),
                               *(submit_task(db, app(i)) for i in range(5, 10)),
                               return_exceptions=True)
    assert isinstance(got[5], InvalidInput) and "64 bits" in str(got[5])
    ok = [g for g in got if isinstance(g, str)]
    assert len(ok) == 10
    assert len(units) == 1 + 11  # the joint, then each of its callers alone
    prompts = await stored_prompts(db)
    assert sorted(prompts[rid] for rid in ok) == sorted(f"task {i}" for i in range(10))
    assert len(prompts) == 10
    assert (await verify(db)).ok


async def test_submits_that_take_a_lock_or_read_other_runs_are_not_joined(
        db: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    dep = await submit_task(db, app(0))
    units = count_writes(db, monkeypatch)
    keyed = [app(i, idempotency_key=f"k{i}") for i in range(3)]
    waiting = [app(i, depends_on=[dep]) for i in range(3, 6)]
    ids = await asyncio.gather(*(submit_task(db, a) for a in [*keyed, *waiting]),
                               submit_task(db, app(6)), submit_task(db, app(7)))
    assert len(units) == 6 + 1  # each keyed and each dependent alone; the two plain joined
    prompts = await stored_prompts(db)
    assert [prompts[rid] for rid in ids] == [f"task {i}" for i in range(8)]


async def test_a_database_failure_fails_every_caller_without_a_retry_alone(
        db: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    units = count_writes(db, monkeypatch)

    def failing(*args: Any, **kw: Any) -> Any:
        raise DatabaseUnavailable("the disk is full")

    monkeypatch.setattr(submit, "insert_all", failing)
    got = await asyncio.gather(*(submit_task(db, app(i)) for i in range(5)),
                               return_exceptions=True)
    assert all(isinstance(g, DatabaseUnavailable) for g in got)
    assert len(units) == 1  # each caller would meet the same failure: none tries again
    assert await stored_prompts(db) == {}


async def test_a_cancelled_caller_leaves_the_others_write_alone(db: StateDB) -> None:
    tasks = [asyncio.create_task(submit_task(db, app(i))) for i in range(6)]
    await asyncio.sleep(0)  # every caller has joined; the joint's unit has not run yet
    tasks[2].cancel()
    got = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(got[2], asyncio.CancelledError)
    ids = [g for g in got if isinstance(g, str)]
    assert len(ids) == 5
    prompts = await stored_prompts(db)
    # The cancelled caller's application had joined the unit, which went on: its row is
    # written, as a lone submit's is once its unit is queued.
    assert sorted(prompts.values()) == sorted(f"task {i}" for i in range(6))
    assert all(prompts[rid] == f"task {i}" for i, rid in
               ((i, g) for i, g in enumerate(got) if isinstance(g, str)))


async def test_a_joint_whose_unit_gives_too_few_values_fails_its_callers(db: StateDB) -> None:
    """Every caller of a joint waits on its own future: one the unit gave no value for is
    told so (an IndexError), never left waiting."""
    def too_few(tx: Any, items: Any, now: float) -> list[str]:
        return [f"v{i}" for i in items][:-1]

    got = await asyncio.wait_for(asyncio.gather(
        *(joined.write_joined(db, "k", i, too_few) for i in range(3)),
        return_exceptions=True), 10)
    assert got[:2] == ["v0", "v1"] and isinstance(got[2], IndexError), got


_examples = itertools.count()


#: How a drawn submission goes wrong: not at all, an unknown dependency (refused alone,
#: never joined), a timeout its column cannot hold (refused inside a joint).
_FINE, _UNKNOWN_DEP, _TOO_LONG = "fine", "unknown dependency", "too long"


@st.composite
def _batches(draw: st.DrawFn) -> list[tuple[int, str | None, str]]:
    """Concurrent submissions: (prompt, idempotency key or None, what is wrong). Few
    prompts and keys, so a key is often reused, with the same application (the first
    run's id comes back) or another (refused)."""
    one = st.tuples(st.integers(0, 2), st.sampled_from([None, None, None, "a", "b"]),
                    st.sampled_from([_FINE] * 6 + [_UNKNOWN_DEP, _TOO_LONG]))
    got = draw(st.lists(one, min_size=1, max_size=25))
    return [(p, k, wrong if k is None else _FINE) for p, k, wrong in got]


async def _check_batch(db: StateDB, batch: list[tuple[int, str | None, str]]) -> None:
    tag = next(_examples)
    apps = [TaskApplication("agent", {"prompt": p, "tag": tag}, "host",
                            idempotency_key=None if k is None else f"{tag}-{k}",
                            depends_on=[f"missing-{tag}-{i}"] if wrong == _UNKNOWN_DEP else (),
                            timeout_seconds=2**63 if wrong == _TOO_LONG else None)
            for i, (p, k, wrong) in enumerate(batch)]
    before = await _counts(db)
    got = await asyncio.gather(*(submit_task(db, a) for a in apps), return_exceptions=True)
    winners: dict[str, str] = {}  # key -> the id every call with its application got
    for (p, k, wrong), a, g in zip(batch, apps, got, strict=True):
        if wrong != _FINE:
            expected = "unknown run id" if wrong == _UNKNOWN_DEP else "64 bits"
            assert isinstance(g, InvalidInput) and expected in str(g), g
            continue
        if isinstance(g, IdempotencyConflict):
            assert k is not None
            continue
        assert isinstance(g, str), g
        row = await db.fetch_one("SELECT action_args, idempotency_key FROM schedule_runs "
                                 "WHERE id = ?", (g,))
        assert row is not None and loads(row["action_args"]) == {"prompt": p, "tag": tag}
        assert row["idempotency_key"] == a.idempotency_key
        if a.idempotency_key is not None:
            assert winners.setdefault(a.idempotency_key, g) == g
    ids = {g for g in got if isinstance(g, str)}
    # Per key, a call is refused exactly when its application differs from the stored one.
    for (p, _, wrong), a, g in zip(batch, apps, got, strict=True):
        if a.idempotency_key is not None and wrong == _FINE:
            stored = await db.fetch_one("SELECT action_args FROM schedule_runs "
                                        "WHERE idempotency_key = ?", (a.idempotency_key,))
            assert stored is not None
            same = loads(stored["action_args"])["prompt"] == p
            assert isinstance(g, str) == same, (g, same)
    runs, facts = await _counts(db)
    # Nothing but the returned rows was written, each with its one creation fact.
    assert (runs - before[0], facts - before[1]) == (len(ids), len(ids))


async def _counts(db: StateDB) -> tuple[int, int]:
    row = await db.fetch_one("SELECT (SELECT count(*) FROM schedule_runs) AS runs, "
                             "(SELECT count(*) FROM status_transitions) AS facts")
    assert row is not None
    return int(row["runs"]), int(row["facts"])


def test_random_concurrent_submits_end_as_if_each_were_alone(db_target: str) -> None:
    """Whatever joins and whatever is refused: each call gets its own row (or the row its
    key already names, for the same application), a refusal is the refused call's alone
    (inside a joint too), and nothing else is written."""
    with asyncio.Runner() as runner, pytest.MonkeyPatch.context() as patch:
        # A timeout past 64 bits is bounded at submission first; lifted here, so that the
        # write inside a joint is what refuses it.
        patch.setattr(application_mod, "check_span", lambda value, what, **kw: value)
        db = StateDB(db_target)
        runner.run(db.open())
        try:
            @settings(max_examples=40, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])
            @given(_batches())
            def check(batch: list[tuple[int, str | None, str]]) -> None:
                runner.run(_check_batch(db, batch))

            check()
            assert runner.run(verify(db)).ok
        finally:
            runner.run(db.close())
