"""The task face on both backends: declare, defer, run, get the result or the failure."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import time
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pydantic
import pytest

from ledgerq import App, Fail, Retry, RetryPolicy, TaskFailed
from ledgerq.codec import loads
from ledgerq.errors import InvalidInput
from ledgerq.projections import history, verify
from ledgerq.queue import TaskApplication, get_run, list_runs, queue_stats, submit_task
from ledgerq.queue.reads import worker_statuses
from ledgerq.tasks.bridge import SyncCallInEventLoop


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


@dataclasses.dataclass
class Box:
    width: int
    height: int


class Order(pydantic.BaseModel):
    id: uuid.UUID
    total: Decimal


def make_app(target: str) -> App:
    app = App(target)
    calls: list[Any] = []
    app.calls = calls  # type: ignore[attr-defined]

    @app.task
    def resize(path: str, width: int) -> str:
        return f"{path}@{width}"

    @app.task(name="typed.echo")
    async def echo(when: datetime, day: date, key: uuid.UUID, amount: Decimal, size: Size,
                   box: Box, order: Order, note: str | None = None) -> dict[str, Any]:
        calls.append((when, day, key, amount, size, box, order, note))
        return {"box": box, "size": size, "amount": amount}

    @app.task(name="flaky", retry=RetryPolicy(3, 10.0))
    def flaky(fail_times: int) -> int:
        calls.append("flaky")
        if calls.count("flaky") <= fail_times:
            raise OSError("try again")
        return calls.count("flaky")

    @app.task(name="never", retry=RetryPolicy(5, 1.0), no_retry_on=(KeyError,))
    def never() -> None:
        calls.append("never")
        raise KeyError("missing")

    @app.task(name="gives.up", retry=5)
    def gives_up() -> None:
        calls.append("gives.up")
        raise Fail("not worth it")

    @app.task(name="asks.retry", retry=RetryPolicy(2, 1000.0))
    def asks_retry() -> str:
        calls.append("asks.retry")
        if calls.count("asks.retry") == 1:
            raise Retry(delay=5)
        return "second time"

    @app.task(name="big", max_result_bytes=100)
    def big() -> str:
        return "x" * 1000

    return app


async def test_defer_drain_result(db_target: str) -> None:
    app = make_app(db_target)
    resize = app.tasks["test_app.make_app.resize"]
    async with app:
        run = await resize.defer_async(path="a.png", width=100)
        assert await run.status() == "queued"
        row = await get_run(app.db, run.id)
        assert row["action_kind"] == resize.name and row["execution_target"] == "host"
        assert await app.drain() == 1
        assert await run.result(timeout=5) == "a.png@100"
        row = await get_run(app.db, run.id)
        assert row["status"] == "completed" and row["result"] == "a.png@100"
        facts = await history(app.db, "schedule_run", run.id)
        # The value rides on the terminal fact too: the log alone rebuilds the row.
        assert facts[-1]["status"] == "completed"
        # (a JSON column's value is JSON text in a fact's patch, as the row stores it)
        assert loads(loads(facts[-1]["patch"])["result"]) == "a.png@100"
        assert (await verify(app.db)).ok


async def test_arguments_round_trip_as_their_types(db_target: str) -> None:
    app = make_app(db_target)
    echo = app.tasks["typed.echo"]
    when = datetime(2026, 12, 6, 12, 30, tzinfo=UTC)
    key = uuid.uuid4()
    order = Order(id=uuid.uuid4(), total=Decimal("12.50"))
    async with app:
        run = await echo.defer_async(when=when, day=date(2026, 1, 2), key=key,
                                     amount=Decimal("1.10"), size=Size.LARGE,
                                     box=Box(3, 4), order=order)
        await app.drain()
        assert await run.result() == {"box": {"width": 3, "height": 4}, "size": "l",
                                      "amount": "1.10"}
    (got,) = app.calls  # type: ignore[attr-defined]
    assert got == (when, date(2026, 1, 2), key, Decimal("1.10"), Size.LARGE, Box(3, 4),
                   order, None)
    assert isinstance(got[6], Order) and isinstance(got[5], Box)


async def test_bad_arguments_are_refused_before_any_write(db_target: str) -> None:
    app = make_app(db_target)
    resize = next(t for n, t in app.tasks.items() if n.endswith("resize"))
    async with app:
        with pytest.raises(InvalidInput, match="'width'"):
            await resize.defer_async(path="a.png", width="100")
        with pytest.raises(InvalidInput, match="missing a required argument: 'width'"):
            await resize.defer_async(path="a.png")
        with pytest.raises(InvalidInput, match="unexpected keyword argument 'height'"):
            await resize.defer_async(path="a.png", width=1, height=2)
        assert (await list_runs(app.db)).total == 0


async def test_failures_retries_and_their_records(db_target: str) -> None:
    app = make_app(db_target)
    t = app.tasks
    async with app:
        flaky = await t["flaky"].defer_async(fail_times=2)
        never = await t["never"].defer_async()
        gives_up = await t["gives.up"].defer_async()
        asks = await t["asks.retry"].defer_async()
        big = await t["big"].defer_async()
        # Backoffs of 10 s and a Retry(delay=5): the drain moves the clock through them.
        await app.drain(advance_clock=True)
        assert await flaky.result() == 3
        assert await asks.result() == "second time"
        with pytest.raises(TaskFailed) as failed:
            await never.result()
        assert failed.value.status == "failed" and failed.value.error_type == "KeyError"
        assert "raise KeyError" in (failed.value.traceback or "")
        with pytest.raises(TaskFailed, match="not worth it") as fail:
            await gives_up.result()
        assert fail.value.error_type == "ledgerq.tasks.control.Fail"
        with pytest.raises(TaskFailed, match="the limit is 100"):
            await big.result()
        assert (await get_run(app.db, big.id))["result"] is None
        assert (await verify(app.db)).ok
    calls = app.calls  # type: ignore[attr-defined]
    # no_retry_on and Fail end the run at once, whatever the policy allows.
    assert calls.count("flaky") == 3 and calls.count("never") == 1
    assert calls.count("gives.up") == 1 and calls.count("asks.retry") == 2


async def test_retry_asked_by_a_task_without_a_policy_fails_saying_why(tmp_path: Any) -> None:
    app = App(str(tmp_path / "r.db"))

    @app.task(name="wants.retry")
    def wants_retry() -> None:
        raise Retry()

    async with app:
        run = await wants_retry.defer_async()
        await app.drain()
        with pytest.raises(TaskFailed, match="no retry policy"):
            await run.result()


async def test_arguments_that_no_longer_decode_fail_without_retrying(db_target: str) -> None:
    old = App(db_target)

    @old.task(name="shape", retry=5)
    def shape_v1(width: int) -> int:
        return width

    async with old:
        run = await shape_v1.defer_async(width=3)
    new = App(db_target)

    @new.task(name="shape", retry=5)
    def shape_v2(width: int, height: int) -> int:  # a parameter added since the defer
        return width * height

    async with new:
        # One attempt of five: no retry can decode them.
        assert await new.drain(advance_clock=True) == 1
        row = await get_run(new.db, run.id)
        assert row["status"] == "failed" and row["run_attempts"] == 1
        assert "'height'" in row["error_detail"] and row["error"]["type"].endswith("InvalidInput")


async def test_configure_sets_one_defers_options(tmp_path: Any) -> None:
    app = make_app(str(tmp_path / "c.db"))
    resize = next(t for n, t in app.tasks.items() if n.endswith("resize"))
    async with app:
        at = time.time() + 30
        run = await resize.configure(at=at, priority=5, queue="bulk",
                                     idempotency_key="k-1").defer_async(path="b", width=5)
        again = await resize.configure(idempotency_key="k-1", at=at, priority=5,
                                       queue="bulk").defer_async(path="b", width=5)
        assert again.id == run.id
        later = await resize.configure(delay=60).defer_async(path="c", width=6)
        assert (await get_run(app.db, later.id))["not_before"] >= at
        row = await get_run(app.db, run.id)
        assert (row["status"], row["priority"], row["queue"]) == ("delayed", 5, "bulk")
        assert await app.drain() == 0  # not due yet
        assert await app.drain(advance_clock=True) == 2
        assert await run.result() == "b@5" and await later.result() == "c@6"


async def test_a_worker_claims_only_kinds_it_has_code_for(db_target: str) -> None:
    from ledgerq.queue import Worker

    app = make_app(db_target)
    resize = next(t for n, t in app.tasks.items() if n.endswith("resize"))
    async with app:
        run = await resize.defer_async(path="p", width=1)
        # A worker without the app's code leaves the run queued, its attempts untouched.
        plain = Worker(app.db, poll_interval=0.02, lock_dir=None)
        going = asyncio.create_task(plain.run())
        await asyncio.sleep(0.3)
        await plain.stop()
        await going
        row = await get_run(app.db, run.id)
        assert row["status"] == "queued" and row["lease_attempts"] == 0
        # Operators see why: the kind no live worker serves, and what each one serves.
        assert (await queue_stats(app.db)).unserved_kinds == [resize.name]
        (status,) = await worker_statuses(app.db)
        assert status.kinds is not None and "command" in status.kinds
        assert resize.name not in status.kinds
        worker = app.worker(capacity=2, poll_interval=0.02, lock_dir=None)
        going = asyncio.create_task(worker.run())
        try:
            assert await run.result(timeout=10) == "p@1"
        finally:
            await worker.stop()
            await going


async def test_the_record_vocabulary_still_holds_and_tasks_join_it(tmp_path: Any) -> None:
    app = make_app(str(tmp_path / "v.db"))
    async with app:
        with pytest.raises(InvalidInput, match=r"unknown action_kind 'typed\.ech'"):
            await submit_task(app.db, TaskApplication("typed.ech", {}))
        # Recorded when the app opened: checked against its parameters without the code.
        with pytest.raises(InvalidInput, match="missing argument 'when'"):
            await submit_task(app.db, TaskApplication("typed.echo", {}))
        run_id = await submit_task(app.db, TaskApplication("typed.echo", {}),
                                   vocabulary=app.vocabulary)
        assert (await get_run(app.db, run_id))["execution_target"] == "host"
    with pytest.raises(InvalidInput, match="ADR-0071"):
        app.task(name="command")(lambda: None)
    with pytest.raises(InvalidInput, match="declared twice"):
        app.task(name="flaky")(lambda: None)
    with pytest.raises(InvalidInput, match="unknown target 'mars'"):
        app.task(name="far", target="mars")(lambda: None)


def test_sync_defer_result_and_drain_from_threads(tmp_path: Any) -> None:
    import threading

    app = make_app(str(tmp_path / "sync.db"))
    resize = next(t for n, t in app.tasks.items() if n.endswith("resize"))
    runs: list[Any] = []
    lock = threading.Lock()

    def view(i: int) -> None:  # what a Django view does: defer and return
        run = resize.defer(path=f"f{i}", width=i)
        with lock:
            runs.append((i, run))

    threads = [threading.Thread(target=view, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert app.drain_sync() == 16
        for i, run in runs:
            assert run.result(timeout=5) == f"f{i}@{i}"
            assert run.status() == "completed"
    finally:
        app.close_sync()


async def test_a_sync_call_inside_a_running_loop_names_the_async_form(tmp_path: Any) -> None:
    app = make_app(str(tmp_path / "loop.db"))
    resize = next(t for n, t in app.tasks.items() if n.endswith("resize"))
    with pytest.raises(SyncCallInEventLoop, match="await"):
        resize.defer(path="x", width=1)
    app.close_sync()


async def test_memory_database_in_test_mode() -> None:
    app = App(":memory:")

    @app.task(name="fan.out")
    async def fan_out(n: int) -> int:
        for i in range(n):
            await leaf.defer_async(i=i)
        return n

    @app.task(name="fan.leaf")
    def leaf(i: int) -> int:
        return i * i

    async with app:
        run = await fan_out.defer_async(n=5)
        # Tasks deferred by tasks run in the same drain.
        assert await app.drain() == 6
        assert await run.result() == 5
        assert (await list_runs(app.db, statuses=["completed"])).total == 6


async def test_each_run_is_logged_and_a_loop_blocking_task_is_named(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    app = App(str(tmp_path / "log.db"))

    @app.task(name="log.ok")
    def ok() -> int:
        return 1

    @app.task(name="log.boom")
    def boom() -> None:
        raise RuntimeError("kaboom")

    @app.task(name="log.blocks")
    async def blocks() -> None:
        time.sleep(0.4)  # a blocking call in async code: it holds the worker's loop

    caplog.set_level(logging.INFO, logger="ledgerq.worker")
    async with app:
        for task in (ok, boom, blocks):
            await task.defer_async()
        await app.drain()
    lines = [r.getMessage() for r in caplog.records if r.name == "ledgerq.worker"]
    assert any("start task=log.ok queue=default attempt=1" in line for line in lines)
    assert any("end task=log.ok" in line and "outcome=completed" in line for line in lines)
    failed = next(r for r in caplog.records if "end task=log.boom" in r.getMessage())
    assert failed.levelname == "WARNING" and 'raise RuntimeError("kaboom")' in failed.getMessage()
    blocked = next(r for r in caplog.records if "blocked the event loop" in r.getMessage())
    assert "log.blocks" in blocked.getMessage() and blocked.levelname == "WARNING"


async def test_a_timeout_records_what_really_happened(tmp_path: Any) -> None:
    app = App(str(tmp_path / "timeouts.db"))
    returned: list[str] = []

    @app.task(name="slow.sync", timeout=0.3)
    def slow_sync() -> None:
        time.sleep(1.0)  # no thread can be stopped: this one runs to its end
        returned.append("thread")

    @app.task(name="slow.async", timeout=0.3)
    async def slow_async() -> None:
        await asyncio.sleep(30)

    async with app:
        in_thread = await slow_sync.defer_async()
        on_loop = await slow_async.defer_async()
        await app.drain()
        # The drain's slot for the thread stayed taken until the thread returned.
        assert returned == ["thread"]
        thread_row = await get_run(app.db, in_thread.id)
        loop_row = await get_run(app.db, on_loop.id)
    assert thread_row["status"] == loop_row["status"] == "timed_out"
    assert "the thread could not be stopped" in thread_row["error_detail"]
    assert loop_row["error_detail"] == "timed out after 0.3s; cancelled"


async def test_hooks_see_each_run_start_and_end(tmp_path: Any,
                                                caplog: pytest.LogCaptureFixture) -> None:
    app = App(str(tmp_path / "hooks.db"))
    seen: list[tuple[str, Any]] = []

    @app.task(name="hooked.ok")
    def ok(n: int) -> int:
        return n + 1

    @app.task(name="hooked.bad")
    async def bad() -> None:
        raise ValueError("nope")

    @app.on_started
    def started(run: dict[str, Any]) -> None:
        seen.append(("started", run["action_kind"]))

    @app.on_succeeded
    async def succeeded(run: dict[str, Any], value: Any) -> None:
        seen.append(("succeeded", value))

    @app.on_failed
    def failed(run: dict[str, Any], exc: BaseException) -> None:
        seen.append(("failed", type(exc).__name__))

    @app.on_started
    def broken(run: dict[str, Any]) -> None:
        raise RuntimeError("a broken hook")

    async with app:
        ran = await ok.defer_async(n=1)
        await app.drain()
        await bad.defer_async()
        await app.drain()
        assert await ran.result() == 2  # the broken hook changed nothing
    assert seen == [("started", "hooked.ok"), ("succeeded", 2),
                    ("started", "hooked.bad"), ("failed", "ValueError")]
    assert any("a broken hook" in r.getMessage() or r.exc_info for r in caplog.records)


async def test_a_library_worker_serves_its_metrics(tmp_path: Any) -> None:
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = make_app(str(tmp_path / "metrics.db"))
    async with app:
        worker = app.worker(capacity=2, poll_interval=0.02, lock_dir=None, metrics_port=port)
        going = asyncio.create_task(worker.run())
        try:
            for _ in range(100):
                try:
                    body = await asyncio.to_thread(
                        lambda: urllib.request.urlopen(
                            f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
                    break
                except OSError:
                    await asyncio.sleep(0.05)
            assert "ledgerq_runs{" in body
            assert "# TYPE ledgerq_run_duration_seconds histogram" in body
        finally:
            await worker.stop()
            await going


async def test_defers_in_a_transaction_commit_together_or_not_at_all(db_target: str) -> None:
    from ledgerq.errors import IdempotencyConflict
    from ledgerq.lifecycle.transactions import NotCommitted

    app = make_app(db_target)
    resize = app.tasks["test_app.make_app.resize"]
    async with app:
        async with app.transaction() as tx:
            a = await resize.defer_async(path="a", width=1, tx=tx)
            b = await resize.defer_async(path="b", width=2, tx=tx)
            with pytest.raises(NotCommitted):
                _ = a.id
            assert (await list_runs(app.db)).total == 0  # queued, not written
        assert len({a.id, b.id}) == 2 and (await list_runs(app.db)).total == 2
        # A block that raises writes nothing.
        with pytest.raises(RuntimeError, match="the caller's own failure"):
            async with app.transaction() as tx:
                await resize.defer_async(path="c", width=3, tx=tx)
                raise RuntimeError("the caller's own failure")
        # A write that fails at the commit takes the block's other writes with it.
        await resize.configure(idempotency_key="k").defer_async(path="x", width=1)
        with pytest.raises(IdempotencyConflict):
            async with app.transaction() as tx:
                await resize.defer_async(path="d", width=4, tx=tx)
                await resize.configure(idempotency_key="k").defer_async(
                    path="y", width=2, tx=tx)
        # Bad arguments are refused at the call, inside the block, as anywhere.
        async with app.transaction() as tx:
            with pytest.raises(InvalidInput, match="'width'"):
                await resize.defer_async(path="e", width="5", tx=tx)
        assert (await list_runs(app.db)).total == 3
        assert await app.drain() == 3
        assert await a.result() == "a@1" and await b.result() == "b@2"


def test_a_task_parameter_may_not_be_named_tx() -> None:
    app = App(":memory:")
    with pytest.raises(InvalidInput, match="'tx'"):
        app.task(name="t")(lambda tx: None)


async def test_a_workers_metrics_have_run_durations_by_queue_and_task(tmp_path: Any) -> None:
    from prometheus_client import generate_latest

    from ledgerq.queue.worker import durations

    app = make_app(str(tmp_path / "durations.db"))
    resize = app.tasks["test_app.make_app.resize"]
    async with app:
        await resize.configure(queue="images").defer_async(path="p", width=1)
        await app.drain()
    text = generate_latest(durations.REGISTRY).decode()
    assert ('ledgerq_run_duration_seconds_count{outcome="completed",queue="images",'
            'task="test_app.make_app.resize"}') in text
