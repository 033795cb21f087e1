"""Task lifecycles per second: ledgerq's queue beside huey's SqliteHuey and a stdlib design.

Everything runs in one process and one run, each measurement on its own fresh temporary
database file (WAL, the chosen ``synchronous``), so the figures share one disk:

  fsync            write + fsync a small file in a loop for ~1 s: the disk's commit ceiling
  ledgerq          one sequential submitter calls submit_task() N times (one commit each,
                   the caller learns its id after the commit), then worker passes
                   (claim_and_execute with a no-op executor, limit L) until every row is
                   completed. lifecycle = submit + claim + terminal, each its own guarded
                   transition with its own fact; lifecycles/s = N / (submit + worker time)
  huey             SqliteHuey (stock storage; fsync=True is synchronous=FULL; NORMAL is
                   set on its connection by a one-line subclass): enqueue N no-op tasks,
                   then huey.dequeue() + huey.execute(task) until empty, no consumer
                   thread. Two commits per task (enqueue, dequeue), no history
  stdlib 3-commit  plain sqlite3, a minimal table: INSERT (commit), guarded UPDATE
                   queued -> running (commit), guarded UPDATE running -> completed (commit)
  ledgerq+Worker   the same submitter while a Worker (capacity L, no-op executor) serves
                   in the same process: its claims and terminal writes share the
                   submitter's commits; lifecycles/s = N / (first submit to last completion)
  schema floor     a ceiling, not a system: ledgerq's own statements in plain sqlite3
                   with ledgerq's commits: per task the row (INSERT ... RETURNING the
                   defaults it leaves) and its creation fact, one commit each; then
                   passes of L: the guarded claims
                   (UPDATE ... RETURNING *) with their facts in one commit, the guarded
                   terminal writes with theirs in another. No asyncio, thread hop,
                   validation, savepoints or selection logic. Every ledgerq lifecycle in
                   this scenario runs at least these statements and commits, so its rate
                   bounds what any implementation of ledgerq's schema could reach here
  units alone      a ceiling for the runtime: ledgerq's in-transaction units for the same
                   lifecycles (bench/units.py: the submit, the pass's claims, each run's
                   terminal write, with every check and fact the engine makes) called on
                   a plain connection and committed like ledgerq's, with no event loop,
                   futures, validation or supervision. The runtime around the units
                   cannot make ledgerq faster than this; its ratio to the schema floor
                   is what the engine alone costs
  submit_many      submit_many(db, apps) of N apps in one call vs raw executemany of the
                   same rows plus their creation facts in one transaction (the raw side
                   builds the same tuples: v7 ids, JSON columns, the fact's non-NULL patch)
  claim scale      claim_runs(limit=20) with 1k vs 1M (--quick: 100k) queued rows,
                   written straight into the real schema by executemany (no facts needed),
                   spread over 4 queues and 4 priorities; the worker serves 2 queues

The lifecycle measurements alternate between the systems (--repeat rounds, medians), so
a slow spell of a shared disk hits all of them. Beside the rates: process CPU time per
lifecycle (all threads), the figure least moved by other load on the machine, and the
"free worker" bound: ledgerq's submit-only rate over the others' lifecycle rate, the ratio
ledgerq would reach if its worker passes cost nothing, and the "schema ceiling": the
schema floor's lifecycle rate over the others' (its submit-only rate over theirs beside it).

  batched floor    the schema floor with each pass's claims as one guarded multi-row
                   UPDATE and their facts as one multi-row INSERT, the terminal writes
                   likewise (each row still guarded by status, lease and version, each
                   still its own fact): the floor if the engine batched like that

Targets: ledgerq >= 0.8x the schema floor and CPU per lifecycle <= 1.5x the
floor's (SqliteHuey and the stdlib design printed beside, no longer targets);
submit_many >= 0.5x raw; a claim pass at 1M rows <= 1.5x one at 1k.

    .venv/bin/python bench/queue.py            # full run (a few minutes)
    .venv/bin/python bench/queue.py --quick    # ~20 s
    .venv/bin/python bench/queue.py --profile lifecycle --synchronous FULL
"""

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
from __future__ import annotations

import os
import sys

