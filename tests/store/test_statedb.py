"""StateDB: pragmas, reads as dicts, :memory:, group commit, and writers that contend."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.errors import DatabaseError, IntegrityViolation
from ledgerq.lifecycle import StateReason, create
from ledgerq.lifecycle.engine import create_entity
from ledgerq.projections import verify
from ledgerq.store.sqltx import SqlTx
from lifecycle_support import SYSTEM, move, new_dispatch, new_run, row, run_values, with_dispatch

RUN = "schedule_run"


async def pragma(db: StateDB, name: str) -> object:
    """The pragma's value on the write connection, checked equal on the read connection."""
    written = await db.run(lambda c: c.execute(f"PRAGMA {name}").fetchone()[0])
    got = await db.fetch_one(f"PRAGMA {name}")
    assert got is not None
    assert next(iter(got.values())) == written, f"{name} differs between the connections"
    return written


# ---------------------------------------------------------------- configuration


@pytest.mark.sqlite_only
async def test_default_pragmas(db: StateDB) -> None:
    assert await pragma(db, "journal_mode") == "wal"
    assert await pragma(db, "synchronous") == 1  # NORMAL
    assert await pragma(db, "foreign_keys") == 1
    timeout = await pragma(db, "busy_timeout")
    assert isinstance(timeout, int) and timeout >= 1000


async def test_synchronous_full_is_selectable(db_path: Path) -> None:
    async with StateDB(db_path, synchronous="FULL") as db:
        assert await pragma(db, "synchronous") == 2
        assert await pragma(db, "journal_mode") == "wal"
    async with StateDB(db_path, busy_timeout_ms=1234) as db:
        assert await pragma(db, "synchronous") == 1
        assert await pragma(db, "busy_timeout") == 1234


async def test_reads_use_a_query_only_connection_that_sees_committed_writes(
        db: StateDB) -> None:
    with pytest.raises(DatabaseError, match=r"readonly|read-only"):
        await db.read(lambda c: c.execute("DELETE FROM schedule_runs"))
    rid = await new_run(db)
    assert (await row(db, "schedule_runs", rid) or {})["id"] == rid


async def test_a_read_does_not_wait_for_a_write_in_flight(db: StateDB) -> None:
    if db.dialect == "sqlite":
        pytest.skip("SQLite runs a write's statements in the loop's thread when the lock "
                    "is free; see the tests of a held lock below")
    started = asyncio.Event()
    loop = asyncio.get_running_loop()

    def slow_write(c: object) -> None:
        loop.call_soon_threadsafe(started.set)
        time.sleep(0.5)  # holds a connection (and its transaction) like a slow commit

    writing = asyncio.ensure_future(db.write(slow_write))
    await started.wait()
    got = await db.fetch_one("SELECT count(*) AS n FROM schedule_runs")
    assert got == {"n": 0}
    assert not writing.done(), "the read queued behind the write"
    await writing


@pytest.mark.sqlite_only
async def test_an_uncontended_write_runs_in_the_loops_thread(db: StateDB) -> None:
    ran_in: list[int] = []
    await db.write(lambda tx: ran_in.append(threading.get_ident()))
    assert ran_in == [threading.get_ident()]


@pytest.mark.sqlite_only
async def test_a_write_waiting_for_another_process_blocks_neither_the_loop_nor_reads(
        db_path: Path) -> None:
    async with StateDB(db_path) as db:
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
        ran_in: list[int] = []

        def unit(tx: object) -> None:
            ran_in.append(threading.get_ident())

        writing = asyncio.ensure_future(db.write(unit))
        ticks = 0
        for _ in range(20):  # the loop keeps running while the write waits
            await asyncio.sleep(0.01)
            ticks += 1
        assert ticks == 20 and not writing.done()
        got = await db.fetch_one("SELECT count(*) AS n FROM schedule_runs")
        assert got == {"n": 0}, "the read queued behind the waiting write"
        other.execute("COMMIT")
        await asyncio.wait_for(writing, 10)
        # It ran where waiting blocks nobody: the write connection's own thread.
        assert ran_in and ran_in[-1] != threading.get_ident()
        # And once the lock is free, writes run inline again.
        await db.write(unit)
        assert ran_in[-1] == threading.get_ident()
        other.close()
        assert await db.run(lambda c: c.execute("PRAGMA busy_timeout").fetchone()[0]) >= 1000


