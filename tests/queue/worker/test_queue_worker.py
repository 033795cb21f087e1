"""Worker functions: heartbeat, reap, claim and execute under leases.

Times are explicit (``now=``) so lease arithmetic is exact; executors are in-process
callables except where the launcher itself is under test (test_queue_launcher.py).
"""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from helpers.raw import raw
from helpers.trace import count_write_locks
from ledgerq import StateDB
from ledgerq.codec import loads
from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, transition
from ledgerq.lifecycle.engine import VOCABULARY_ERROR, create_entity
from ledgerq.projections import history, verify
from ledgerq.queue import (
    DEFAULT_HEARTBEAT_TTL_SECONDS,
    DEFAULT_LEASE_TTL_SECONDS,
    MAX_LEASE_ATTEMPTS,
    TaskApplication,
    cancel_task,
    claim_and_execute,
    reap_expired_leases,
    record_scheduled_fire,
    register_heartbeat,
    submit_many,
    submit_task,
    worker_tick,
)
from ledgerq.queue import runs as runs_mod
from ledgerq.queue.worker import claim as claim_mod
from ledgerq.queue.worker import config as config_mod
from ledgerq.queue.worker import outcomes as outcomes_mod
from ledgerq.queue.worker.functions import Executors, RunContext, claim_runs, execute_claimed
from ledgerq.store.sqltx import SqlTx

NOW = 10_000.0
HOST = "node-a"
GPU = "gpu-exclusive"
WARM = "warmed-cache"
OPERATOR = Actor(type="operator", id="alice")

Execute = Callable[[dict[str, Any]], Awaitable[tuple[int, str]]]


@pytest.fixture
async def qdb(db_target: str) -> AsyncIterator[StateDB]:
    async with StateDB(db_target) as handle:
        yield handle


def app(**kw: Any) -> TaskApplication:
    fields: dict[str, Any] = {"action_kind": "agent", "args": {}, "execution_target": "host"}
    fields.update(kw)
    return TaskApplication(**fields)


async def submit(db: StateDB, now: float = NOW, host: str = HOST, **kw: Any) -> str:
    return await submit_task(db, app(**kw), now=now, host=host)


async def get_row(db: StateDB, run_id: str) -> dict[str, Any]:
    row = await db.fetch_one("SELECT * FROM schedule_runs WHERE id = ?", (run_id,))
    assert row is not None, run_id
    return row


async def fact_count(db: StateDB) -> int:
    got = await db.fetch_one("SELECT count(*) AS n FROM status_transitions")
    assert got is not None
    return int(got["n"])


async def moves(db: StateDB, run_id: str) -> list[tuple[str | None, str, str]]:
    return [(f["previous_status"], f["status"], f["reason_code"])
            for f in await history(db, "schedule_run", run_id)]


def returning(code: int, detail: str = "", seen: list[str] | None = None) -> Execute:
    async def execute(run: dict[str, Any]) -> tuple[int, str]:
        if seen is not None:
            seen.append(run["id"])
        return code, detail

    return execute


async def ok(run: dict[str, Any]) -> tuple[int, str]:
    return 0, ""


async def insert_raw_run(db: StateDB, **values: Any) -> str:
    """A run created straight through the engine (so it has its creation fact)."""
    policy = db.registry.entity("schedule_run")
    row: dict[str, Any] = {"status": "queued", "trigger_context": {}, "action_kind": "agent",
                           "action_args": {}, "fired_at": NOW, "created_at": NOW,
                           "queued_at": NOW}
    row.update(values)

    def unit(conn: sqlite3.Connection) -> str:
        if row.get("schedule_id"):
            conn.ensure_schedule(row["schedule_id"], "nightly", NOW)
        return create_entity(conn, policy, row, reason=StateReason(code="run.queued.submitted"),
                             actor=Actor(type="system", id="test"), now=NOW)

    return await db.write(unit)


def raw_update(db: StateDB, sql: str, params: tuple[Any, ...]) -> None:
    """A write from outside ledgerq, as an operator with a database shell would do it."""
    conn = raw(db.path)
    try:
        conn.execute(sql, params)
        if not conn.postgres:
            conn.conn.commit()
    finally:
        conn.close()


# ----------------------------------------------------------------- constants and signatures