# This file is named queue.py, and Python puts a script's own directory first on
# sys.path, where it would shadow the standard library's ``queue`` (which asyncio's
# executor and aiosqlite import). Drop that entry before importing anything else.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import platform
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.codec import dumps
from ledgerq.lifecycle import (
    Actor,
    Registry,
    StateReason,
    TransitionRequest,
    default_registry,
    transition,
)
from ledgerq.lifecycle.engine import new_id
from ledgerq.queue import TaskApplication, Worker, claim_and_execute, submit_many, submit_task
from ledgerq.queue.submission.application import digest
from ledgerq.queue.worker.functions import claim_runs
from ledgerq.store.sqlite.schema import schema_ddl

sys.path.append(_HERE)  # last, so the stdlib's queue still wins; for floor.py
from floor import (  # noqa: I001  (sibling scripts, importable only after the line above)
    APP, RAW_FACT_INSERT, RAW_RUN_INSERT, WORKER, connect, schema_floor)
from rounds import Ratio
from rounds import ratio as rounds_ratio
from units import units_lifecycles

CLAIM_PASSES = 41
MANY_REPEAT = 5


async def noop(run: dict[str, Any]) -> tuple[int, str]:
    return 0, ""


#: The ceiling row of the lifecycle table: ledgerq's own statements, in raw sqlite3.
FLOOR = "schema floor"
#: The same with each pass's claims and terminal writes batched, as the engine batches them.
BATCHED = "batched floor"
#: ledgerq's units with nothing around them: the runtime's ceiling (bench/units.py).
UNITS = "units alone"
#: ledgerq's scenario with a Worker serving while the submitter submits.
WITH_WORKER = "ledgerq+Worker"


def fresh_path(workdir: Path, name: str) -> str:
    path = workdir / f"{name}.db"
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return str(path)


# ---------------------------------------------------------------- 1. the disk


def fsync_rate(workdir: Path, seconds: float = 1.0) -> float:
    """Small write + fsync per iteration: about what one durable commit costs the disk."""
    path = workdir / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        block = b"x" * 512
        count = 0
        start = time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            os.pwrite(fd, block, (count % 8) * 512)
            os.fsync(fd)
            count += 1
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return count / elapsed


# ---------------------------------------------------------------- 2. ledgerq


async def ledgerq_lifecycles(path: str, registry: Registry, sync: str, n: int,
                             limit: int) -> dict[str, float]:
    async with StateDB(path, registry=registry, synchronous=sync) as db:  # type: ignore[arg-type]
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            await submit_task(db, APP)
        t1 = time.perf_counter()
        done = passes = 0
        while done < n:
            claimed = await claim_and_execute(db, worker_id=WORKER, execute=noop, limit=limit)
            if claimed == 0:
                raise SystemExit(f"ledgerq: a pass claimed nothing with {n - done} rows left")
            done += claimed
            passes += 1
        t2, c2 = time.perf_counter(), time.process_time()
        row = await db.fetch_one(
            "SELECT (SELECT count(*) FROM schedule_runs WHERE status = 'completed') AS runs, "
            "(SELECT count(*) FROM status_transitions) AS facts")
        assert row is not None and row["runs"] == n and row["facts"] == 3 * n, row
    return {"lifecycle": n / (t2 - t0), "submit": n / (t1 - t0), "worker": n / (t2 - t1),
            "cpu_us": (c2 - c0) / n * 1e6, "passes": passes}


async def ledgerq_with_worker(path: str, registry: Registry, sync: str, n: int,
                              limit: int) -> dict[str, float]:
    """The same sequential submitter, with a Worker (capacity ``limit``) running meanwhile.

    What to measure if the target needs the runtime's concurrency: the
    worker's claims and terminal writes share the submitter's commits, and its Python
    runs while the submitter waits on fsync. lifecycles/s = N / (first submit to last
    completion).
    """
    async with StateDB(path, registry=registry, synchronous=sync) as db:  # type: ignore[arg-type]
        worker = Worker(db, worker_id=WORKER, capacity=limit, claim_limit=limit, execute=noop,
                        poll_interval=0.05, lock_dir=None, handle_signals=False)
        serving = asyncio.create_task(worker.run())
        await asyncio.sleep(0.1)  # registered and idle
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            await submit_task(db, APP)
        t1 = time.perf_counter()
        while sum(worker.outcomes.values()) < n:
            await asyncio.sleep(0.001)
        t2, c2 = time.perf_counter(), time.process_time()
        await worker.stop()
        await serving
        assert worker.outcomes["completed"] == n, worker.outcomes
    return {"lifecycle": n / (t2 - t0), "submit": n / (t1 - t0), "worker": n / (t2 - t0),
            "cpu_us": (c2 - c0) / n * 1e6}