@pytest.mark.sqlite_only
async def test_a_group_that_finds_the_lock_held_writes_each_unit_once(db_path: Path) -> None:
    """The units of a group that met a held lock run again in the connection's thread:
    every write lands exactly once, with its own outcome."""
    async with StateDB(db_path) as db:
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        creating = [asyncio.ensure_future(new_run(db)) for _ in range(5)]
        failing = asyncio.ensure_future(db.write(lambda tx: 1 / 0))
        await asyncio.sleep(0.2)
        other.execute("ROLLBACK")
        other.close()
        ids = await asyncio.gather(*creating)
        with pytest.raises(ZeroDivisionError):
            await failing
        got = await db.fetch_one("SELECT count(*) AS n FROM schedule_runs")
        assert got == {"n": 5} and len(set(ids)) == 5
        assert (await verify(db)).ok


@pytest.mark.sqlite_only
async def test_a_unit_that_reads_first_takes_the_lock_only_when_it_writes(
        db_path: Path) -> None:
    """``reads_first``: while another process holds the write lock, a unit that only reads
    runs at once in the loop's thread; one that then writes is rolled back at that write
    and runs again once the lock is free (in the connection's thread, where waiting
    blocks nobody), its write landing once."""
    async with StateDB(db_path) as db:
        policy = db.registry.entity(RUN)
        rid = await new_run(db)
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's writer holds the lock
        runs: list[int] = []

        def look(tx: SqlTx) -> str:
            runs.append(threading.get_ident())
            found = tx.read_entity(policy, rid)
            assert found is not None
            return str(found["status"])

        assert await asyncio.wait_for(db.write(look, reads_first=True), 1) == "queued"
        assert runs == [threading.get_ident()]

        def look_then_create(tx: SqlTx) -> str:
            look(tx)
            return create_entity(tx, policy, run_values(), actor=SYSTEM,
                                 reason=StateReason(code="run.queued.submitted"))

        runs.clear()
        writing = asyncio.ensure_future(db.write(look_then_create, reads_first=True))
        await asyncio.sleep(0.1)
        assert not writing.done() and runs == [threading.get_ident()]
        other.execute("COMMIT")
        other.close()
        created = await asyncio.wait_for(writing, 10)
        assert len(runs) == 2 and runs[1] != threading.get_ident()
        got = await db.fetch_all("SELECT id FROM schedule_runs ORDER BY id")
        assert sorted([rid, created]) == [r["id"] for r in got]
        assert (await verify(db)).ok


@pytest.mark.sqlite_only
async def test_a_unit_that_reads_first_runs_again_when_another_writer_came_between(
        db_path: Path) -> None:
    """A deferred unit's snapshot is its first read: a write another process committed
    after it cannot be overwritten by it (SQLite refuses the stale write; the unit runs
    again, under the lock, and both writes stand)."""
    async with StateDB(db_path) as db:
        policy = db.registry.entity(RUN)
        rid = await new_run(db)
        seen: list[int] = []

        def count_then_create(tx: SqlTx) -> None:
            n = len(tx.read_entities(policy, [rid]))
            seen.append(n)
            if len(seen) == 1:  # another process writes between this read and our write
                other = sqlite3.connect(db_path, isolation_level=None)
                other.execute("UPDATE schedule_runs SET updated_at = 1 WHERE id = ?", (rid,))
                other.close()
            create_entity(tx, policy, run_values(), actor=SYSTEM,
                          reason=StateReason(code="run.queued.submitted"))

        await asyncio.wait_for(db.write(count_then_create, reads_first=True), 10)
        assert seen == [1, 1]
        got = await db.fetch_one("SELECT count(*) AS n FROM schedule_runs")
        assert got == {"n": 2}
        assert (await db.fetch_one("SELECT updated_at FROM schedule_runs WHERE id = ?",
                                   (rid,))) == {"updated_at": 1}