def test_record_constants_and_defaults() -> None:
    assert DEFAULT_LEASE_TTL_SECONDS == 300.0
    assert DEFAULT_HEARTBEAT_TTL_SECONDS == 90.0
    assert MAX_LEASE_ATTEMPTS == 3
    assert (claim_mod.PAGE_SIZE, claim_mod.SCAN_CAP, config_mod.DEFAULT_CLAIM_LIMIT) == \
        (50, 5000, 20)
    params = inspect.signature(claim_and_execute).parameters
    assert params["lease_ttl"].default == 300.0
    assert params["limit"].default == 20
    assert params["heartbeat_ttl"].default == 90.0
    assert params["execute"].default is None
    for name in ("worker_id", "execute", "now", "lease_ttl", "limit",
                 "advertised_capabilities", "execution_targets", "heartbeat_ttl"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY, name


# ----------------------------------------------------------------- heartbeat


async def test_register_heartbeat_upserts(qdb: StateDB) -> None:
    await register_heartbeat(qdb, worker_id="w1", advertised_capabilities=["a"],
                             execution_targets=["host"], now=NOW)
    await register_heartbeat(qdb, worker_id="w1", advertised_capabilities=["a", GPU],
                             execution_targets=["host", "process"], now=NOW + 30)
    await register_heartbeat(qdb, worker_id="w2", now=NOW + 31)
    rows = await qdb.fetch_all("SELECT * FROM workers ORDER BY worker_id")
    assert [r["worker_id"] for r in rows] == ["w1", "w2"]
    w1, w2 = rows
    assert loads(w1["advertised_capabilities"]) == ["a", GPU]
    assert loads(w1["execution_targets"]) == ["host", "process"]
    assert w1["last_heartbeat_at"] == NOW + 30
    assert loads(w2["advertised_capabilities"]) == [] and loads(w2["execution_targets"]) == []


async def test_stale_heartbeat_claims_nothing(qdb: StateDB) -> None:
    rid = await submit(qdb)
    await register_heartbeat(qdb, worker_id="w1", now=NOW)
    stale = await claim_runs(qdb, worker_id="w1", now=NOW + 90.5)
    assert stale.claimed == [] and stale.scanned == 0
    assert await claim_and_execute(qdb, worker_id="w1", execute=ok, now=NOW + 91) == 0
    assert (await get_row(qdb, rid))["status"] == "queued"
    # a custom ttl is honoured both ways
    assert (await claim_runs(qdb, worker_id="w1", now=NOW + 5, heartbeat_ttl=4)).claimed == []
    # an age of exactly the ttl does not exceed it
    fresh = await claim_runs(qdb, worker_id="w1", now=NOW + 90)
    assert [r["id"] for r in fresh.claimed] == [rid]


async def test_unknown_worker_is_not_stale(qdb: StateDB) -> None:
    rid = await submit(qdb)
    got = await claim_runs(qdb, worker_id="never-heartbeated", now=NOW + 1_000_000)
    assert [r["id"] for r in got.claimed] == [rid]


async def test_worker_tick_heartbeats_before_claiming(qdb: StateDB) -> None:
    rid = await submit(qdb)
    await register_heartbeat(qdb, worker_id="w1", now=NOW - 10_000)
    got = await worker_tick(qdb, worker_id="w1", execute=ok, now=NOW)
    assert got == {"requeued": 0, "failed": 0, "claimed": 1}
    hb = await qdb.fetch_one("SELECT last_heartbeat_at FROM workers WHERE worker_id = 'w1'")
    assert hb == {"last_heartbeat_at": NOW}
    assert (await get_row(qdb, rid))["status"] == "completed"


# ----------------------------------------------------------------- what is claimable


async def test_claim_sets_the_lease_in_one_guarded_move(qdb: StateDB) -> None:
    rid = await submit(qdb)
    got = await claim_runs(qdb, worker_id="w1", now=NOW, lease_ttl=42.5)
    assert [r["id"] for r in got.claimed] == [rid]
    row = await get_row(qdb, rid)
    assert row["status"] == "running"
    assert row["leased_by"] == "w1"
    assert row["lease_expires_at"] == NOW + 42.5
    assert row["lease_attempts"] == 1
    assert got.claimed[0]["lease_expires_at"] == NOW + 42.5
    facts = await history(qdb, "schedule_run", rid)
    assert len(facts) == 2
    claim = facts[-1]
    assert (claim["previous_status"], claim["status"], claim["reason_code"]) == \
        ("queued", "running", "run.started.ok")
    assert claim["actor"] == "w1"
    assert claim["created_at"] == NOW
    patch = loads(claim["patch"])
    assert (patch["leased_by"], patch["lease_expires_at"], patch["lease_attempts"]) == \
        ("w1", NOW + 42.5, 1)
    assert (await verify(qdb)).ok


async def test_scheduled_fires_are_never_leased(qdb: StateDB) -> None:
    fires = [await record_scheduled_fire(qdb, schedule_id="nightly", action_kind="agent",
                                         args={}, status=status, now=NOW)
             for status in ("running", "skipped", "failed")]
    # even a scheduled row sitting in queued (e.g. written by another component) is not ours
    queued_fire = await insert_raw_run(qdb, schedule_id="nightly")
    for i in range(3):
        got = await worker_tick(qdb, worker_id="w1", execute=ok, now=NOW + 1_000 * (i + 1))
        assert got == {"requeued": 0, "failed": 0, "claimed": 0}
    for rid, status in zip([*fires, queued_fire], ["running", "skipped", "failed", "queued"],
                           strict=True):
        row = await get_row(qdb, rid)
        assert row["schedule_id"] == "nightly"
        assert row["status"] == status
        assert row["leased_by"] is None and row["lease_attempts"] == 0
        assert len(await history(qdb, "schedule_run", rid)) == 1
    # the scheduler's own fire entered running through the guarded API, with a fact
    (fact,) = await history(qdb, "schedule_run", fires[0])
    assert (fact["previous_status"], fact["status"], fact["reason_code"]) == \
        (None, "running", "run.started.scheduled")
    assert (fact["source"], fact["actor"]) == ("scheduler", "nightly")


async def test_workflow_rows_are_never_leased_without_an_adapter(qdb: StateDB) -> None:
    rid = await submit(qdb, action_kind="workflow", args={"name": "wf"})
    for i in range(3):
        assert (await worker_tick(qdb, worker_id="w1", execute=ok, now=NOW + i))["claimed"] == 0
        assert (await claim_runs(qdb, worker_id="w1", now=NOW + i)).claimed == []
    row = await get_row(qdb, rid)
    assert (row["status"], row["leased_by"], row["lease_attempts"]) == ("queued", None, 0)
    seen: list[str] = []
    got = await worker_tick(qdb, worker_id="w1", now=NOW + 10,
                            adapters={"workflow": returning(0, seen=seen)})
    assert got["claimed"] == 1 and seen == [rid]
    assert (await get_row(qdb, rid))["status"] == "completed"


async def test_only_queued_rows_are_claimed(qdb: StateDB) -> None:
    blocker = await submit(qdb)
    waiting = await submit(qdb, depends_on=[blocker])
    cancelled = await submit(qdb)
    await cancel_task(qdb, cancelled, actor=OPERATOR, now=NOW)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 1)
    assert [r["id"] for r in got.claimed] == [blocker]
    assert (await get_row(qdb, waiting))["status"] == "waiting_dependency"
    assert (await get_row(qdb, cancelled))["leased_by"] is None


async def test_eligible_row_behind_120_ineligible_rows_is_claimed(qdb: StateDB) -> None:
    ineligible = ([app(required_capabilities=["cuda"])] * 40
                  + [app(execution_target="daytona")] * 40
                  + [app(action_kind="workflow")] * 40)
    await submit_many(qdb, ineligible, now=NOW, host=HOST)
    wanted = await submit(qdb, now=NOW + 1)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 2)
    assert [r["id"] for r in got.claimed] == [wanted]
    assert got.scanned >= 81


async def test_keyset_paging_does_not_skip_rows_with_equal_queued_at(qdb: StateDB) -> None:
    # One timestamp for all: only the id half of the (queued_at, id) cursor moves.
    apps = [app(required_capabilities=["cuda"])] * 150 + [app(args={"wanted": True})]
    ids = await submit_many(qdb, apps, now=NOW, host=HOST)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 1)
    assert [r["id"] for r in got.claimed] == [ids[-1]]
    assert got.scanned == 151