# ---------------------------------------------------------------- 3. huey


def huey_cycles(path: str, sync: str, n: int) -> dict[str, float]:
    from huey import SqliteHuey
    from huey.storage import SqliteStorage

    if sync == "FULL":  # huey's own switch: fsync=True is PRAGMA synchronous = 2 (FULL)
        huey = SqliteHuey("bench", filename=path, fsync=True)
    else:
        class NormalSyncStorage(SqliteStorage):  # type: ignore[misc]
            def _create_connection(self) -> sqlite3.Connection:
                conn: sqlite3.Connection = super()._create_connection()
                conn.execute(f"PRAGMA synchronous = {sync}")
                return conn

        huey = SqliteHuey("bench", filename=path, storage_class=NormalSyncStorage)
    level = huey.storage.conn.execute("PRAGMA synchronous").fetchone()[0]
    mode = huey.storage.conn.execute("PRAGMA journal_mode").fetchone()[0]
    want = {"FULL": 2, "NORMAL": 1}[sync]
    assert level == want and mode == "wal", (level, mode)

    @huey.task()  # type: ignore[misc]
    def nothing() -> None:
        return None

    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        nothing()
    t1 = time.perf_counter()
    done = 0
    while (task := huey.dequeue()) is not None:
        huey.execute(task)
        done += 1
    t2, c2 = time.perf_counter(), time.process_time()
    assert done == n, done
    huey.storage.close()
    return {"lifecycle": n / (t2 - t0), "submit": n / (t1 - t0), "worker": n / (t2 - t1),
            "cpu_us": (c2 - c0) / n * 1e6}


# ---------------------------------------------------------------- 4. stdlib, 3 commits

STDLIB_DDL = """
CREATE TABLE IF NOT EXISTS tasks (
  id TEXT PRIMARY KEY, kind TEXT NOT NULL, args TEXT NOT NULL, status TEXT NOT NULL,
  queued_at REAL NOT NULL, leased_by TEXT, lease_expires_at REAL,
  lease_attempts INTEGER NOT NULL DEFAULT 0, ended_at REAL, exit_code INTEGER
);
CREATE INDEX IF NOT EXISTS tasks_queued ON tasks(queued_at, id) WHERE status = 'queued';
"""


def stdlib_three_commits(path: str, sync: str, n: int) -> dict[str, float]:
    conn = connect(path, sync)
    conn.executescript(STDLIB_DDL)
    x = conn.execute
    args = dumps(APP.args)
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        x("BEGIN IMMEDIATE")
        x("INSERT INTO tasks (id, kind, args, status, queued_at) VALUES (?, ?, ?, 'queued', ?)",
          (str(uuid.uuid4()), APP.action_kind, args, time.time()))
        x("COMMIT")
    t1 = time.perf_counter()
    done = 0
    while True:
        x("BEGIN IMMEDIATE")
        row = x("SELECT id, lease_attempts FROM tasks WHERE status = 'queued' "
                "ORDER BY queued_at, id LIMIT 1").fetchone()
        if row is None:
            x("COMMIT")
            break
        now = time.time()
        claimed = x("UPDATE tasks SET status = 'running', leased_by = ?, lease_expires_at = ?, "
                    "lease_attempts = ? WHERE id = ? AND status = 'queued' "
                    "AND lease_attempts = ?",
                    (WORKER, now + 300, row[1] + 1, row[0], row[1])).rowcount
        x("COMMIT")
        if claimed != 1:
            continue
        code = 0  # the no-op executor
        x("BEGIN IMMEDIATE")
        ended = x("UPDATE tasks SET status = 'completed', ended_at = ?, exit_code = ? "
                  "WHERE id = ? AND status = 'running' AND leased_by = ? "
                  "AND lease_expires_at = ?",
                  (time.time(), code, row[0], WORKER, now + 300)).rowcount
        x("COMMIT")
        done += ended
    t2, c2 = time.perf_counter(), time.process_time()
    conn.close()
    assert done == n, done
    return {"lifecycle": n / (t2 - t0), "submit": n / (t1 - t0), "worker": n / (t2 - t1),
            "cpu_us": (c2 - c0) / n * 1e6}


# ---------------------------------------------------------------- 5. submit_many vs raw


