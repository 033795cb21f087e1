"""Priorities and named queues.

Through the library on both backends (claim order, queue isolation, the claim and capability rules
among them, validation that writes nothing, retry and schedules carrying both), and end
to end through the ``ledgerq`` command in subprocesses (submit, ls, show, a worker
serving one queue). The claim order's properties under random operation sequences are
in the hypothesis worker machine (tests/queue/worker/test_runtime_stateful.py).
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ledgerq.queue.submission.submit as submit_module
from ledgerq import StateDB
from ledgerq.errors import IdempotencyConflict, InvalidInput
from ledgerq.lifecycle import Actor
from ledgerq.lifecycle.engine import new_id
from ledgerq.projections import verify
from ledgerq.queue import (
    TaskApplication,
    Worker,
    add_schedule,
    cancel_task,
    claim_runs,
    retry_run,
    run_history,
    submit_many,
    submit_task,
    wait_for_runs,
)
from ledgerq.queue.reads import get_run, list_runs, page_runs
from ledgerq.queue.scheduling.scheduler import fire_due
from ledgerq.queue.submission.application import digest
from test_cli import cli, ok, one_error_line

PY = sys.executable
T0 = 1_000_000.0
GPU = "gpu-exclusive"  # a serialization token: one run per host key at a time
WARM = "warmed-cache"  # an affinity token: orders, never filters
OPERATOR = Actor(type="operator", id="test")


def app(**extra: Any) -> TaskApplication:
    return TaskApplication("agent", {}, "host", **extra)


@pytest.fixture(autouse=True)
def ordered_ids() -> Iterator[None]:
    """Run ids in submission order, so an expected order reads as the submissions do."""
    counter = itertools.count(1)
    submit_module.new_run_id = lambda: f"00000000-0000-7000-8000-{next(counter):012d}"
    yield
    submit_module.new_run_id = new_id


async def put(db: StateDB, at: float, **extra: Any) -> str:
    return await submit_task(db, app(**extra), now=T0 + at, host="h0")


async def claim(db: StateDB, limit: int = 10, worker: str = "host:00000001",
                **opts: Any) -> list[str]:
    got = await claim_runs(db, worker_id=worker, now=T0 + 100, limit=limit, **opts)
    return [r["id"] for r in got.claimed]


async def count(db: StateDB) -> tuple[int, int]:
    runs = await db.fetch_one("SELECT COUNT(*) AS n FROM schedule_runs")
    facts = await db.fetch_one("SELECT COUNT(*) AS n FROM status_transitions")
    assert runs is not None and facts is not None
    return int(runs["n"]), int(facts["n"])


# ----------------------------------------------------------------- claim order


async def test_higher_priority_first_then_oldest(db: StateDB) -> None:
    a = await put(db, 1)
    b = await put(db, 2, priority=5)
    c = await put(db, 3, priority=5)
    d = await put(db, 0, priority=-3)
    e = await put(db, 0.5)
    # One at a time: each pass takes the best of what is left.
    order = [(await claim(db, limit=1))[0] for _ in range(5)]
    assert order == [b, c, e, a, d]
    row = await get_run(db, b)
    assert (row["priority"], row["queue"]) == (5, "default")


async def test_one_pass_takes_the_head_of_the_order(db: StateDB) -> None:
    low = [await put(db, i) for i in range(5)]
    high = [await put(db, 10 + i, priority=1) for i in range(3)]
    assert sorted(await claim(db, limit=4)) == sorted([*high, low[0]])


async def test_a_worker_claims_only_from_its_queues(db: StateDB) -> None:
    x = await put(db, 1, queue="a", priority=9)
    y = await put(db, 2, queue="b", priority=1)
    z = await put(db, 3)
    assert await claim(db, queues=["nobody"]) == []
    assert await claim(db, queues=["a"]) == [x]
    assert await claim(db, queues=["a"]) == []
    assert await claim(db) == [z]  # the default queue alone
    assert await claim(db, queues=["b", "default"]) == [y]


async def test_queues_merge_by_priority_then_age(db: StateDB) -> None:
    a1 = await put(db, 1, queue="a")
    b2 = await put(db, 2, queue="b")
    a3 = await put(db, 3, queue="a")
    b4 = await put(db, 4, queue="b")
    b5 = await put(db, 5, queue="b", priority=1)
    order = [(await claim(db, limit=1, queues=["a", "b"]))[0] for _ in range(5)]
    assert order == [b5, a1, b2, a3, b4]


async def test_affinity_orders_only_runs_of_equal_priority(db: StateDB) -> None:
    plain = await put(db, 1)
    warm = await put(db, 2, required_capabilities=[WARM])
    urgent = await put(db, 3, priority=1)
    order = [(await claim(db, limit=1, advertised_capabilities=[WARM]))[0] for _ in range(3)]
    assert order == [urgent, warm, plain]


async def test_a_running_key_blocks_its_runs_at_any_priority(db: StateDB) -> None:
    first = await put(db, 1, required_capabilities=[GPU])
    assert await claim(db, limit=1, advertised_capabilities=[GPU]) == [first]
    blocked = await put(db, 2, required_capabilities=[GPU], priority=9)
    plain = await put(db, 3, priority=1)
    assert await claim(db, advertised_capabilities=[GPU]) == [plain]
    assert await cancel_task(db, first, actor=OPERATOR, now=T0 + 100)
    twin = await put(db, 4, required_capabilities=[GPU], priority=9)
    # One run per key per pass: the older of the two equal-priority keyed runs.
    assert await claim(db, advertised_capabilities=[GPU]) == [blocked]
    assert (await get_run(db, twin))["status"] == "queued"


async def test_other_queues_are_never_read(db: StateDB) -> None:
    await submit_many(db, [app(queue="bulk", priority=p % 7) for p in range(300)], now=T0)
    mine = await put(db, 1, priority=-1000)
    got = await claim_runs(db, worker_id="host:00000001", now=T0 + 100, limit=5)
    assert [r["id"] for r in got.claimed] == [mine] and got.scanned == 1


async def test_delayed_runs_wait_whatever_their_priority(db: StateDB) -> None:
    later = await put(db, 0, priority=1000, not_before=T0 + 500)
    now = await put(db, 1)
    assert await claim(db) == [now]
    assert (await get_run(db, later))["status"] == "delayed"


# ----------------------------------------------------------------- validation


@pytest.mark.parametrize(("fields", "message"), [
    ({"priority": 1001}, "priority must be from -1000 to 1000"),
    ({"priority": -1001}, "priority must be from -1000 to 1000"),
    ({"priority": True}, "priority must be an integer"),
    ({"priority": 1.5}, "priority must be an integer"),
    ({"priority": "1"}, "priority must be an integer"),
    ({"priority": None}, "priority must be an integer"),
    ({"queue": ""}, "queue must not be empty"),
    ({"queue": "q" * 65}, "queue is 65 characters long; the limit is 64"),
    ({"queue": "has space"}, "is not a queue name"),
    ({"queue": "-lead"}, "is not a queue name"),
    ({"queue": "ünï"}, "is not a queue name"),
    ({"queue": "a\x00b"}, "is not a queue name"),
    ({"queue": None}, "queue must be a string"),
    ({"queue": 5}, "queue must be a string"),
])
async def test_bad_priorities_and_queues_are_refused_writing_nothing(
        db: StateDB, fields: dict[str, Any], message: str) -> None:
    before = await count(db)
    with pytest.raises(InvalidInput) as refused:
        await submit_task(db, app(**fields))
    assert message in str(refused.value)
    with pytest.raises(InvalidInput, match=r"^apps\[1\]: "):
        await submit_many(db, [app(), app(**fields)])
    assert await count(db) == before


@pytest.mark.parametrize(("queues", "message"), [
    ("default", "not the string"), ([], "at least one queue"),
    (["ok", "bad name"], r"queues\[1\] .* is not a queue name"),
])
async def test_bad_worker_queues_are_refused(db: StateDB, queues: Any, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        await claim_runs(db, worker_id="host:00000001", queues=queues)
    with pytest.raises(InvalidInput, match=message):
        Worker(db, queues=queues)


async def test_the_digest_tells_priority_and_queue_apart(db: StateDB) -> None:
    # At their defaults they are left out: runs submitted before them still match.
    assert digest(app()) == digest(app(priority=0, queue="default"))
    assert len({digest(app()), digest(app(priority=1)), digest(app(queue="x"))}) == 3
    first = await submit_task(db, app(priority=2, idempotency_key="k"))
    assert await submit_task(db, app(priority=2, idempotency_key="k")) == first
    with pytest.raises(IdempotencyConflict):
        await submit_task(db, app(priority=3, idempotency_key="k"))
    with pytest.raises(IdempotencyConflict):
        await submit_task(db, app(priority=2, queue="other", idempotency_key="k"))


# ----------------------------------------------------------------- carried along


async def test_retry_keeps_priority_and_queue(db: StateDB) -> None:
    original = await put(db, 1, priority=7, queue="ops")
    assert await cancel_task(db, original, actor=OPERATOR, now=T0 + 2)
    again = await retry_run(db, original, now=T0 + 3)
    row = await get_run(db, again)
    assert (row["priority"], row["queue"], row["status"]) == (7, "ops", "queued")
    assert await claim(db) == []
    assert await claim(db, queues=["ops"]) == [again]


async def test_schedules_fire_runs_with_their_priority_and_queue(db: StateDB) -> None:
    await add_schedule(db, "nightly", every="5m", application=app(priority=-4, queue="batch"),
                       now=T0)
    await add_schedule(db, "plain", every="5m", application=app(), now=T0)
    fired = (await fire_due(db, now=T0 + 300)).fired
    rows = [await get_run(db, rid) for rid in fired]
    assert sorted((r["priority"], r["queue"]) for r in rows) == [(-4, "batch"), (0, "default")]


async def test_read_models_show_and_filter_by_queue(db: StateDB) -> None:
    ops = await put(db, 1, queue="ops", priority=3)
    await put(db, 2)
    page = await list_runs(db, queues=["ops"])
    assert [(r["id"], r["priority"], r["queue"]) for r in page.runs] == [(ops, 3, "ops")]
    assert page.total == 1
    cursor_page = await page_runs(db, queues=["ops", "none"])
    assert [r["id"] for r in cursor_page.items] == [ops]


async def test_a_worker_serving_one_queue_runs_only_its_runs(db: StateDB,
                                                            tmp_path: Path) -> None:
    def command(queue: str) -> TaskApplication:
        return TaskApplication("command", {"argv": [PY, "-c", "pass"]}, "host", queue=queue)

    mine = [await submit_task(db, command("a")) for _ in range(3)]
    theirs = await submit_task(db, command("b"))
    worker = Worker(db, handle_signals=False, lock_dir=tmp_path / "locks", queues=["a"],
                    poll_interval=0.05)
    service = asyncio.create_task(worker.run())
    try:
        assert set((await wait_for_runs(db, mine, timeout=60)).values()) == {"completed"}
    finally:
        await worker.stop()
        await service
    assert (await get_run(db, theirs))["status"] == "queued"
    assert (await verify(db)).ok


# ----------------------------------------------------------------- the command


def submit(db: str, *args: str) -> str:
    return ok("submit", "--db", db, *args).stdout.strip()


def test_cli_submit_ls_show_and_a_worker_per_queue(db_target: str, tmp_path: Path) -> None:
    import json

    db = db_target
    low = submit(db, "--queue", "ops", "command", "--", PY, "-c", "pass")
    high = submit(db, "--queue", "ops", "--priority", "9", "command", "--", PY, "-c", "pass")
    other = submit(db, "--queue", "other", "command", "--", "true")
    plain = submit(db, "agent")
    shown = json.loads(ok("show", high, "--db", db, "--json").stdout)["run"]
    assert (shown["priority"], shown["queue"]) == (9, "ops")
    text = ok("show", high, "--db", db).stdout
    assert "priority" in text and "ops" in text
    listed = json.loads(ok("ls", "--queue", "ops", "--db", db, "--json").stdout)
    assert {(r["id"], r["priority"]) for r in listed["runs"]} == {(low, 0), (high, 9)}
    assert "queue" in listed["columns"] and "priority" in listed["columns"]
    both = json.loads(ok("ls", "--queue", "ops", "--queue", "other", "--db", db,
                         "--json").stdout)
    assert {r["id"] for r in both["runs"]} == {low, high, other}
    table = ok("ls", "--db", db).stdout
    assert "QUEUE" in table and "other" in table

    before = json.loads(ok("ls", "--db", db, "--json").stdout)["total"]
    for args, fragment in ((["--priority", "5000"], "priority must be from -1000 to 1000"),
                           (["--queue", "bad name"], "is not a queue name"),
                           (["--queue", ""], "queue must not be empty")):
        line = one_error_line(cli("submit", "--db", db, *args, "agent"), 2)
        assert fragment in line, line
    assert "is not a queue name" in one_error_line(
        cli("ls", "--queue", "no way", "--db", db), 2)
    assert "is not a queue name" in one_error_line(
        cli("worker", "--queue", "no way", "--db", db), 2)
    assert json.loads(ok("ls", "--db", db, "--json").stdout)["total"] == before

    # One run at a time, from ops only: the higher priority first, nothing from other.
    res = cli("worker", "--db", db, "--queue", "ops", "--capacity", "1", "--poll-interval",
              "0.05", "--lock-dir", str(tmp_path / "locks"), "--max-tasks", "2", "--quiet",
              "--no-scheduler", timeout=120)
    assert res.returncode == 0, res.stderr

    async def check() -> None:
        async with StateDB(db) as handle:
            rows = {r: await get_run(handle, r) for r in (low, high, other, plain)}
            assert {r: row["status"] for r, row in rows.items()} == {
                low: "completed", high: "completed", other: "queued", plain: "queued"}
            started = {r: next(f["created_at"] for f in await run_history(handle, r)
                               if f["status"] == "running") for r in (low, high)}
            assert started[high] < started[low]
            assert (await verify(handle)).ok

    asyncio.run(check())


def test_cli_schedule_add_carries_priority_and_queue(db_target: str) -> None:
    import json

    db = db_target
    ok("schedule", "add", "nightly", "--every", "5m", "--priority", "4", "--queue", "batch",
       "--db", db, "--", "true")
    shown = json.loads(ok("schedule", "show", "nightly", "--db", db, "--json").stdout)
    assert "'priority': 4" in repr(shown) and "'queue': 'batch'" in repr(shown), shown
    line = one_error_line(cli("schedule", "add", "bad", "--every", "5m", "--queue", "a b",
                              "--db", db, "--", "true"), 2)
    assert "is not a queue name" in line


async def test_specs_without_the_columns_claim_in_age_order(tmp_path: Path) -> None:
    """A custom spec directory from before priorities and queues keeps working."""
    from evolution_support import SpecDir
    from ledgerq.lifecycle.registry import load_registry

    specs = SpecDir(tmp_path / "specs")
    specs.replace('priority = { type = "integer", not_null = true, default = 0 }\n', "")
    specs.replace('queue = { type = "text", not_null = true, default = "default" }\n', "")
    specs.replace('name = "idx_schedule_runs_claim_order"\ncolumns = ["queue", "priority", '
                  '"queued_at", "id"]\ndescending = ["priority"]\n',
                  'name = "idx_schedule_runs_claim_order"\ncolumns = ["queued_at", "id"]\n')
    async with StateDB(str(tmp_path / "old.db"), registry=load_registry(specs.path)) as db:
        assert "queue" not in db.registry.entity("schedule_run").columns
        first = await put(db, 1)
        second = await put(db, 2)
        for fields in ({"priority": 1}, {"queue": "x"}):
            with pytest.raises(InvalidInput, match="the loaded specs declare no"):
                await submit_task(db, app(**fields))
        assert await claim(db, queues=["x"]) == []
        assert await claim(db, limit=1) == [first]
        assert await claim(db) == [second]
        page = await list_runs(db)
        assert page.total == 2 and "queue" not in page.runs[0]
