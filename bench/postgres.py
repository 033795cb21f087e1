"""Task lifecycles per second on PostgreSQL: a plain-psycopg floor, PgQueuer, Procrastinate
and (once its PostgreSQL backend opens) ledgerq, in one run on the local server.

A lifecycle is: enqueue one task, a worker claims it, the worker marks it complete. Every
measurement gets its own scratch database ``ledgerq_bench_<pid>_<k>``, created from the
admin ``--dsn`` and dropped right after (any left by a failure are dropped at exit); no
other database is touched. Scenarios (bench/pg_peers/harness.py has the details):

  submit single  N submits, one transaction each, from one caller
  submit bulk    N submits in one call / transaction
  drain 1        N pre-filled tasks claimed and completed by 1 worker process
  drain W        the same with W worker processes (--workers, default 4)
  end to end     W idle workers while one caller submits N one at a time: N / (first
                 submit .. Nth completion committed)

Figures are tasks per second; for the drains and end to end, lifecycles per second.
Completion is counted in the database (every 5 ms near the end, less often before), never
in the worker, so buffered completions (PgQueuer) count only once they commit. Worker
processes start, import and connect before the clock starts.

Systems:

  floor          plain psycopg 3 (sync), the fewest statements and commits: INSERT per
                 submit (COPY for bulk); claim = SELECT ... FOR UPDATE SKIP LOCKED + UPDATE
                 to running in one transaction, complete = a second UPDATE transaction;
                 one task in flight per process (bench/pg_peers/floor.py)
  floor+log      the same plus one log row per state change, in the same transaction
                 (ledgerq writes a fact per move)
  floor+log/B    the batched floor (a floor batches where the engine does, so the
                 ratio stays honest): up to B jobs claimed as one guarded UPDATE ... RETURNING
                 plus one multi-row log INSERT in one transaction, then completed the
                 same way in a second; B = BATCH (25), the batch PgQueuer and ledgerq
                 take here too. Drains and end to end only (its submits are floor+log's)
  schema-floor   ledgerq's own rows and facts (its schema: the 42-column run row with its
                 indexes, a fact with its patch per move), written by the fewest
                 statements plain psycopg can write them with: per pass of up to B, the
                 claims with their facts as one statement, then the terminal writes with
                 theirs as another (two transactions; no choice read, heartbeat or
                 dependents check). Drains only; its fill is ledgerq's submit_many. What a
                 drain of ledgerq's rows and facts can reach here, whatever the runtime
                 (bench/pg_peers/schema_floor.py; tests/project/test_bench_schema_floor.py checks
                 it writes what a Worker writes)
  ledgerq-sql    submit single: the one statement ledgerq sends for a plain submit (its
                 row and creation fact; captured from ledgerq itself), run by plain
                 psycopg on ledgerq's schema as a transaction of its own, with fresh ids
                 and times: the bound of ledgerq's single submit, with none of its Python;
                 beside it the same statement sent from a pool thread (run_in_executor),
                 from the event loop on an asyncio connection (the way ledgerq sends
                 it), and from the event loop on asyncpg (PgQueuer's driver)
                 submit bulk: no statement at all, only the Python submit_many runs per
                 row before its statements (each application validated, its row built
                 and checked against the spec, its creation fact encoded): a bound on
                 ledgerq's bulk submit that no choice of statements can pass
  ledgerq-units  ledgerq's own in-transaction units (the submit's; a Worker pass's choice
                 read, claims and outcomes), called in a plain loop on a synchronous
                 psycopg connection: no event loop, thread hops, pool or supervision. A
                 ceiling for ledgerq's runtime (bench/pg_peers/ledgerq_units.py)
  PgQueuer       asyncpg driver, batch_size BATCH, completions buffered in memory (see
                 bench/pg_peers/pgqueuer_peer.py for what that means for durability)
  Procrastinate  psycopg async connector, concurrency 10 per worker process
  ledgerq        StateDB(postgresql://...), submit_task / submit_many,
                 Worker(capacity=BATCH, claim_limit=BATCH)

Ratios are per scenario: ledgerq over PgQueuer and over the floors (when ledgerq ran),
PgQueuer over the floors. With --rounds R every system runs once a round, in turn, so a
slow spell of the machine hits both sides of a ratio alike: the table shows each
figure's median, and every ratio is the median of the rounds' own ratios (the PostgreSQL
target is judged on those, with their spread).

    .venv/bin/python bench/postgres.py                  # all systems, N=2000 (~60 s)
    .venv/bin/python bench/postgres.py --rounds 3       # interleaved rounds, medians
    .venv/bin/python bench/postgres.py --only pgqueuer ledgerq --n 500
"""