async def ledgerq_submit_many(path: str, registry: Registry, sync: str, n: int) -> float:
    apps = [TaskApplication("command", {"argv": ["true", str(i)]}, "host") for i in range(n)]
    async with StateDB(path, registry=registry, synchronous=sync) as db:  # type: ignore[arg-type]
        start = time.perf_counter()
        ids = await submit_many(db, apps)
        elapsed = time.perf_counter() - start
        assert len(ids) == n
        row = await db.fetch_one("SELECT count(*) AS c FROM status_transitions")
        assert row is not None and row["c"] == n, row
    return n / elapsed


# Non-NULL columns a submitted row leaves to their defaults; the fact's patch names them
# too (a creation fact leaves NULL columns out).
DEFAULTED = {"lease_attempts": 0, "run_attempts": 0}


def raw_submit_many(path: str, registry: Registry, sync: str, n: int) -> float:
    """The same rows and creation facts, built in Python and written by two executemany."""
    conn = connect(path, sync)
    conn.executescript(schema_ddl(registry))
    apps = [TaskApplication("command", {"argv": ["true", str(i)]}, "host") for i in range(n)]
    start = time.perf_counter()
    now = time.time()
    evidence = dumps([])
    runs: list[tuple[Any, ...]] = []
    facts: list[tuple[Any, ...]] = []
    for app in apps:
        rid = new_id()
        values = {
            "id": rid, "schedule_id": None, "invocation_id": None, "trigger_context": "{}",
            "action_kind": app.action_kind, "action_args": dumps(app.args), "status": "queued",
            "chain_depth": 0, "fired_at": now, "created_at": now, "queued_at": now,
            "concurrency_key": None,  # no serialization tokens, so no key
            "required_capabilities": dumps(app.required_capabilities),
            "execution_target": app.execution_target, "library_ref": None,
            "library_content_hash": None, "idempotency_key": None,
            "application_digest": digest(app), "retry_policy": None, "timeout_seconds": None,
            "depends_on": None, "version": 1, "status_reason_code": "run.queued.submitted",
            "status_reason_summary": "", "status_evidence_refs": evidence,
            "priority": 0, "queue": "default",
        }
        runs.append(tuple(values.values()))
        patch = {k: v for k, v in values.items()
                 if v is not None and k not in ("status", "version")}
        patch.update(DEFAULTED)
        facts.append((new_id(), "schedule_run", rid, None, "queued",
                      "run.queued.submitted", "", evidence, "system", "ledgerq.submit", now,
                      "{}", 1, dumps(patch), None))
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(RAW_RUN_INSERT, runs)
    conn.executemany(RAW_FACT_INSERT, facts)
    conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    (count,) = conn.execute("SELECT count(*) FROM status_transitions").fetchone()
    assert count == n, count
    conn.close()
    return n / elapsed


# ---------------------------------------------------------------- 6. claim pass vs queue depth


#: The claim-scale rows are spread over these queues and priorities (round robin): the
#: claiming worker serves two of the queues, so its pass merges two index ranges while
#: half the rows sit in queues it never reads, and most of its own below the top level.
BENCH_QUEUES = ("default", "batch", "ops", "bulk")
BENCH_PRIORITIES = (0, -5, 0, 3, 0, 10)
SERVED_QUEUES = ("default", "ops")