async def test_a_pass_scans_at_most_5000_rows(qdb: StateDB) -> None:
    cuda = app(required_capabilities=["cuda"])
    await submit_many(qdb, [cuda] * 4999, now=NOW, host=HOST)
    fifth_thousandth = await submit(qdb, now=NOW + 10)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 20)
    assert [r["id"] for r in got.claimed] == [fifth_thousandth]
    assert got.scanned == 5000
    # One more ineligible row ahead pushes the next eligible row to position 5001.
    await submit_task(qdb, cuda, now=NOW + 5, host=HOST)
    beyond = await submit(qdb, now=NOW + 30)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 40)
    assert got.claimed == []
    assert got.scanned == 5000
    assert (await get_row(qdb, beyond))["status"] == "queued"


async def test_a_pass_claims_at_most_limit_rows_oldest_first(qdb: StateDB) -> None:
    ids = [await submit(qdb, now=NOW + i) for i in range(30)]
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 100)
    assert [r["id"] for r in got.claimed] == ids[:20]
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 100, limit=3)
    assert [r["id"] for r in got.claimed] == ids[20:23]
    assert (await claim_runs(qdb, worker_id="w1", now=NOW + 100, limit=0)).claimed == []
    assert await claim_and_execute(qdb, worker_id="w1", execute=ok, now=NOW + 100,
                                   limit=5) == 5
    statuses = [(await get_row(qdb, rid))["status"] for rid in ids]
    assert statuses == ["running"] * 23 + ["completed"] * 5 + ["queued"] * 2


async def test_execution_target_filtering(qdb: StateDB) -> None:
    host = await submit(qdb, execution_target="host")
    day = await submit(qdb, execution_target="daytona", now=NOW + 1)
    proc = await submit(qdb, execution_target="process", now=NOW + 2)
    null_target = await insert_raw_run(qdb, queued_at=NOW + 3, execution_target=None)
    empty_target = await insert_raw_run(qdb, queued_at=NOW + 4, execution_target="",
                                        required_capabilities=[])
    # default target set is {"host"}; NULL and empty targets are claimable by any worker
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 10, limit=1)
    assert [r["id"] for r in got.claimed] == [host]
    got = await claim_runs(qdb, worker_id="w2", now=NOW + 10,
                           execution_targets=["process"])
    assert [r["id"] for r in got.claimed] == [proc, null_target, empty_target]
    got = await claim_runs(qdb, worker_id="w3", now=NOW + 10, execution_targets=["daytona"])
    assert [r["id"] for r in got.claimed] == [day]
    assert (await verify(qdb)).ok


async def test_capabilities_filter_eligibility(qdb: StateDB) -> None:
    cuda = await submit(qdb, required_capabilities=["cuda"])
    gpu = await submit(qdb, required_capabilities=[GPU], now=NOW + 1)
    warm = await submit(qdb, required_capabilities=[WARM], now=NOW + 2)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 10)
    assert [r["id"] for r in got.claimed] == [warm]  # affinity never filters
    got = await claim_runs(qdb, worker_id="w2", now=NOW + 10, advertised_capabilities=["cuda"])
    assert [r["id"] for r in got.claimed] == [cuda]
    got = await claim_runs(qdb, worker_id="w3", now=NOW + 10, advertised_capabilities=[GPU])
    assert [r["id"] for r in got.claimed] == [gpu]


async def test_affinity_reorders_before_the_limit_cut(qdb: StateDB) -> None:
    plain = [await submit(qdb, now=NOW + i) for i in range(25)]
    warm = await submit(qdb, required_capabilities=[WARM], now=NOW + 100)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 200, advertised_capabilities=[WARM])
    assert [r["id"] for r in got.claimed] == [warm, *plain[:19]]


async def test_affinity_ties_keep_oldest_first_order(qdb: StateDB) -> None:
    a = await submit(qdb, now=NOW + 1, required_capabilities=[WARM, "x"])
    b = await submit(qdb, now=NOW + 2)
    c = await submit(qdb, now=NOW + 3, required_capabilities=[WARM])
    d = await submit(qdb, now=NOW + 4)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 10,
                           advertised_capabilities=[WARM, "x"])
    assert [r["id"] for r in got.claimed] == [a, c, b, d]


async def test_affinity_never_starves(qdb: StateDB) -> None:
    plain = await submit(qdb, now=NOW)
    warm = await submit(qdb, now=NOW + 1, required_capabilities=[WARM])
    # a worker without the affinity token still serves the affinity task
    got = await claim_runs(qdb, worker_id="cold", now=NOW + 10)
    assert [r["id"] for r in got.claimed] == [plain, warm]

    plain2 = await submit(qdb, now=NOW + 20)
    warm2 = await submit(qdb, now=NOW + 21, required_capabilities=[WARM])
    # a warm worker takes the preferred task first, then the plain one on its next pass
    first = await claim_runs(qdb, worker_id="warm", now=NOW + 30, limit=1,
                             advertised_capabilities=[WARM])
    second = await claim_runs(qdb, worker_id="warm", now=NOW + 31, limit=1,
                              advertised_capabilities=[WARM])
    assert [r["id"] for r in first.claimed + second.claimed] == [warm2, plain2]


# ----------------------------------------------------------------- serialization keys


async def test_one_serialization_key_per_pass(qdb: StateDB) -> None:
    gpus = [await submit(qdb, now=NOW + i, required_capabilities=[GPU]) for i in range(3)]
    plain = await submit(qdb, now=NOW + 10)
    other_host = await submit(qdb, now=NOW + 11, host="node-b", required_capabilities=[GPU])
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 20, advertised_capabilities=[GPU])
    assert [r["id"] for r in got.claimed] == [gpus[0], plain, other_host]
    # while that key runs, the next pass (of any worker) does not admit the others
    again = await claim_runs(qdb, worker_id="w2", now=NOW + 21, advertised_capabilities=[GPU])
    assert again.claimed == []
    running = await qdb.fetch_all(
        "SELECT concurrency_key, count(*) AS n FROM schedule_runs WHERE status = 'running' "
        "AND concurrency_key IS NOT NULL GROUP BY concurrency_key")
    assert sorted((r["concurrency_key"], r["n"]) for r in running) == [
        ("node-a:gpu-exclusive", 1), ("node-b:gpu-exclusive", 1)]