# ruff: noqa: E402  (the imports below must follow the sys.path fix)
from __future__ import annotations

import os
import sys

# Python puts a script's own directory first on sys.path, where bench/queue.py would
# shadow the standard library's ``queue`` (which asyncio and multiprocessing import).
# Drop that entry before importing anything else; it comes back last, for pg_peers.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import argparse
import asyncio
import math
import platform
import re
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from multiprocessing.synchronize import Barrier, Event
from typing import Any

import msgspec
import psycopg

sys.path.append(_HERE)  # last, so the stdlib's queue still wins; for pg_peers
from pg_peers import floor  # importable only after the line above
from pg_peers.harness import BATCH, SCENARIOS, Peer, Scratch, measure
from rounds import Ratio
from rounds import ratio as rounds_ratio

SYSTEMS = ["floor", "floor+log", "floor+log/batch", "schema-floor", "ledgerq-sql",
           "ledgerq-units", "pgqueuer", "procrastinate", "ledgerq", "ledgerq-tasks"]
#: The scenarios the batched floor runs: its submits are floor+log's.
BATCHED_SCENARIOS = ["drain 1", "drain W", "end to end"]
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


# =========================================================================== ledgerq
# LEDGERQ: the system under test. Skipped (with a printed note) until
# ledgerq.StateDB("postgresql://...") opens; the body below is the intended benchmark,
# built only on the public API, in the same harness and scenarios as the peers.

#: A Worker's capacity and its claim limit (its claim pass's size): the batch PgQueuer takes.
#: (The claim limit defaults to 20: left at that, passes were of 20, not 25.)
LEDGERQ_CAPACITY = BATCH
LEDGERQ_DONE_SQL = "SELECT count(*) FROM schedule_runs WHERE status = 'completed'"


def _ledgerq_app() -> Any:
    from ledgerq.queue import TaskApplication

    return TaskApplication("command", {"argv": ["true"]}, "host")


async def _ledgerq_install(dsn: str) -> None:
    from ledgerq import StateDB

    async with StateDB(dsn):  # opening an empty database creates the schema
        pass


async def _ledgerq_submit(dsn: str, n: int, bulk: bool) -> float:
    from ledgerq import StateDB
    from ledgerq.queue import submit_many, submit_task

    app = _ledgerq_app()
    async with StateDB(dsn) as db:
        t0 = time.perf_counter()
        if bulk:
            await submit_many(db, [app] * n)
        else:
            for _ in range(n):
                await submit_task(db, app)
        return time.perf_counter() - t0


async def _noop_execute(run: dict[str, Any]) -> tuple[int, str]:
    return 0, ""


async def _ledgerq_serve(dsn: str, idx: int, barrier: Barrier, stop: Event) -> None:
    from ledgerq import StateDB
    from ledgerq.queue import Worker

    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-locks-") as lock_dir:
        async with StateDB(dsn) as db:
            worker = Worker(db, worker_id=f"bench-{idx}-{os.getpid()}",
                            capacity=LEDGERQ_CAPACITY, claim_limit=LEDGERQ_CAPACITY,
                            execute=_noop_execute,
                            lock_dir=lock_dir, handle_signals=False)
            barrier.wait()
            task = asyncio.create_task(worker.run())
            # The parent decides when the scenario is over: it counts completed rows.
            while not stop.is_set() and not task.done():
                await asyncio.sleep(0.01)
            await worker.stop()
            await task


def _ledgerq_worker(dsn: str, idx: int, barrier: Barrier, stop: Event) -> None:
    asyncio.run(_ledgerq_serve(dsn, idx, barrier, stop))