def populate_queued(path: str, registry: Registry, rows: int) -> None:
    """``rows`` queued schedule_runs written straight into the real schema (setup, untimed),
    spread over :data:`BENCH_QUEUES` and :data:`BENCH_PRIORITIES`."""
    conn = connect(path, "OFF")
    conn.execute("PRAGMA cache_size = -262144")
    conn.executescript(schema_ddl(registry))
    base = time.time() - rows  # oldest first, one second apart, all due
    args = dumps(APP.args)

    def gen() -> Any:
        for i in range(rows):
            t = base + i
            yield (str(uuid.uuid4()), t, "{}", "command", args, t, t, t, "[]", "host",
                   BENCH_QUEUES[i % len(BENCH_QUEUES)],
                   BENCH_PRIORITIES[(i // len(BENCH_QUEUES)) % len(BENCH_PRIORITIES)])

    conn.execute("BEGIN")
    conn.executemany(
        "INSERT INTO schedule_runs (id, status, version, created_at, trigger_context, "
        "action_kind, action_args, fired_at, queued_at, updated_at, required_capabilities, "
        "execution_target, queue, priority) "
        "VALUES (?, 'queued', 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", gen())
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("ANALYZE")
    conn.close()


async def give_back(db: StateDB, claimed: list[dict[str, Any]]) -> None:
    """Return claimed rows to the queue (untimed), as a worker shutting down does: the
    depth stays what it was, and the small queue does not run out over the passes."""
    for r in claimed:
        res = await transition(db, TransitionRequest(
            entity_type="schedule_run", entity_id=r["id"], from_state="running",
            to_state="queued", reason=StateReason(code="run.queued.worker_shutdown"),
            actor=Actor(type="system", id=WORKER), idempotency_key=""),
            guard={"lease_token": r["lease_token"]},
            patch={"leased_by": None, "lease_expires_at": None, "lease_token": None,
                   "queued_at": time.time()})
        assert res.applied, res


async def claim_pass_cost(paths: dict[int, str], registry: Registry, sync: str, passes: int
                          ) -> dict[int, float]:
    """Median seconds of one claim_runs(limit=20) pass per queue depth, by a worker
    serving :data:`SERVED_QUEUES`.

    Passes alternate between the databases, so a burst of load elsewhere on the machine
    hits every depth alike. Each pass claims 20 new rows (queued -> running, one fact each)
    and commits them together: the highest-priority oldest rows of the two queues, which
    it checks.
    """
    dbs = {rows: StateDB(p, registry=registry, synchronous=sync)  # type: ignore[arg-type]
           for rows, p in paths.items()}
    times: dict[int, list[float]] = {rows: [] for rows in dbs}
    try:
        for db in dbs.values():
            await db.open()
            # warm the page cache
            await give_back(db, (await claim_runs(db, worker_id=WORKER, limit=20,
                                                  queues=SERVED_QUEUES)).claimed)
        for _ in range(passes):
            for rows, db in dbs.items():
                start = time.perf_counter()
                got = await claim_runs(db, worker_id=WORKER, limit=20, queues=SERVED_QUEUES)
                times[rows].append(time.perf_counter() - start)
                assert len(got.claimed) == 20, (len(got.claimed), got.scanned)
                assert {r["queue"] for r in got.claimed} <= set(SERVED_QUEUES)
                # Every row claimed is at the top of the order (the top level of this
                # layout holds far more rows than the passes take).
                assert {r["priority"] for r in got.claimed} == {max(BENCH_PRIORITIES)}, got
                await give_back(db, got.claimed)
    finally:
        for db in dbs.values():
            await db.close()
    return {rows: statistics.median(t) for rows, t in times.items()}


# ---------------------------------------------------------------- driver


def load_average() -> str:
    """Other processes on the machine move every figure here: print how busy it was."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def fmt_rate(value: float) -> str:
    return f"{value:>10,.0f}"


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true",
                    help="small sizes (n=1000, submit_many 2000, claim depth 100k)")
    ap.add_argument("--n", type=int, default=None,
                    help="tasks per lifecycle measurement (default 1000)")
    ap.add_argument("--limit", type=int, default=20,
                    help="claim limit per worker pass for ledgerq (20, the default of "
                         "claim_and_execute)")
    ap.add_argument("--batch", type=int, default=None,
                    help="apps per submit_many call (default 10000; --quick 2000)")
    ap.add_argument("--depth", type=int, default=None,
                    help="deep queue for the claim-scaling pass (default 1M; --quick 100k)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="lifecycle rounds (each system once per round, interleaved), "
                         "report medians (default 7; --quick 1)")
    ap.add_argument("--synchronous", choices=["FULL", "NORMAL", "both"], default="both",
                    type=lambda s: s if s == "both" else s.upper())
    ap.add_argument("--skip", action="append", default=[],
                    choices=["lifecycle", "submit_many", "claim"], help="skip a section")
    ap.add_argument("--profile", choices=["lifecycle", "submit_many"], default=None,
                    help="run only that ledgerq measurement under cProfile")
    ap.add_argument("--dir", default=None, help="directory for the database files (a tempdir)")
    args = ap.parse_args(argv)

    n = args.n or 1000
    args.repeat = args.repeat or (1 if args.quick else 7)
    batch = args.batch or (2000 if args.quick else 10000)
    depth = args.depth or (100_000 if args.quick else 1_000_000)
    syncs = ["FULL", "NORMAL"] if args.synchronous == "both" else [args.synchronous]
    registry = default_registry()

    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-", dir=args.dir) as tmp:
        workdir = Path(tmp)
        if args.profile:
            return profile(args.profile, workdir, registry, syncs[0], n, batch, args.limit)
        print(f"ledgerq queue benchmark: python {platform.python_version()}, "
              f"sqlite {sqlite3.sqlite_version}, {os.cpu_count()} cpu(s), "
              f"{platform.machine()}, files in {tmp}, load average {load_average()}")
        fsync_before = fsync_rate(workdir)
        print(f"fsync rate: {fsync_before:,.0f}/s", flush=True)

        lifecycle: dict[tuple[str, str], list[dict[str, float]]] = {}
        if "lifecycle" not in args.skip:
            # warm-up: imports, pydantic/msgspec first calls, the temp dir's page cache
            asyncio.run(ledgerq_lifecycles(fresh_path(workdir, "warm"), registry, "NORMAL",
                                           min(n, 200), args.limit))
            huey_cycles(fresh_path(workdir, "warm-huey"), "NORMAL", min(n, 200))
            systems: dict[str, Callable[[str, str], dict[str, float]]] = {
                "ledgerq": lambda p, s: asyncio.run(
                    ledgerq_lifecycles(p, registry, s, n, args.limit)),
                "huey SqliteHuey": lambda p, s: huey_cycles(p, s, n),
                "stdlib 3-commit": lambda p, s: stdlib_three_commits(p, s, n),
                WITH_WORKER: lambda p, s: asyncio.run(
                    ledgerq_with_worker(p, registry, s, n, args.limit)),
                FLOOR: lambda p, s: schema_floor(p, registry, s, n, args.limit),
                UNITS: lambda p, s: units_lifecycles(p, registry, s, n, args.limit),
                BATCHED: lambda p, s: schema_floor(p, registry, s, n, args.limit,
                                                   batched=True),
            }
            names = list(systems)
            for r in range(args.repeat):
                for sync in syncs:
                    # Interleaved rounds, the order rotated each round: a slow spell of
                    # the disk hits every system alike, and none always runs first.
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        tag = f"{name.split()[0]}-{sync}-{r}"
                        path = fresh_path(workdir, tag)
                        lifecycle.setdefault((name, sync), []).append(systems[name](path, sync))
                        for suffix in ("", "-wal", "-shm"):
                            Path(f"{path}{suffix}").unlink(missing_ok=True)

        many: dict[str, float] = {}
        if "submit_many" not in args.skip:
            sync = syncs[0]
            got: dict[str, list[float]] = {"raw": [], "ledgerq": []}
            for i in range(MANY_REPEAT):  # interleaved: drift hits both sides alike
                got["raw"].append(
                    raw_submit_many(fresh_path(workdir, f"raw-many-{i}"), registry, sync, batch))
                got["ledgerq"].append(asyncio.run(ledgerq_submit_many(
                    fresh_path(workdir, f"many-{i}"), registry, sync, batch)))
            many = {k: statistics.median(v) for k, v in got.items()}

        claim: dict[int, float] = {}
        if "claim" not in args.skip:
            paths = {rows: fresh_path(workdir, f"claim-{rows}") for rows in (1000, depth)}
            for rows, p in paths.items():
                populate_queued(p, registry, rows)
            claim = asyncio.run(claim_pass_cost(paths, registry, "NORMAL", CLAIM_PASSES))
        fsync_after = fsync_rate(workdir)

    print(f"fsync rate after: {fsync_after:,.0f}/s, load average {load_average()}")
    print(f"lifecycle: n={n} tasks, one sequential submitter, then worker passes "
          f"(claim_and_execute limit={args.limit}, no-op executor); median of {args.repeat}")
    print()
    if lifecycle:
        print(f"{'system':<16} {'sync':<6} {'lifecycles/s':>12} {'submit/s':>10} "
              f"{'worker/s':>10} {'us/lifecycle':>12} {'cpu us/lc':>9}")
        med: dict[tuple[str, str], dict[str, float]] = {}
        for (name, sync), runs in lifecycle.items():
            med[name, sync] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for sync in syncs:
            for name in ("ledgerq", WITH_WORKER, "huey SqliteHuey", "stdlib 3-commit", FLOOR,
                         BATCHED, UNITS):
                m = med[name, sync]
                print(f"{name:<16} {sync:<6} {m['lifecycle']:>12,.0f} {fmt_rate(m['submit'])} "
                      f"{fmt_rate(m['worker'])} {1e6 / m['lifecycle']:>12.0f} "
                      f"{m['cpu_us']:>9.0f}")
        print()
        print(f"ratios: median over the {args.repeat} round(s) of each round's own ratio "
              "[min, max]")

        def ratio(a: str, b: str, sync: str, key: str = "lifecycle") -> Ratio:
            return rounds_ratio([x[key] for x in lifecycle[a, sync]],
                                [y[key] for y in lifecycle[b, sync]])

        def met(a: str, b: str, sync: str, goal: float, key: str = "lifecycle",
                below: bool = False) -> str:
            m = ratio(a, b, sync, key).median
            return verdict(m <= goal if below else m >= goal)

        for sync in syncs:
            print(f"{sync:<6} ledgerq / schema floor         = {ratio('ledgerq', FLOOR, sync)}"
                  f"   (target >= 0.8x: {met('ledgerq', FLOOR, sync, 0.8)})")
            print(f"{'':<6} ledgerq / batched floor        = "
                  f"{ratio('ledgerq', BATCHED, sync)}")
            print(f"{'':<6} CPU per lifecycle, ledgerq / schema floor = "
                  f"{ratio('ledgerq', FLOOR, sync, 'cpu_us')}   (target <= 1.5x: "
                  f"{met('ledgerq', FLOOR, sync, 1.5, 'cpu_us', below=True)})")
            print(f"{'':<6} CPU per lifecycle, ledgerq / batched floor = "
                  f"{ratio('ledgerq', BATCHED, sync, 'cpu_us')}")
            print(f"{'':<6} ceiling, units alone / schema floor = "
                  f"{ratio(UNITS, FLOOR, sync)}, CPU {ratio(UNITS, FLOOR, sync, 'cpu_us')}; "
                  f"ledgerq / units alone = {ratio('ledgerq', UNITS, sync)}, CPU "
                  f"{ratio('ledgerq', UNITS, sync, 'cpu_us')}")
            print(f"{'':<6} with a Worker serving, / schema floor = "
                  f"{ratio(WITH_WORKER, FLOOR, sync)}")
            print(f"{'':<6} beside: ledgerq / SqliteHuey = "
                  f"{ratio('ledgerq', 'huey SqliteHuey', sync)}, schema floor / SqliteHuey = "
                  f"{ratio(FLOOR, 'huey SqliteHuey', sync)}, ledgerq / stdlib 3-commit = "
                  f"{ratio('ledgerq', 'stdlib 3-commit', sync)}")
        print()
    if many:
        ratio = many["ledgerq"] / many["raw"]
        print(f"submit_many of {batch} apps ({syncs[0]}, median of {MANY_REPEAT}): "
              f"ledgerq {many['ledgerq']:,.0f} rows/s, raw executemany + log rows "
              f"{many['raw']:,.0f} rows/s")
        print(f"submit_many / raw = {ratio:.2f}x   (target >= 0.5x: {verdict(ratio >= 0.5)})")
        print()
    if claim:
        small, big = claim[1000], claim[depth]
        ratio = big / small
        print(f"claim pass (claim_runs limit=20, queues {'+'.join(SERVED_QUEUES)} of "
              f"{len(BENCH_QUEUES)}, {len(set(BENCH_PRIORITIES))} priorities, NORMAL, "
              f"median of {CLAIM_PASSES}): "
              f"{small * 1e3:.2f} ms at 1k queued, {big * 1e3:.2f} ms at {depth:,} queued")
        print(f"claim {depth:,} / 1k = {ratio:.2f}x   (target <= 1.5x: {verdict(ratio <= 1.5)})")
    return 0


def profile(which: str, workdir: Path, registry: Registry, sync: str, n: int, batch: int,
            limit: int) -> int:
    import cProfile
    import pstats

    prof = cProfile.Profile()
    coro: Any
    if which == "lifecycle":
        coro = ledgerq_lifecycles(fresh_path(workdir, "prof"), registry, sync, n, limit)
    else:
        coro = ledgerq_submit_many(fresh_path(workdir, "prof"), registry, sync, batch)
    prof.enable()
    result = asyncio.run(coro)
    prof.disable()
    print(f"{which} ({sync}) under cProfile: {result}  (cProfile sees the event-loop "
          "thread only; aiosqlite's thread runs the SQL)")
    order, lines = os.environ.get("PROF_SORT", "tottime"), int(os.environ.get("PROF_N", "30"))
    pstats.Stats(prof, stream=sys.stdout).sort_stats(order).print_stats(lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