def test_bad_synchronous_is_refused(db_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous"):
        StateDB(db_path, synchronous="SOMETIMES")  # type: ignore[arg-type]


async def test_foreign_keys_are_enforced(db: StateDB) -> None:
    with pytest.raises(IntegrityViolation, match=r"(?i)FOREIGN KEY"):
        await new_run(db, chain_parent_id="no-such-parent")
    with pytest.raises(IntegrityViolation, match=r"(?i)FOREIGN KEY"):
        await db.write(lambda c: c.execute(
            "INSERT INTO workers (worker_id, last_heartbeat_at, leased_run_id) "
            "VALUES ('w', 0, 'no-such-run')"))


async def test_schema_is_created_on_first_open_and_reopen_keeps_data(db_path: Path) -> None:
    async with StateDB(db_path, registry=with_dispatch()) as db:
        names = {r["name"] for r in await db.fetch_all(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"schedule_runs", "status_transitions", "workers", "schedules", "invocations",
                "dispatch_outbox"} <= names
        rid = await new_run(db)
    async with StateDB(db_path) as db:
        got = await row(db, "schedule_runs", rid)
        assert got is not None and got["status"] == "queued"
        assert (await verify(db)).ok


@pytest.mark.parametrize("path", [":memory:", ""], ids=["memory", "private-temp"])
async def test_memory_database_works(path: str) -> None:
    """Databases private to one connection: reads must see them (no second connection)."""
    async with StateDB(path, registry=with_dispatch()) as db:
        rid = await new_run(db)
        assert (await row(db, "schedule_runs", rid) or {}).get("id") == rid
        did = await new_dispatch(db)
        assert (await move(db, RUN, rid, "queued", "running", "run.started.ok")).applied
        assert (await move(db, "dispatch", did, "pending", "acked", "dispatch.acked.ok")).applied
        assert (await verify(db)).ok
        assert await pragma(db, "foreign_keys") == 1


async def test_open_close_without_context_manager(db_path: Path) -> None:
    db = StateDB(db_path)
    assert not db.is_open
    with pytest.raises(RuntimeError, match="not open"):
        await db.fetch_one("SELECT 1")
    assert await db.open() is db
    assert await db.open() is db  # idempotent
    assert db.is_open
    rid = await new_run(db)
    await db.close()
    await db.close()  # idempotent
    assert not db.is_open
    with pytest.raises(RuntimeError, match="not open"):
        await new_run(db)
    await db.open()
    try:
        assert await row(db, "schedule_runs", rid) is not None
    finally:
        await db.close()


async def test_fetch_one_and_fetch_all_return_dicts(db: StateDB) -> None:
    a, b = await new_run(db), await new_run(db)
    one = await db.fetch_one("SELECT id, status FROM schedule_runs WHERE id = ?", (a,))
    assert type(one) is dict and one == {"id": a, "status": "queued"}
    assert await db.fetch_one("SELECT id FROM schedule_runs WHERE id = ?", ("none",)) is None
    named = await db.fetch_one("SELECT id FROM schedule_runs WHERE id = :id", {"id": b})
    assert named == {"id": b}
    rows = await db.fetch_all("SELECT id FROM schedule_runs ORDER BY created_at, id")
    assert type(rows) is list and all(type(r) is dict for r in rows)
    assert {r["id"] for r in rows} == {a, b}
    assert await db.fetch_all("SELECT id FROM schedule_runs WHERE 1 = 0") == []


@pytest.mark.sqlite_only
async def test_every_write_begins_immediate(db: StateDB) -> None:
    statements: list[str] = []
    await db.run(lambda conn: conn.set_trace_callback(statements.append))
    rid = await new_run(db)
    await move(db, RUN, rid, "queued", "running", "run.started.ok")
    await db.run(lambda conn: conn.set_trace_callback(None))
    begins = [s for s in statements if s.upper().startswith("BEGIN")]
    assert begins == ["BEGIN IMMEDIATE", "BEGIN IMMEDIATE"]
    # run() itself restores the connection's busy timeout (writes try the lock without
    # waiting, see the held-lock tests): its pragmas are no write's statements.
    assert next(s for s in statements if not s.startswith("PRAGMA busy_timeout")) == \
        "BEGIN IMMEDIATE"


# ---------------------------------------------------------------- group commit


@pytest.mark.sqlite_only
async def test_a_failing_unit_rolls_back_alone_within_its_group(db: StateDB) -> None:
    statements: list[str] = []
    await db.run(lambda conn: conn.set_trace_callback(statements.append))

    def insert(name: str, fail: bool = False):  # type: ignore[no-untyped-def]
        def unit(conn):  # type: ignore[no-untyped-def]
            conn.execute("INSERT INTO schedules (id, name, created_at) VALUES (?, ?, 0)",
                         (name, name))
            if fail:
                raise RuntimeError(f"unit {name} failed")
            return name
        return unit

    results = await asyncio.gather(
        db.write(insert("a")), db.write(insert("b", fail=True)), db.write(insert("c")),
        create(db, RUN, run_values(), reason=StateReason(code="run.queued.submitted"),
               actor=SYSTEM),
        db.write(insert("a")),  # duplicate primary key: an IntegrityError, also alone
        return_exceptions=True,
    )
    await db.run(lambda conn: conn.set_trace_callback(None))
    assert results[0] == "a" and results[2] == "c"
    assert isinstance(results[1], RuntimeError)
    assert isinstance(results[3], str)
    assert isinstance(results[4], IntegrityViolation)
    # One group, one commit: it first ran without savepoints, was rolled back when a
    # unit raised, and ran again with each unit in its own savepoint.
    ends = [s for s in statements if s in ("COMMIT", "ROLLBACK")]
    assert [s for s in statements if s.startswith("BEGIN")] == ["BEGIN IMMEDIATE"] * 2
    assert ends == ["ROLLBACK", "COMMIT"]
    assert statements.count("SAVEPOINT unit") == 5
    names = [r["id"] for r in await db.fetch_all("SELECT id FROM schedules ORDER BY id")]
    assert names == ["a", "c"]
    assert await row(db, "schedule_runs", results[3]) is not None  # type: ignore[arg-type]
    assert (await verify(db)).ok


@pytest.mark.sqlite_only
async def test_a_group_without_failures_takes_no_savepoints_and_bulk_runs_alone(
        db: StateDB) -> None:
    statements: list[str] = []
    await db.run(lambda conn: conn.set_trace_callback(statements.append))
    ran_in: dict[str, int] = {}

    def unit(name: str):  # type: ignore[no-untyped-def]
        def run(tx):  # type: ignore[no-untyped-def]
            ran_in[name] = threading.get_ident()
            return name
        return run

    got = await asyncio.gather(db.write(unit("a")), db.write(unit("b")),
                               db.write(unit("bulk"), bulk=True), db.write(unit("c")))
    await db.run(lambda conn: conn.set_trace_callback(None))
    assert got == ["a", "b", "bulk", "c"]
    assert "SAVEPOINT unit" not in statements
    # Three groups: a and b; the bulk unit alone, in the connection's thread; then c.
    assert statements.count("COMMIT") == 3
    assert ran_in["a"] == ran_in["b"] == ran_in["c"] == threading.get_ident()
    assert ran_in["bulk"] != threading.get_ident()


@pytest.mark.sqlite_only
async def test_a_write_with_nothing_else_ready_commits_in_the_callers_own_step(
        db: StateDB) -> None:
    """No other task could join its commit, so it needs no future and no task: its first
    step commits it (then it yields one turn, as every write does). With another task
    ready it waits for the group instead, which that task's write joins."""
    statements: list[str] = []
    await db.run(lambda conn: conn.set_trace_callback(statements.append))
    await asyncio.sleep(0)
    step = db.write(lambda tx: "alone")
    step.send(None)  # one step: suspended in its yield, after the commit
    assert statements.count("COMMIT") == 1
    with pytest.raises(StopIteration) as stopped:
        step.send(None)
    assert stopped.value.value == "alone"

    other = asyncio.ensure_future(db.write(lambda tx: "other"))
    assert await db.write(lambda tx: "grouped") == "grouped"
    assert await other == "other"
    await db.run(lambda conn: conn.set_trace_callback(None))
    # One commit for the lone write, one for the two that ran together.
    assert statements.count("COMMIT") == 2


@pytest.mark.sqlite_only
async def test_a_caller_writing_in_a_loop_lets_timers_run(db: StateDB) -> None:
    """Writes that commit in the caller's step still yield a turn each: a loop of them
    does not hold a due timer (a lease renewal, a signal's handler) until it ends."""
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    loop.call_later(0.005, lambda: fired.append(loop.time()))
    start = loop.time()
    while loop.time() - start < 0.2:
        await db.write(lambda tx: None)
    assert fired and fired[0] < start + 0.1, (fired, start)


async def test_concurrent_writes_from_two_connections(db_path: Path) -> None:
    async with StateDB(db_path) as one, StateDB(db_path) as two:
        ids = await asyncio.gather(*(new_run(one if i % 2 else two) for i in range(120)))
        assert len(set(ids)) == 120

        async def walk(db: StateDB, rid: str) -> None:
            for to, code in (("running", "run.started.ok"), ("completed", "run.completed.ok")):
                assert (await move(db, RUN, rid, None, to, code)).applied

        await asyncio.gather(*(walk(one if i % 3 else two, rid) for i, rid in enumerate(ids)))
        # Both handles race for the same rows: exactly one claim per row wins.
        racers = await asyncio.gather(*(new_run(one) for _ in range(40)))
        outcomes = await asyncio.gather(*(
            move(db, RUN, rid, "queued", "running", "run.started.ok",
                 guard={"leased_by": None},
                                       patch={"leased_by": name, "lease_expires_at": 4e9})
            for rid in racers for db, name in ((one, "one"), (two, "two"))))
        for i, rid in enumerate(racers):
            pair = outcomes[2 * i: 2 * i + 2]
            assert sorted(r.applied for r in pair) == [False, True], rid
            assert [r.conflict for r in pair if not r.applied] == [True]
        done = await one.fetch_one(
            "SELECT count(*) AS n FROM schedule_runs WHERE status = 'completed'")
        assert done == {"n": 120}
        assert (await verify(two)).ok


WRITER = textwrap.dedent("""
    import asyncio, json, pathlib, random, sys, time
    from ledgerq import StateDB
    from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, create, transition

    path, name, shared = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    actor = Actor(type="system", id=name)

    def req(rid, frm, to, code, key):
        return TransitionRequest(entity_type="schedule_run", entity_id=rid, from_state=frm,
                                 to_state=to, reason=StateReason(code=code), actor=actor,
                                 idempotency_key=key)

    async def main():
        async with StateDB(path) as db:
            # Barrier: start writing only when every process is up, so they contend.
            gate = pathlib.Path(path).parent
            (gate / f"ready-{name}").touch()
            while not (gate / "go").exists():
                time.sleep(0.005)

            async def own(i):
                rid = await create(db, "schedule_run", {
                    "status": "queued", "trigger_context": {}, "action_kind": name,
                    "action_args": [i], "fired_at": 0.0},
                    reason=StateReason(code="run.queued.submitted"), actor=actor)
                for to, code in (("running", "run.started.ok"),
                                 ("completed", "run.completed.ok")):
                    lease = {"leased_by": name, "lease_expires_at": 4e9} if to == "running" else {}
                    res = await transition(db, req(rid, None, to, code, f"{name}-{i}-{to}"),
                                           patch=lease)
                    assert res.applied, res
                return rid
            created = []
            for start in range(0, 30, 5):  # bursts: some grouping, many separate commits
                created += await asyncio.gather(*(own(i) for i in range(start, start + 5)))
            order = list(shared)
            random.shuffle(order)
            claimed = []
            for rid in order:
                res = await transition(db, req(rid, "queued", "running", "run.started.ok",
                                               f"claim-{name}"),
                                       guard={"leased_by": None},
                                       patch={"leased_by": name, "lease_expires_at": 4e9})
                if res.applied:
                    claimed.append(rid)
                else:
                    assert res.conflict, res
            print(json.dumps({"created": created, "claimed": claimed}))

    asyncio.run(main())
""")


@pytest.mark.parametrize("processes", [2, 4])
async def test_concurrent_writes_from_several_processes(db_path: Path, processes: int) -> None:
    async with StateDB(db_path) as db:
        shared = [await new_run(db) for _ in range(25)]
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(db_path), f"p{i}", json.dumps(shared)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(processes)
    ]
    deadline = time.monotonic() + 60
    while len(list(db_path.parent.glob("ready-*"))) < processes:
        assert all(p.poll() is None for p in procs), "a writer died before the barrier"
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    (db_path.parent / "go").touch()
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "locked" not in err and "BUSY" not in err.upper(), err
        reports.append(json.loads(out))
    claimed = [rid for r in reports for rid in r["claimed"]]
    assert sorted(claimed) == sorted(shared), "every shared row claimed exactly once"
    created = [rid for r in reports for rid in r["created"]]
    assert len(set(created)) == len(created) == 30 * processes
    async with StateDB(db_path) as db:
        n = await db.fetch_one("SELECT count(*) AS n FROM schedule_runs WHERE status = 'completed'")
        assert n == {"n": 30 * processes}
        for rid in shared:
            got = await row(db, "schedule_runs", rid)
            assert got is not None and got["status"] == "running" and got["version"] == 2
        facts = await db.fetch_one("SELECT count(*) AS n FROM status_transitions")
        assert facts == {"n": 25 * 2 + 30 * processes * 3}
        assert (await verify(db)).ok


def test_bad_synchronous_is_refused_for_a_postgresql_url_too() -> None:
    """The setting is SQLite's, but a typo must not pass because the target is a URL."""
    with pytest.raises(ValueError, match="synchronous"):
        StateDB("postgresql://nobody@127.0.0.1:1/none",
                synchronous="SOMETIMES")  # type: ignore[arg-type]


@pytest.mark.parametrize("target", ["host=127.0.0.1 dbname=jobs", "dbname=jobs",
                                    " user=postgres host=db"])
def test_a_libpq_keyword_string_is_refused(tmp_path: Path, target: str,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a URL, so it would have been a SQLite file path: refused, naming the form to
    use, before anything is created."""
    from ledgerq.errors import InvalidInput

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInput, match="postgresql://"):
        StateDB(target)
    assert list(tmp_path.iterdir()) == []
    StateDB("runs/host=a.db")  # a path that merely contains a keyword later is a path


def test_a_sqlite_handle_serves_the_loop_it_was_opened_on(db_path: Path) -> None:
    """Threads each running their own event loop on one SQLite handle used to fail half
    their writes ("cannot start a transaction within a transaction") and hang one thread;
    a handle now refuses a second loop at once, with a message saying what to do, and
    its own loop goes on."""
    loop = asyncio.new_event_loop()
    db = StateDB(db_path, registry=with_dispatch())
    loop.run_until_complete(db.open())
    errors: list[BaseException] = []

    def elsewhere() -> None:
        try:
            asyncio.run(new_dispatch(db))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=elsewhere) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert len(errors) == 4
    assert all(isinstance(e, DatabaseError) and "one StateDB per event loop" in str(e)
               for e in errors), errors
    try:
        loop.run_until_complete(new_dispatch(db))
        got = loop.run_until_complete(db.fetch_one("SELECT count(*) AS n FROM dispatch_outbox"))
        assert got == {"n": 1}
    finally:
        loop.run_until_complete(db.close())
        loop.close()