def _ledgerq_peer() -> Peer:
    return Peer(
        name="ledgerq",
        install=lambda dsn: asyncio.run(_ledgerq_install(dsn)),
        submit_single=lambda dsn, n: asyncio.run(_ledgerq_submit(dsn, n, bulk=False)),
        submit_bulk=lambda dsn, n: asyncio.run(_ledgerq_submit(dsn, n, bulk=True)),
        worker=_ledgerq_worker,
        done_sql=LEDGERQ_DONE_SQL,
    )


def _capture_submit(dsn: str) -> tuple[str, dict[str, Any], tuple[Any, ...]]:
    """The statement text, row and fact of one plain submit_task, as ledgerq sends them."""
    from ledgerq import StateDB
    from ledgerq.queue import submit_task
    from ledgerq.store.postgres.tx import PostgresTx

    seen: dict[str, Any] = {}
    real_insert, real_take = PostgresTx.insert_entities_with_facts, PostgresTx.take_alone

    def insert(self: Any, policy: Any, columns: Any, rows: Any, stored: Any) -> None:
        seen.update(row=dict(zip(columns, rows[0][0], strict=True)), fact=tuple(rows[0][1]))
        real_insert(self, policy, columns, rows, stored)

    def take(self: Any) -> tuple[str, Any] | None:
        held: tuple[str, Any] | None = real_take(self)
        if held is not None:
            seen["sql"] = held[0]
        return held

    async def one() -> None:
        async with StateDB(dsn) as db:
            await submit_task(db, _ledgerq_app())

    PostgresTx.insert_entities_with_facts, PostgresTx.take_alone = insert, take  # type: ignore[method-assign]
    try:
        asyncio.run(one())
    finally:
        PostgresTx.insert_entities_with_facts, PostgresTx.take_alone = real_insert, real_take  # type: ignore[method-assign]
    if "sql" not in seen:
        raise RuntimeError("a plain submit did not run as one statement of its own")
    return seen["sql"], seen["row"], seen["fact"]


def run_ledgerq_sql(scratch: Scratch, n: int) -> dict[str, float]:
    """LEDGERQ-SQL: ledgerq's submit statement, plain psycopg, autocommit, one per submit."""
    name, dsn = scratch.create()
    try:
        asyncio.run(_ledgerq_install(dsn))
        sql, row, fact = _capture_submit(dsn)
        times = [k for k in ("fired_at", "created_at", "queued_at") if k in row]
        patch = msgspec.json.decode(fact[13])

        def params() -> list[Any]:
            rid, now = str(uuid.uuid4()), time.time()
            values = {**row, "id": rid, **dict.fromkeys(times, now)}
            fresh = {**patch, "id": rid, **dict.fromkeys(set(times) & patch.keys(), now)}
            return [*values.values(), str(uuid.uuid4()), fact[1], rid, *fact[3:10], now,
                    *fact[11:13], msgspec.json.encode(fresh).decode(), *fact[14:]]

        with psycopg.connect(dsn, autocommit=True) as conn:
            t0 = time.perf_counter()
            for _ in range(n):
                conn.execute(sql, params())
            seconds = time.perf_counter() - t0
            hop = asyncio.run(_from_a_thread(conn, sql, params, n))
        looped = asyncio.run(_from_the_loop(dsn, sql, params, n))
        on_asyncpg = asyncio.run(_from_the_loop_on_asyncpg(dsn, sql, params, n))
        print(f"  {'ledgerq-sql':<14} {'submit single':<14} {n / seconds:9.0f} /s  "
              f"({seconds:.2f} s); sent from a pool thread {n / hop:9.0f} /s ({hop:.2f} s); "
              f"from the loop {n / looped:9.0f} /s ({looped:.2f} s); from the loop on "
              f"asyncpg {n / on_asyncpg:9.0f} /s ({on_asyncpg:.2f} s)", flush=True)
        bulk = _ledgerq_rows_alone(n)
        print(f"  {'ledgerq-sql':<14} {'submit bulk':<14} {n / bulk:9.0f} /s  "
              f"({bulk:.2f} s, no database)", flush=True)
        return {"submit single": n / seconds, "submit bulk": n / bulk,
                "submit single, from a thread": n / hop,
                "submit single, from the loop": n / looped,
                "submit single, from the loop on asyncpg": n / on_asyncpg}
    finally:
        scratch.drop(name)