async def test_a_running_key_blocks_candidates_before_they_take_a_claim_slot(
        qdb: StateDB) -> None:
    first = await submit(qdb, now=NOW, required_capabilities=[GPU])
    await claim_runs(qdb, worker_id="w1", now=NOW + 1, advertised_capabilities=[GPU])
    blocked = await submit(qdb, now=NOW + 2, required_capabilities=[GPU])
    plain = await submit(qdb, now=NOW + 3)
    got = await claim_runs(qdb, worker_id="w2", now=NOW + 4, limit=1,
                           advertised_capabilities=[GPU])
    assert [r["id"] for r in got.claimed] == [plain]
    assert got.lost == 0  # the blocked row was never even attempted
    assert (await get_row(qdb, blocked))["status"] == "queued"
    assert (await get_row(qdb, first))["status"] == "running"


async def test_a_pass_reads_the_running_keys_only_when_a_candidate_has_one(
        qdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """The running keys are read in the pass's snapshot when the first keyed candidate is
    offered: a pass of plain runs never reads them (a statement, a round trip on
    PostgreSQL), and a keyed one still finds its key running and passes it over."""
    reads: list[int] = []
    real = SqlTx.list_running_keys

    def list_running_keys(self: SqlTx, policy: Any) -> set[str]:
        reads.append(1)
        return real(self, policy)

    monkeypatch.setattr(SqlTx, "list_running_keys", list_running_keys)
    plain = [await submit(qdb, now=NOW + i) for i in range(2)]
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 5, advertised_capabilities=[GPU])
    assert [r["id"] for r in got.claimed] == plain and reads == []
    first = await submit(qdb, now=NOW + 6, required_capabilities=[GPU])
    await claim_runs(qdb, worker_id="w1", now=NOW + 7, advertised_capabilities=[GPU])
    assert reads == [1]
    blocked = await submit(qdb, now=NOW + 8, required_capabilities=[GPU])
    another = await submit(qdb, now=NOW + 9, required_capabilities=[GPU])
    last = await submit(qdb, now=NOW + 10)
    got = await claim_runs(qdb, worker_id="w2", now=NOW + 11, advertised_capabilities=[GPU])
    assert [r["id"] for r in got.claimed] == [last] and reads == [1, 1]  # read once a pass
    assert {(await get_row(qdb, r))["status"] for r in (blocked, another)} == {"queued"}
    assert (await get_row(qdb, first))["status"] == "running"


async def test_pass_local_block_holds_even_after_the_first_run_finished(qdb: StateDB) -> None:
    g1 = await submit(qdb, now=NOW, required_capabilities=[GPU])
    g2 = await submit(qdb, now=NOW + 1, required_capabilities=[GPU])
    seen: list[str] = []
    got = await worker_tick(qdb, worker_id="w1", execute=returning(0, seen=seen),
                            now=NOW + 10, advertised_capabilities=[GPU])
    assert got["claimed"] == 1 and seen == [g1]
    assert (await get_row(qdb, g2))["status"] == "queued"
    got = await worker_tick(qdb, worker_id="w1", execute=returning(0, seen=seen),
                            now=NOW + 11, advertised_capabilities=[GPU])
    assert got["claimed"] == 1 and seen == [g1, g2]


async def test_serialization_keys_never_overlap_across_workers(db_target: str) -> None:
    path = db_target
    inflight: dict[str, int] = {}
    peak: dict[str, int] = {}

    async def execute(run: dict[str, Any]) -> tuple[int, str]:
        key = run["concurrency_key"] or f"free:{run['id']}"
        inflight[key] = inflight.get(key, 0) + 1
        peak[key] = max(peak.get(key, 0), inflight[key])
        await asyncio.sleep(0.01)
        inflight[key] -= 1
        return 0, ""

    async with StateDB(path) as one, StateDB(path) as two:
        apps = [app(required_capabilities=[GPU], args={"i": i}) for i in range(5)]
        apps += [app(args={"plain": i}) for i in range(5)]
        ids = await submit_many(one, apps, now=NOW, host=HOST)
        for _ in range(20):
            left = await one.fetch_one(
                "SELECT count(*) AS n FROM schedule_runs WHERE status != 'completed'")
            assert left is not None
            if left["n"] == 0:
                break
            await asyncio.gather(*(
                claim_and_execute(db, worker_id=wid, execute=execute,
                                  advertised_capabilities=[GPU])
                for db, wid in ((one, "w1"), (two, "w2"), (one, "w3"), (two, "w4"))))
        assert peak[f"{HOST}:gpu-exclusive"] == 1
        for rid in ids:
            row = await get_row(one, rid)
            assert (row["status"], row["lease_attempts"]) == ("completed", 1)
        assert (await verify(one)).ok