async def _from_the_loop(dsn: str, sql: str, params: Callable[[], list[Any]],
                         n: int) -> float:
    """Seconds for ``n`` of the statement, each sent from the event loop on an asyncio
    connection (psycopg's ``AsyncConnection``, autocommit), as ledgerq's PostgreSQL store
    sends a unit of one unread statement (``write(alone=True)``: a plain submit): the
    asyncio driver's cost, and nothing of ledgerq's own."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        t0 = time.perf_counter()
        for _ in range(n):
            await conn.execute(sql, params())
        return time.perf_counter() - t0


async def _from_the_loop_on_asyncpg(dsn: str, sql: str, params: Callable[[], list[Any]],
                                    n: int) -> float:
    """:func:`_from_the_loop` on asyncpg, PgQueuer's driver (its placeholders ``$1``..):
    whether psycopg's asyncio send is what holds ledgerq's single submit below PgQueuer's
    (docs/decisions.md chose psycopg, whose units run the same code in a pool thread)."""
    import asyncpg

    numbered = iter(range(1, sql.count("%s") + 1))
    text = re.sub(r"%[s%]", lambda m: f"${next(numbered)}" if m[0] == "%s" else "%", sql)
    conn = await asyncpg.connect(dsn)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            await conn.execute(text, *params())
        return time.perf_counter() - t0
    finally:
        await conn.close()


async def _from_a_thread(conn: psycopg.Connection[Any], sql: str,
                         params: Callable[[], list[Any]], n: int) -> float:
    """Seconds for ``n`` of the statement, each sent from a worker thread while the event
    loop awaits it, as ledgerq's PostgreSQL store sends every unit but those of one
    unread statement (``run_in_executor`` on its pool's threads): the hop there and
    back, and nothing of ledgerq's own."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1) as executor:
        t0 = time.perf_counter()
        for _ in range(n):
            await loop.run_in_executor(executor, conn.execute, sql, params())
        return time.perf_counter() - t0


def _ledgerq_rows_alone(n: int) -> float:
    """Seconds for the per-row Python of submit_many(n): validation, the row and its
    checks, the creation fact (as create_entities encodes it), without any statement."""
    import socket

    from ledgerq.codec import dumps
    from ledgerq.lifecycle.creation import _creation_row, _initial_patch
    from ledgerq.lifecycle.facts import Fact
    from ledgerq.lifecycle.ids import new_id
    from ledgerq.lifecycle.models import StateReason
    from ledgerq.lifecycle.registry import default_registry
    from ledgerq.queue import moves
    from ledgerq.queue.submission.application import DEFAULT_LIMITS, digest, validate
    from ledgerq.queue.submission.submit import SUBMITTER, run_row

    policy = default_registry().entity("schedule_run")
    reason = moves.SUBMITTED
    apps = [_ledgerq_app()] * n
    t0 = time.perf_counter()
    now, host = time.time(), socket.gethostname()
    checked = [validate(a, limits=DEFAULT_LIMITS) for a in apps]
    why = StateReason(code=reason.code)
    rows = [_creation_row(policy, run_row(a, now, host, reason.target, [], digest(a),
                                          policy=policy), why, now) for a in checked]
    facts = [tuple.__new__(Fact, (
        new_id(), policy.name, r["id"], None, r["status"], why.code, why.summary, "[]",
        SUBMITTER.type, SUBMITTER.id, now, "{}", 1, dumps(_initial_patch(r, policy)), None))
        for r in rows]
    assert len(facts) == n
    return time.perf_counter() - t0


def ledgerq_available(scratch: Scratch) -> str | None:
    """None if StateDB opens a postgresql:// URL here, else why not."""
    try:
        import ledgerq  # noqa: F401
    except Exception as exc:
        return f"import ledgerq failed: {type(exc).__name__}: {exc}"
    name, dsn = scratch.create()
    try:
        asyncio.run(_ledgerq_install(dsn))
    except Exception as exc:
        return f"StateDB(postgresql://...) did not open: {type(exc).__name__}: {exc}"
    finally:
        scratch.drop(name)
    return None


def run_ledgerq(dsn: str, n: int, workers: int = 4,
                scratch: Scratch | None = None) -> dict[str, float]:
    """LEDGERQ: lifecycles/s per scenario; {} (and a printed note) until the backend opens.

    ``dsn`` is the admin DSN: every scenario runs in its own scratch database.
    """
    own = scratch is None
    scratch = scratch if scratch is not None else Scratch(dsn)
    try:
        why = ledgerq_available(scratch)
        if why is not None:
            print(f"  ledgerq PostgreSQL backend not available ({why}); skipped")
            return {}
        return measure(_ledgerq_peer(), scratch, n, workers)
    finally:
        if own:
            scratch.drop_all()


# =========================================================================== report

def _peer_for(system: str) -> Peer:
    if system == "floor":
        return floor.peer(log=False)
    if system == "floor+log":
        return floor.peer(log=True)
    if system == "floor+log/batch":
        return floor.peer(log=True, batch=BATCH)
    if system == "schema-floor":
        from pg_peers import schema_floor
        return schema_floor.peer()
    if system == "ledgerq-units":
        from pg_peers import ledgerq_units
        return ledgerq_units.peer()
    if system == "pgqueuer":
        from pg_peers import pgqueuer_peer
        return pgqueuer_peer.peer()
    if system == "procrastinate":
        from pg_peers import procrastinate_peer
        return procrastinate_peer.peer()
    if system == "ledgerq-tasks":
        from pg_peers import ledgerq_tasks
        return ledgerq_tasks.peer()
    raise ValueError(system)


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def _fmt(x: float | None, ratio: bool = False) -> str:
    if x is None:
        return "-"
    if math.isnan(x):
        return "failed"
    return f"{x:.2f}x" if ratio else f"{x:,.0f}"


#: Per round, per system, per figure: what that round measured.
Rounds = list[dict[str, dict[str, float]]]


def _figure(rounds: Rounds, system: str, figure: str) -> float | None:
    """The median over the rounds that measured it (NaN where every one failed)."""
    got = [r[system][figure] for r in rounds if figure in r.get(system, {})]
    finite = [x for x in got if not math.isnan(x)]
    return statistics.median(finite) if finite else (math.nan if got else None)


def _ratio(rounds: Rounds, a: str, fa: str, b: str, fb: str) -> Ratio | None:
    """``a``'s figure ``fa`` over ``b``'s ``fb``: the median of each round's own ratio
    (rounds where either failed left out)."""
    tops, bottoms = [], []
    for r in rounds:
        x, y = r.get(a, {}).get(fa), r.get(b, {}).get(fb)
        if x is not None and y is not None and not math.isnan(x) and not math.isnan(y):
            tops.append(x)
            bottoms.append(y)
    return rounds_ratio(tops, bottoms) if tops else None


def print_table(rounds: Rounds, workers: int) -> None:
    cols = [c.replace(" W", f" {workers}") for c in SCENARIOS]
    width = max(len(c) for c in cols) + 2
    label_w = 26

    def line(label: str, cells: list[str]) -> None:
        print(f"{label:<{label_w}}" + "".join(f"{c:>{width}}" for c in cells))

    print()
    line("tasks or lifecycles /s" + (f", median of {len(rounds)}" if len(rounds) > 1 else ""),
         cols)
    line("-" * (label_w - 2), ["-" * (width - 2)] * len(cols))
    names = {"floor": "floor (psycopg)", "floor+log": "floor + log row",
             "floor+log/batch": f"batched floor + log, {BATCH}",
             "schema-floor": f"ledgerq's schema floor, {BATCH}",
             "ledgerq-sql": "ledgerq's statement",
             "ledgerq-units": "ledgerq's units alone",
             "pgqueuer": "PgQueuer", "procrastinate": "Procrastinate", "ledgerq": "ledgerq",
             "ledgerq-tasks": "ledgerq, Python tasks"}
    systems = [s for s in SYSTEMS if any(s in r for r in rounds)]
    for system in systems:
        line(names[system], [_fmt(_figure(rounds, system, s)) for s in SCENARIOS])

    ratios = [("ledgerq / PgQueuer", "ledgerq", "pgqueuer"),
              ("ledgerq / its statement", "ledgerq", "ledgerq-sql"),
              ("its statement / PgQueuer", "ledgerq-sql", "pgqueuer"),
              ("ledgerq / its units alone", "ledgerq", "ledgerq-units"),
              ("its units alone / PgQueuer", "ledgerq-units", "pgqueuer"),
              ("ledgerq / its schema floor", "ledgerq", "schema-floor"),
              ("its schema floor / PgQueuer", "schema-floor", "pgqueuer"),
              ("ledgerq / batched floor", "ledgerq", "floor+log/batch"),
              ("ledgerq / floor + log", "ledgerq", "floor+log"),
              ("ledgerq / floor", "ledgerq", "floor"),
              ("batched floor / PgQueuer", "floor+log/batch", "pgqueuer"),
              ("PgQueuer / floor + log", "pgqueuer", "floor+log"),
              ("PgQueuer / floor", "pgqueuer", "floor")]
    printed = False
    for label, a, b in ratios:
        cells = [_ratio(rounds, a, s, b, s) for s in SCENARIOS]
        if not any(cells):
            continue
        if not printed:
            print()
            printed = True
        line(label, [f"{c.median:.2f}x" if c else "-" for c in cells])
    print()
    print_target(rounds, workers)


def print_target(rounds: Rounds, workers: int) -> None:
    """The PostgreSQL target, judged on this run: each ratio (the median of the rounds'
    own, with their spread), and beside it the bound a floor measured in the same rounds
    puts on it (a bound under 1.0x: out of reach)."""
    def ratio(a: str, b: str, scenario: str, fa: str | None = None) -> Ratio | None:
        return _ratio(rounds, a, fa or scenario, b, scenario)

    def judged(value: Ratio | None, target: float) -> str:
        if value is None:
            return "not measured"
        return f"{value} (>= {target:.1f}x: {'met' if value.median >= target else 'NOT met'})"

    def bound(value: Ratio | None, what: str) -> str:
        if value is None:
            return ""
        reach = ("out of reach for any system that runs it" if value.median < 1.0
                 else "within reach")
        return f"\n      bound: {what} / PgQueuer = {value}, {reach}"

    def shown(value: Ratio | None) -> str:
        return "not measured" if value is None else str(value)

    units = "ledgerq's units alone (no event loop, thread hops or pool)"
    single = "submit single"
    print("PostgreSQL target (ledgerq >= 1.0x PgQueuer; >= 0.7x the plain-psycopg floor):")
    print("  submit single, ledgerq / PgQueuer = "
          + judged(ratio("ledgerq", "pgqueuer", single), 1.0)
          + bound(ratio("ledgerq-sql", "pgqueuer", single),
                  "ledgerq's own statement alone (plain psycopg, no Python around it)")
          + bound(ratio("ledgerq-sql", "pgqueuer", single, f"{single}, from the loop"),
                  "the same statement sent from the event loop on an asyncio connection, "
                  "as ledgerq sends it")
          + bound(ratio("ledgerq-sql", "pgqueuer", single,
                        f"{single}, from the loop on asyncpg"),
                  "the same statement sent from the event loop on asyncpg, PgQueuer's driver")
          + bound(ratio("ledgerq-sql", "pgqueuer", single, f"{single}, from a thread"),
                  "the same statement sent from a pool thread, as ledgerq once sent it")
          + bound(ratio("ledgerq-units", "pgqueuer", single), units))
    print("  submit bulk, ledgerq / PgQueuer = "
          + judged(ratio("ledgerq", "pgqueuer", "submit bulk"), 1.0)
          + bound(ratio("schema-floor", "pgqueuer", "submit bulk"),
                  "ledgerq's schema floor (two COPYs of the rows and facts it writes, "
                  "no Python)")
          + bound(ratio("ledgerq-sql", "pgqueuer", "submit bulk"),
                  "its per-row Python alone (validation, rows, facts; no database)")
          + "\n      beside: ledgerq / its schema floor = "
          + shown(ratio("ledgerq", "schema-floor", "submit bulk")))
    print(f"  drain {workers}, ledgerq / PgQueuer = "
          + judged(ratio("ledgerq", "pgqueuer", "drain W"), 1.0)
          + bound(ratio("schema-floor", "pgqueuer", "drain W"),
                  f"ledgerq's schema floor (its rows and facts, {BATCH} at a time, "
                  "two statements a pass)")
          + bound(ratio("ledgerq-units", "pgqueuer", "drain W"), units)
          + f"\n      beside: the batched floor + log ({BATCH} at a time, a narrow row "
          "and log) / PgQueuer = " + shown(ratio("floor+log/batch", "pgqueuer", "drain W")))
    print(f"  drain {workers}, ledgerq / its schema floor = "
          + judged(ratio("ledgerq", "schema-floor", "drain W"), 0.7)
          + "\n      beside: / batched floor + log = "
          + shown(ratio("ledgerq", "floor+log/batch", "drain W"))
          + "; / floor (one task a transaction) = "
          + shown(ratio("ledgerq", "floor", "drain W")))
    print()


def run_round(systems: list[str], args: argparse.Namespace,
              scratch: Scratch) -> dict[str, dict[str, float]]:
    """Every system once: per system, its figure for each scenario it runs."""
    results: dict[str, dict[str, float]] = {}
    for system in systems:
        if system == "ledgerq":
            row = run_ledgerq(args.dsn, args.n, args.workers, scratch)
            if row:
                results[system] = row
        elif system == "ledgerq-sql":
            results[system] = run_ledgerq_sql(scratch, args.n)
        elif system == "ledgerq-units":
            from pg_peers import ledgerq_units
            results[system] = measure(_peer_for(system), scratch, args.n, args.workers,
                                      ledgerq_units.SCENARIOS)
        elif system == "schema-floor":
            from pg_peers import schema_floor
            results[system] = measure(_peer_for(system), scratch, args.n, args.workers,
                                      schema_floor.SCENARIOS)
        else:
            results[system] = measure(
                _peer_for(system), scratch, args.n, args.workers,
                BATCHED_SCENARIOS if system.startswith("floor+log/") else SCENARIOS)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--n", type=int, default=2000, help="tasks per scenario (default 2000)")
    ap.add_argument("--dsn", default=DEFAULT_DSN,
                    help="admin DSN, used only to CREATE/DROP the scratch databases")
    ap.add_argument("--only", nargs="+", choices=SYSTEMS, help="run only these systems")
    ap.add_argument("--workers", type=int, default=4,
                    help="worker processes for 'drain W' and 'end to end' (default 4)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="interleaved rounds: every system once a round; the table shows "
                         "medians, the ratios the median of each round's own (default 1)")
    args = ap.parse_args()

    with psycopg.connect(args.dsn, autocommit=True) as conn:
        settings = dict(conn.execute(
            "SELECT name, setting FROM pg_settings WHERE name IN ('server_version', "
            "'fsync', 'synchronous_commit', 'wal_sync_method', 'shared_buffers')").fetchall())
    print(f"PostgreSQL {settings.get('server_version')} (fsync={settings.get('fsync')}, "
          f"synchronous_commit={settings.get('synchronous_commit')}, "
          f"wal_sync_method={settings.get('wal_sync_method')}); "
          f"Python {platform.python_version()}, {os.cpu_count()} cores; "
          f"N={args.n}, W={args.workers}")
    print("versions: " + ", ".join(f"{d} {_version(d)}" for d in (
        "psycopg", "psycopg-binary", "psycopg-pool", "asyncpg", "uvloop", "pgqueuer",
        "procrastinate", "ledgerq")))

    scratch = Scratch(args.dsn)
    rounds: Rounds = []
    t0 = time.perf_counter()
    try:
        # Untimed warm-up (connections, the server's caches, the WAL files): the first
        # figure of a run came out several times below the same figure later on.
        name, dsn = scratch.create()
        floor.install(dsn)
        floor.submit_single(dsn, min(args.n, 500), log=True)
        scratch.drop(name)
        for k in range(args.rounds):
            if args.rounds > 1:
                print(f"round {k + 1} of {args.rounds}", flush=True)
            rounds.append(run_round(args.only or SYSTEMS, args, scratch))
    finally:
        scratch.drop_all()
    print_table(rounds, args.workers)
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