async def test_running_key_is_rechecked_inside_the_claim_transaction(
        qdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another worker starting the same key after this pass read its snapshot still blocks."""
    g1 = await submit(qdb, now=NOW, required_capabilities=[GPU])
    g2 = await submit(qdb, now=NOW + 1, required_capabilities=[GPU])
    key = f"{HOST}:gpu-exclusive"
    real_claim_one = claim_mod._claim_one
    raced: list[str] = []

    def other_worker_wins_first(conn: sqlite3.Connection, **kw: Any) -> Any:
        if not raced:
            raced.append(kw["cand"]["id"])
            other = {"id": g2, "concurrency_key": key, "lease_attempts": 0}
            assert real_claim_one(conn, **{**kw, "cand": other, "worker_id": "other"})
        return real_claim_one(conn, **kw)

    monkeypatch.setattr(claim_mod, "_claim_one", other_worker_wins_first)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 2, advertised_capabilities=[GPU])
    assert raced == [g1]
    assert got.claimed == [] and got.lost == 1
    running = await qdb.fetch_all(
        "SELECT id, leased_by FROM schedule_runs WHERE status = 'running'")
    assert running == [{"id": g2, "leased_by": "other"}]
    assert (await get_row(qdb, g1))["status"] == "queued"


async def test_a_pass_over_rows_it_cannot_serve_takes_no_write_lock(
        qdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker facing a deep backlog it cannot serve scans it without holding writers up.
    It reads its first page in the transaction it would have claimed in, which takes no
    lock until it writes, then the backlog from a snapshot; it writes nothing."""
    await submit_many(qdb, [TaskApplication("command", {"argv": ["true"]}, "host",
                                            required_capabilities=[GPU])] * 120)
    facts = (await qdb.fetch_one("SELECT count(*) AS n FROM status_transitions") or {})["n"]
    choices: list[tuple[int, int, bool]] = []
    real_select = claim_mod._select

    def select(*args: Any, **kw: Any) -> Any:
        chosen = real_select(*args, **kw)
        seen = args[10]  # (the pass's ClaimPass, as _select is called)
        choices.append((args[12], seen.scanned, seen.capped))
        return chosen

    monkeypatch.setattr(claim_mod, "_select", select)
    locks = await count_write_locks(qdb, monkeypatch)
    got = await claim_runs(qdb, worker_id="cpu-only", now=NOW + 10, limit=20)
    assert got.scanned == 120 and got.claimed == [] and not got.capped
    assert locks == [], locks
    page = 20 * (claim_mod.CLAIM_SPARES if qdb.many_writers else 1)  # (spares: at once)
    first_page = [(page, page, True)]
    assert choices == [*first_page, (claim_mod.SCAN_CAP, 120, False)], choices
    assert (await qdb.fetch_one("SELECT count(*) AS n FROM status_transitions")
            or {})["n"] == facts


# ----------------------------------------------------------------- competing claimants


async def test_two_workers_on_two_connections_race_for_one_row(db_target: str) -> None:
    path = db_target
    async with StateDB(path) as one, StateDB(path) as two:
        for i in range(15):
            rid = await submit(one, now=NOW + i)
            a, b = await asyncio.gather(claim_runs(one, worker_id="w1", now=NOW + i),
                                        claim_runs(two, worker_id="w2", now=NOW + i))
            winners = [r["leased_by"] for r in a.claimed + b.claimed]
            assert len(winners) == 1, (i, winners)
            row = await get_row(one, rid)
            assert (row["status"], row["leased_by"], row["lease_attempts"]) == \
                ("running", winners[0], 1)
            assert [m[1] for m in await moves(one, rid)] == ["queued", "running"]
        assert (await verify(one)).ok


async def test_racing_passes_claim_disjoint_sets(db_target: str) -> None:
    path = db_target
    async with StateDB(path) as one, StateDB(path) as two:
        ids = await submit_many(one, [app(args={"i": i}) for i in range(30)], now=NOW)
        a, b = await asyncio.gather(claim_runs(one, worker_id="w1", now=NOW + 1),
                                    claim_runs(two, worker_id="w2", now=NOW + 1))
        got_a = {r["id"] for r in a.claimed}
        got_b = {r["id"] for r in b.claimed}
        assert not got_a & got_b
        assert len(got_a | got_b) == min(30, len(a.claimed) + len(b.claimed))
        assert len(got_a | got_b) >= 20
        for rid in ids:
            running = [m for m in await moves(one, rid) if m[1] == "running"]
            assert len(running) == (1 if rid in got_a | got_b else 0)


async def test_a_lost_claim_is_counted_and_not_retried(qdb: StateDB,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # A row with a concurrency key is claimed alone, under its key's lock: hooked here.
    rid = await submit(qdb, required_capabilities=[GPU])
    policy = qdb.registry.entity("schedule_run")
    real_claim_one = claim_mod._claim_one
    calls: list[str] = []

    def cancel_first(conn: sqlite3.Connection, **kw: Any) -> Any:
        # a concurrent cancel lands between the candidate scan and the claim
        calls.append(kw["cand"]["id"])
        runs_mod.move(conn, policy, kw["cand"]["id"], "queued", "cancelled",
                        "run.cancelled.operator", actor=OPERATOR, now=NOW)
        return real_claim_one(conn, **kw)

    monkeypatch.setattr(claim_mod, "_claim_one", cancel_first)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 1, advertised_capabilities=[GPU])
    assert got.claimed == [] and got.lost == 1 and calls == [rid]
    row = await get_row(qdb, rid)
    assert (row["status"], row["leased_by"], row["lease_attempts"]) == ("cancelled", None, 0)


async def test_a_lost_claim_of_a_pass_claimed_together_is_counted(
        qdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same race where a pass's claims go together (on PostgreSQL one statement): the
    cancelled row is lost, the pass's other rows are claimed, each with its own fact."""
    # One queued_at for all: claim order is id order.
    ids = sorted(await submit_many(qdb, [app(args={"i": i}) for i in range(4)], now=NOW))
    policy = qdb.registry.entity("schedule_run")
    real = claim_mod.apply_claims
    calls: list[int] = []

    def cancel_first(tx: Any, pol: Any, rows: Any, *a: Any, **kw: Any) -> Any:
        calls.append(len(rows))
        runs_mod.move(tx, policy, ids[0], "queued", "cancelled", "run.cancelled.operator",
                      actor=OPERATOR, now=NOW)
        return real(tx, pol, rows, *a, **kw)

    monkeypatch.setattr(claim_mod, "apply_claims", cancel_first)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 1, limit=2)
    if not qdb.many_writers:
        # SQLite's single writer picks no spares: the first is lost, the second claimed.
        assert calls == [2]
        assert [r["id"] for r in got.claimed] == ids[1:2] and got.lost == 1
        assert (await get_row(qdb, ids[0]))["status"] == "cancelled"
        assert (await verify(qdb)).ok
        return
    assert calls == [4]  # the limit's spares, in one statement
    assert [r["id"] for r in got.claimed] == ids[1:3] and got.lost == 1
    for rid, r in zip(ids[1:3], got.claimed, strict=True):
        assert (r["status"], r["leased_by"], r["lease_attempts"], r["version"]) == \
            ("running", "w1", 1, 2)
        assert [m[1] for m in await moves(qdb, rid)] == ["queued", "running"]
    assert (await get_row(qdb, ids[0]))["status"] == "cancelled"
    assert (await get_row(qdb, ids[3]))["status"] == "queued"  # not tried: limit reached
    assert (await verify(qdb)).ok


async def test_a_pass_sends_further_spares_only_for_the_claims_others_won(
        qdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where spares are chosen (writers run at once), a claim statement carries
    CLAIM_STEP candidates a slot; the next ones go in a further statement, in order, only
    for the slots the first left unfilled. Every candidate tried before the limit was
    reached is lost or claimed; those after it are left queued, untried."""
    if not qdb.many_writers:
        pytest.skip("SQLite's single writer chooses no spares")
    ids = sorted(await submit_many(qdb, [app(args={"i": i}) for i in range(8)], now=NOW))
    policy = qdb.registry.entity("schedule_run")
    real = claim_mod.apply_claims
    calls: list[list[str]] = []

    def others_won_the_first_four(tx: Any, pol: Any, rows: Any, *a: Any, **kw: Any) -> Any:
        calls.append([r[0] for r in rows])
        if len(calls) == 1:
            for rid in ids[:4]:
                runs_mod.move(tx, policy, rid, "queued", "cancelled",
                              "run.cancelled.operator", actor=OPERATOR, now=NOW)
        return real(tx, pol, rows, *a, **kw)

    monkeypatch.setattr(claim_mod, "apply_claims", others_won_the_first_four)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 1, limit=2)
    assert claim_mod.CLAIM_STEP == 2 and calls == [ids[:4], ids[4:8]]
    assert [r["id"] for r in got.claimed] == ids[4:6] and got.lost == 4
    assert [(await get_row(qdb, rid))["status"] for rid in ids[6:]] == ["queued", "queued"]
    assert (await verify(qdb)).ok


async def test_a_claim_together_that_raises_claims_row_by_row(
        qdb: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = await submit_many(qdb, [app(args={"i": i}) for i in range(3)], now=NOW)
    broke: list[int] = []

    def broken(*a: Any, **kw: Any) -> Any:
        broke.append(1)
        raise RuntimeError("together blew up")

    monkeypatch.setattr(claim_mod, "apply_claims", broken)
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 1, limit=3)
    # The pass tried its claims together first, then row by row.
    assert broke == [1]
    assert sorted(r["id"] for r in got.claimed) == sorted(ids) and got.lost == 0
    assert (await verify(qdb)).ok


# ----------------------------------------------------------------- execution outcomes


async def test_exit_zero_completes(qdb: StateDB) -> None:
    rid = await submit(qdb)
    assert await claim_and_execute(qdb, worker_id="w1", execute=returning(0, "ignored"),
                                   now=NOW) == 1
    row = await get_row(qdb, rid)
    assert (row["status"], row["exit_code"], row["error_detail"]) == ("completed", 0, None)
    assert NOW <= row["ended_at"] < NOW + 5
    assert (await moves(qdb, rid))[-1] == ("running", "completed", "run.completed.ok")
    assert (await verify(qdb)).ok


@pytest.mark.parametrize("code", [1, 2, 127, -9])
async def test_nonzero_exit_fails_with_its_code_and_detail(qdb: StateDB, code: int) -> None:
    rid = await submit(qdb)
    await claim_and_execute(qdb, worker_id="w1", execute=returning(code, "it broke"), now=NOW)
    row = await get_row(qdb, rid)
    assert (row["status"], row["exit_code"], row["error_detail"]) == ("failed", code,
                                                                      "it broke")
    assert NOW <= row["ended_at"] < NOW + 5
    assert (await moves(qdb, rid))[-1] == ("running", "failed", "run.failed.exit_nonzero")
    facts = await history(qdb, "schedule_run", rid)
    # terminal columns commit in the same fact as the status change
    patch = loads(facts[-1]["patch"])
    assert (patch["exit_code"], patch["error_detail"], patch["ended_at"]) == \
        (code, "it broke", row["ended_at"])
    assert (await verify(qdb)).ok


async def test_executor_exception_fails_with_detail(qdb: StateDB) -> None:
    rid = await submit(qdb)

    async def explode(run: dict[str, Any]) -> tuple[int, str]:
        raise RuntimeError("executor blew up")

    assert await claim_and_execute(qdb, worker_id="w1", execute=explode, now=NOW) == 1
    row = await get_row(qdb, rid)
    assert row["status"] == "failed"
    assert isinstance(row["exit_code"], int) and row["exit_code"] != 0
    assert "RuntimeError" in row["error_detail"] and "executor blew up" in row["error_detail"]
    assert row["ended_at"] is not None
    assert (await moves(qdb, rid))[-1] == ("running", "failed", "run.failed.exception")
    assert (await verify(qdb)).ok


async def test_error_detail_keeps_a_bounded_tail(qdb: StateDB) -> None:
    rid = await submit(qdb)
    detail = "head-" + "x" * 50_000 + "-the-real-error"
    await claim_and_execute(qdb, worker_id="w1", execute=returning(3, detail), now=NOW)
    stored = (await get_row(qdb, rid))["error_detail"]
    assert 0 < len(stored) <= outcomes_mod.DETAIL_LIMIT <= 16_384
    assert stored.endswith("-the-real-error") and detail.endswith(stored)


async def test_full_round_trip_leaves_the_facts(qdb: StateDB) -> None:
    rid = await submit(qdb)
    got = await worker_tick(qdb, worker_id="w1", execute=ok, now=NOW + 1)
    assert got == {"requeued": 0, "failed": 0, "claimed": 1}
    facts = await history(qdb, "schedule_run", rid)
    assert [(f["previous_status"], f["status"], f["reason_code"]) for f in facts] == [
        (None, "queued", "run.queued.submitted"),
        ("queued", "running", "run.started.ok"),
        ("running", "completed", "run.completed.ok"),
    ]
    assert [f["entity_version"] for f in facts] == [1, 2, 3]
    assert facts[1]["actor"] == facts[2]["actor"] == "w1"
    assert (await verify(qdb)).ok


# ----------------------------------------------------------------- leases and the reaper


async def test_stale_worker_cannot_finalize_a_lease_reclaimed_by_another(qdb: StateDB) -> None:
    rid = await submit(qdb)
    (run1,) = (await claim_runs(qdb, worker_id="w1", now=NOW, lease_ttl=10)).claimed
    assert await reap_expired_leases(qdb, now=NOW + 11) == {"requeued": 1, "failed": 0}
    (run2,) = (await claim_runs(qdb, worker_id="w2", now=NOW + 11, lease_ttl=10)).claimed
    facts = await fact_count(qdb)
    for code in (0, 1):
        ctx1 = RunContext(worker_id="w1", lease_ttl=10, clock=lambda: NOW + 12,
                          executors=Executors(execute=returning(code, "late")))
        assert await execute_claimed(qdb, run1, ctx1) == "lost"
    row = await get_row(qdb, rid)
    assert (row["status"], row["leased_by"], row["lease_expires_at"], row["lease_attempts"]) == \
        ("running", "w2", NOW + 21, 2)
    assert row["exit_code"] is None and row["ended_at"] is None
    assert await fact_count(qdb) == facts
    ctx2 = RunContext(worker_id="w2", lease_ttl=10, clock=lambda: NOW + 13,
                      executors=Executors(execute=ok))
    assert await execute_claimed(qdb, run2, ctx2) == "completed"
    assert (await get_row(qdb, rid))["status"] == "completed"
    assert (await verify(qdb)).ok


async def test_same_worker_cannot_finalize_its_own_earlier_lease(qdb: StateDB) -> None:
    """The guard is owner *and* stored expiry: a reclaim by the same worker is a new lease."""
    rid = await submit(qdb)
    (old,) = (await claim_runs(qdb, worker_id="w1", now=NOW, lease_ttl=10)).claimed
    await reap_expired_leases(qdb, now=NOW + 11)
    (new,) = (await claim_runs(qdb, worker_id="w1", now=NOW + 11, lease_ttl=10)).claimed
    ctx = RunContext(worker_id="w1", lease_ttl=10, clock=lambda: NOW + 12,
                     executors=Executors(execute=returning(1, "stale failure")))
    assert await execute_claimed(qdb, old, ctx) == "lost"
    assert (await get_row(qdb, rid))["status"] == "running"
    ctx = RunContext(worker_id="w1", lease_ttl=10, clock=lambda: NOW + 12,
                     executors=Executors(execute=ok))
    assert await execute_claimed(qdb, new, ctx) == "completed"


async def test_a_running_stale_worker_stops_when_its_lease_is_reclaimed(qdb: StateDB) -> None:
    rid = await submit(qdb)
    (run1,) = (await claim_runs(qdb, worker_id="w1", now=NOW, lease_ttl=30)).claimed
    started = asyncio.Event()
    stopped = asyncio.Event()

    async def hang(run: dict[str, Any]) -> tuple[int, str]:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()
        return 0, ""

    ctx = RunContext(worker_id="w1", lease_ttl=30, clock=lambda: NOW + 1,
                     executors=Executors(execute=hang), check_interval=0.01)
    task = asyncio.ensure_future(execute_claimed(qdb, run1, ctx))
    await asyncio.wait_for(started.wait(), 5)
    assert await reap_expired_leases(qdb, now=NOW + 31) == {"requeued": 1, "failed": 0}
    (run2,) = (await claim_runs(qdb, worker_id="w2", now=NOW + 31)).claimed
    assert await asyncio.wait_for(task, 5) == "lost"
    assert stopped.is_set()
    row = await get_row(qdb, rid)
    assert (row["status"], row["leased_by"]) == ("running", "w2")
    assert run2["id"] == rid


async def test_lease_expiry_by_time_alone_does_not_block_the_terminal_write(
        qdb: StateDB) -> None:
    rid = await submit(qdb)
    (run,) = (await claim_runs(qdb, worker_id="w1", now=NOW, lease_ttl=10)).claimed
    ctx = RunContext(worker_id="w1", lease_ttl=10, clock=lambda: NOW + 5_000,
                     executors=Executors(execute=ok))
    assert await execute_claimed(qdb, run, ctx) == "completed"
    assert (await get_row(qdb, rid))["status"] == "completed"


async def test_reaper_is_strict_and_requeue_keeps_attempts(qdb: StateDB) -> None:
    rid = await submit(qdb)
    await claim_runs(qdb, worker_id="w1", now=NOW, lease_ttl=10)
    assert await reap_expired_leases(qdb, now=NOW + 10) == {"requeued": 0, "failed": 0}
    assert (await get_row(qdb, rid))["status"] == "running"
    assert await reap_expired_leases(qdb, now=NOW + 10.001) == {"requeued": 1, "failed": 0}
    row = await get_row(qdb, rid)
    assert (row["status"], row["leased_by"], row["lease_expires_at"], row["lease_attempts"]) == \
        ("queued", None, None, 1)
    assert row["ended_at"] is None
    assert (await moves(qdb, rid))[-1] == ("running", "queued", "run.queued.lease_expired")
    # the next claim counts on from the kept attempts
    (again,) = (await claim_runs(qdb, worker_id="w2", now=NOW + 20, lease_ttl=10)).claimed
    assert again["lease_attempts"] == 2
    assert (await verify(qdb)).ok


async def test_third_lease_expiry_fails_the_run(qdb: StateDB) -> None:
    rid = await submit(qdb)
    t = NOW
    for attempt in (1, 2, 3):
        (run,) = (await claim_runs(qdb, worker_id=f"w{attempt}", now=t, lease_ttl=10)).claimed
        assert run["lease_attempts"] == attempt
        t += 11
        expected = {"requeued": 1, "failed": 0} if attempt < 3 else {"requeued": 0, "failed": 1}
        assert await reap_expired_leases(qdb, now=t) == expected
    row = await get_row(qdb, rid)
    assert (row["status"], row["lease_attempts"], row["ended_at"]) == ("failed", 3, t)
    assert "w3" in row["error_detail"]
    assert [m[2] for m in await moves(qdb, rid)] == [
        "run.queued.submitted",
        "run.started.ok", "run.queued.lease_expired",
        "run.started.ok", "run.queued.lease_expired",
        "run.started.ok", "run.failed.lease_attempts_exhausted",
    ]
    assert (await worker_tick(qdb, worker_id="w9", execute=ok, now=t + 100))["claimed"] == 0
    assert (await get_row(qdb, rid))["status"] == "failed"
    assert (await verify(qdb)).ok


async def test_reaper_leaves_unleased_running_rows_alone(qdb: StateDB) -> None:
    fire = await record_scheduled_fire(qdb, schedule_id="s", action_kind="agent", args={},
                                       now=NOW)
    assert await reap_expired_leases(qdb, now=NOW + 10**9) == {"requeued": 0, "failed": 0}
    assert (await get_row(qdb, fire))["status"] == "running"


async def test_cancel_while_running_wins_over_the_workers_terminal_write(qdb: StateDB) -> None:
    rid = await submit(qdb)
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow(run: dict[str, Any]) -> tuple[int, str]:
        started.set()
        await release.wait()
        return 0, ""

    task = asyncio.ensure_future(claim_and_execute(qdb, worker_id="w1", execute=slow, now=NOW))
    await asyncio.wait_for(started.wait(), 5)
    assert await cancel_task(qdb, rid, actor=OPERATOR, now=NOW + 1)
    release.set()
    assert await asyncio.wait_for(task, 5) == 1
    row = await get_row(qdb, rid)
    assert row["status"] == "cancelled" and row["exit_code"] is None
    assert [m[1] for m in await moves(qdb, rid)] == ["queued", "running", "cancelled"]


TERMINAL_MOVES = {
    "completed": ("running", "run.completed.ok"),
    "failed": ("running", "run.failed.exit_nonzero"),
    "timed_out": ("running", "run.timed_out.deadline"),
    "cancelled": ("running", "run.cancelled.operator"),
    "skipped": ("queued", "run.skipped.scheduled"),
}


@pytest.mark.parametrize("terminal", sorted(TERMINAL_MOVES))
async def test_terminal_states_never_re_enter_running(qdb: StateDB, terminal: str) -> None:
    assert set(TERMINAL_MOVES) == set(qdb.registry.entity("schedule_run").terminal)
    rid = await submit(qdb)
    source, code = TERMINAL_MOVES[terminal]
    if source == "running":
        await claim_runs(qdb, worker_id="w1", now=NOW, lease_ttl=10)
    result = await transition(qdb, TransitionRequest(
        entity_type="schedule_run", entity_id=rid, from_state=source, to_state=terminal,
        reason=StateReason(code=code), actor=OPERATOR, idempotency_key=str(uuid.uuid4())),
        now=NOW + 1)
    assert result.applied
    before = (await get_row(qdb, rid), await fact_count(qdb))
    # the lease (if any) is long expired: still nothing moves
    for i in range(3):
        t = NOW + 1_000 * (i + 1)
        assert await reap_expired_leases(qdb, now=t) == {"requeued": 0, "failed": 0}
        assert (await worker_tick(qdb, worker_id="w2", execute=ok, now=t))["claimed"] == 0
    for from_state in (terminal, None):
        with pytest.raises(ValueError, match=VOCABULARY_ERROR):
            await transition(qdb, TransitionRequest(
                entity_type="schedule_run", entity_id=rid, from_state=from_state,
                to_state="running", reason=StateReason(code="run.started.ok"),
                actor=Actor(type="system", id="w2"), idempotency_key=str(uuid.uuid4())))
    assert (await get_row(qdb, rid), await fact_count(qdb)) == before


# ----------------------------------------------------------------- malformed rows, ticks


@pytest.mark.parametrize("bad", ['{not json', '"cuda"', "[1, 2]", '{"a": 1}', "[null]"])
async def test_malformed_capabilities_are_skipped_and_reported(qdb: StateDB, bad: str) -> None:
    if qdb.dialect == "postgresql" and not bad.startswith(('"', "[", "{\"")):
        pytest.skip("a jsonb column cannot hold text that is not JSON")
    broken = await submit(qdb, now=NOW)
    fine = await submit(qdb, now=NOW + 1)
    raw_update(qdb, "UPDATE schedule_runs SET required_capabilities = ? WHERE id = ?",
               (bad, broken))
    got = await claim_runs(qdb, worker_id="w1", now=NOW + 2)
    assert got.malformed == [broken]
    assert [r["id"] for r in got.claimed] == [fine]
    # a whole tick survives it too, and leaves the broken row where it was
    assert (await worker_tick(qdb, worker_id="w1", execute=ok, now=NOW + 3))["claimed"] == 0
    row = await get_row(qdb, broken)
    assert (row["status"], row["leased_by"], row["lease_attempts"]) == ("queued", None, 0)


async def test_malformed_args_fail_the_run_instead_of_the_worker(qdb: StateDB) -> None:
    if qdb.dialect == "postgresql":
        pytest.skip("a jsonb column cannot hold text that is not JSON")
    broken = await submit(qdb, now=NOW)
    fine = await submit(qdb, now=NOW + 1)
    raw_update(qdb, "UPDATE schedule_runs SET action_args = ? WHERE id = ?", ("{oops", broken))
    seen: list[str] = []
    got = await worker_tick(qdb, worker_id="w1", execute=returning(0, seen=seen), now=NOW + 2)
    assert got["claimed"] == 2
    assert seen == [fine]
    row = await get_row(qdb, broken)
    assert row["status"] == "failed" and "action_args" in row["error_detail"]
    assert (await get_row(qdb, fine))["status"] == "completed"


async def test_worker_tick_reports_requeued_failed_and_claimed(qdb: StateDB) -> None:
    exhausted = await submit(qdb, now=NOW)
    expiring = await submit(qdb, now=NOW + 1)
    t = NOW + 10
    for attempt in (1, 2, 3):  # the older row is always claimed first
        (run,) = (await claim_runs(qdb, worker_id="w0", now=t, lease_ttl=10, limit=1)).claimed
        assert (run["id"], run["lease_attempts"]) == (exhausted, attempt)
        if attempt < 3:
            t += 11
            assert await reap_expired_leases(qdb, now=t) == {"requeued": 1, "failed": 0}
    (run,) = (await claim_runs(qdb, worker_id="w0", now=t, lease_ttl=10, limit=1)).claimed
    assert (run["id"], run["lease_attempts"]) == (expiring, 1)
    # one tick: reap (expiring back to queued, exhausted failed), then claim and run
    got = await worker_tick(qdb, worker_id="w1", execute=ok, now=t + 11)
    assert got == {"requeued": 1, "failed": 1, "claimed": 1}
    assert (await get_row(qdb, exhausted))["status"] == "failed"
    row = await get_row(qdb, expiring)
    assert (row["status"], row["leased_by"], row["lease_attempts"]) == ("completed", "w1", 2)
    assert (await verify(qdb)).ok
