"""Transitions per second: ledgerq.lifecycle.transition() beside raw stdlib sqlite3.

Three measurements, in one process and one run, each on its own fresh temporary file
database with ledgerq's schema and pragmas (WAL, busy_timeout, foreign keys, the chosen
``synchronous``), each starting from the same N ``schedule_run`` rows in ``running``
(created first, with their creation facts, and not timed):

  sequential   one caller awaiting transition() in a loop
  concurrent   C asyncio callers (default 64), each renewing its own rows
  raw          stdlib sqlite3, one caller, the same statements transition() runs
               (UPDATE ... SET version = version + 1 ... WHERE id AND status AND guards
               RETURNING the version and the patched columns; INSERT the fact), each
               move in its own BEGIN IMMEDIATE .. COMMIT. A move whose caller names the
               state it expects is not read first: the swap is the read.

The move is a lease renewal, schedule_run running -> running guarded on leased_by and
lease_expires_at and patching lease_expires_at: the transition a worker makes most
often. Every timed move is legal and must apply; a conflict aborts the benchmark.

Targets: sequential >= 0.4 x raw; concurrent >= 1.5 x raw (sequential).

    .venv/bin/python bench/transition.py            # full run
    .venv/bin/python bench/transition.py --quick    # a few seconds
    .venv/bin/python bench/transition.py --synchronous FULL --n 5000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script, this directory is sys.path[0]; bench/queue.py would then shadow the
# standard library's queue module, which aiosqlite imports. Drop it before importing.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from ledgerq import StateDB  # noqa: E402
from ledgerq.codec import dumps  # noqa: E402
from ledgerq.lifecycle import (  # noqa: E402
    Actor,
    Registry,
    StateReason,
    TransitionRequest,
    default_registry,
    engine,
    transition,
)
from ledgerq.lifecycle.engine import create_entity  # noqa: E402
from ledgerq.store import db as store_db  # noqa: E402
from ledgerq.store.sqlite.schema import schema_ddl  # noqa: E402
from ledgerq.store.sqlite.tx import SqliteTx  # noqa: E402
from ledgerq.store.timeouts import BUSY_TIMEOUT_MS  # noqa: E402

sys.path.append(_HERE)  # last, so the stdlib's queue still wins; for rounds.py
from rounds import ratio  # noqa: E402  (a sibling script, importable only after the line above)

ENTITY = "schedule_run"
WORKER = "bench-worker"
LEASE_STEP = 30.0
ACTOR = Actor(type="system", id=WORKER)
CREATE_REASON = StateReason(code="run.started.ok", summary="bench seed")
RENEW_REASON = StateReason(code="run.running.lease_renewed")

# The statements transition() runs for this move, written out by hand; check_statements()
# refuses to run if the engine's text for the move has drifted from these.
RAW_REPLAY = ("SELECT id, previous_status, status FROM status_transitions "
              "WHERE entity_type = ? AND entity_id = ? AND idempotency_key = ?")
# A same-state move does not assign status (the engine leaves it out: see
# SqlTx.update_entity).
RAW_UPDATE = (
    'UPDATE "schedule_runs" SET version = version + 1, "updated_at" = ?, '
    '"status_reason_code" = ?, "status_reason_summary" = ?, "status_evidence_refs" = ?, '
    '"lease_expires_at" = ? WHERE id = ? AND status = ? AND "lease_expires_at" IS ? '
    'AND "leased_by" IS ? RETURNING "version", "lease_expires_at"'
)
RAW_INSERT = """
INSERT INTO status_transitions (
  id, entity_type, entity_id, previous_status, status, reason_code, reason_summary,
  evidence_refs, source, actor, created_at, metadata, entity_version, patch, idempotency_key
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
#: Both sides make fact ids the same way, so the comparison is about the framework.
new_id: Callable[[], str] = getattr(engine, "new_id", lambda: str(uuid.uuid4()))


def check_statements() -> None:
    """Refuse to compare against statements the engine no longer runs."""
    guard_cols = ("lease_expires_at", "leased_by")
    change_cols = ("updated_at", "status_reason_code", "status_reason_summary",
                   "status_evidence_refs", "lease_expires_at")
    # The dialect's own texts, rendered as the engine's move renders them.
    policy = default_registry().entity(ENTITY)
    tx = SqliteTx(sqlite3.connect(":memory:"))
    seen: list[str] = []
    tx.execute = lambda sql, params=(): seen.append(sql)  # type: ignore[method-assign]
    with contextlib.suppress(Exception):
        tx.update_entity(policy, "x", observed="running", version=None, to_state=None,
                         changes=dict.fromkeys(change_cols), guards=dict.fromkeys(guard_cols),
                         returning=("version", "lease_expires_at"))
    ours = {"UPDATE": RAW_UPDATE, "INSERT": RAW_INSERT}
    theirs = {"UPDATE": seen[0], "INSERT": tx.q("append_fact")}
    for name, sql in ours.items():
        if " ".join(sql.split()) != " ".join(theirs[name].split()):
            raise SystemExit(f"bench/transition.py: the engine's {name} for a lease renewal is "
                             f"now\n  {theirs[name]}\nupdate RAW_{name} to match")


#: Connection settings both sides must share; main() refuses to report if they differ.
PRAGMAS = ("journal_mode", "synchronous", "foreign_keys", "busy_timeout", "temp_store",
           "cache_size", "page_size")
SETTINGS: dict[str, dict[str, Any]] = {}


def read_pragmas(conn: sqlite3.Connection) -> dict[str, Any]:
    return {p: conn.execute(f"PRAGMA {p}").fetchone()[0] for p in PRAGMAS}


# ---------------------------------------------------------------- setup (not timed)

def seed_rows(conn: sqlite3.Connection, registry: Registry, rows: int, t0: float
              ) -> list[tuple[str, float]]:
    """Create ``rows`` running schedule_runs with their creation facts, in one transaction."""
    policy = registry.entity(ENTITY)
    prev_factory = conn.row_factory
    conn.row_factory = sqlite3.Row  # create_entity reads the stored row back by name
    out: list[tuple[str, float]] = []
    own_txn = not conn.in_transaction  # inside StateDB.write the transaction is open
    if own_txn:
        conn.execute("BEGIN IMMEDIATE")
    for i in range(rows):
        expires = t0 + LEASE_STEP
        rid = create_entity(SqliteTx(conn), policy, {
            "id": f"run-{i:06d}", "status": "running", "trigger_context": {"bench": True},
            "action_kind": "noop", "action_args": [], "fired_at": t0, "queued_at": t0,
            "leased_by": WORKER, "lease_expires_at": expires, "lease_attempts": 1,
        }, reason=CREATE_REASON, actor=ACTOR, now=t0)
        out.append((rid, expires))
    if own_txn:
        conn.execute("COMMIT")
    conn.row_factory = prev_factory
    return out


def fresh_path(workdir: Path, name: str) -> str:
    path = workdir / f"{name}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return str(path)


def plan(rows: list[tuple[str, float]], n: int, callers: int) -> list[list[int]]:
    """Row indexes per caller: caller c owns rows c, c+callers, ...; n moves in all."""
    owned = [list(range(c, len(rows), callers)) for c in range(callers)]
    per = [n // callers + (1 if c < n % callers else 0) for c in range(callers)]
    return [[own[k % len(own)] for k in range(per[c])] for c, own in enumerate(owned)]


# ---------------------------------------------------------------- ledgerq

async def run_ledgerq(path: str, registry: Registry, synchronous: str, n: int, rows: int,
                      callers: int, keys: bool) -> float:
    async with StateDB(path, registry=registry, synchronous=synchronous) as db:  # type: ignore[arg-type]
        SETTINGS["ledgerq"] = await db.run(read_pragmas)
        seeded = await db.write(lambda tx: seed_rows(tx.conn, registry, rows, time.time()))
        expires = [e for _, e in seeded]
        ids = [r for r, _ in seeded]
        work = plan(seeded, n, callers)
        counter = [0]

        async def caller(mine: list[int]) -> None:
            for i in mine:
                exp = expires[i]
                counter[0] += 1
                req = TransitionRequest(
                    entity_type=ENTITY, entity_id=ids[i], from_state="running",
                    to_state="running", reason=RENEW_REASON, actor=ACTOR,
                    idempotency_key=f"renew-{counter[0]}" if keys else "",
                )
                res = await transition(db, req, guard={"leased_by": WORKER,
                                                       "lease_expires_at": exp},
                                       patch={"lease_expires_at": exp + LEASE_STEP})
                if not res.applied:
                    raise SystemExit(f"benchmark move did not apply: {res!r}")
                expires[i] = exp + LEASE_STEP

        start = time.perf_counter()
        if callers == 1:
            await caller(work[0])
        else:
            await asyncio.gather(*(caller(w) for w in work))
        elapsed = time.perf_counter() - start
        facts = await db.fetch_one("SELECT count(*) AS c FROM status_transitions")
        assert facts is not None and facts["c"] == rows + n, facts
    return n / elapsed


# ---------------------------------------------------------------- raw sqlite3

def raw_connect(path: str, registry: Registry, synchronous: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000,
                           cached_statements=getattr(store_db, "STATEMENT_CACHE", 128))
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.executescript(schema_ddl(registry))
    return conn


def run_raw(path: str, registry: Registry, synchronous: str, n: int, rows: int,
            keys: bool) -> float:
    conn = raw_connect(path, registry, synchronous)
    SETTINGS["raw"] = read_pragmas(conn)
    try:
        seeded = seed_rows(conn, registry, rows, time.time())
        expires = [e for _, e in seeded]
        ids = [r for r, _ in seeded]
        order = plan(seeded, n, 1)[0]
        execute = conn.execute
        code = RENEW_REASON.code
        summary = RENEW_REASON.summary
        evidence = dumps(RENEW_REASON.evidence_refs)
        metadata = dumps(RENEW_REASON.metadata)

        start = time.perf_counter()
        for k, i in enumerate(order):
            rid = ids[i]
            exp = expires[i]
            key = f"renew-{k}" if keys else None
            execute("BEGIN IMMEDIATE")
            if key is not None and execute(RAW_REPLAY, (ENTITY, rid, key)).fetchone():
                raise SystemExit("raw: idempotency key unexpectedly present")
            ts = time.time()
            new_exp = exp + LEASE_STEP
            changes = {"updated_at": ts, "status_reason_code": code,
                       "status_reason_summary": summary, "status_evidence_refs": evidence,
                       "lease_expires_at": new_exp}
            stored = execute(RAW_UPDATE, (ts, code, summary, evidence, new_exp,
                                          rid, "running", exp, WORKER)).fetchall()
            if len(stored) != 1:
                raise SystemExit(f"raw: UPDATE matched {len(stored)} rows")
            version, changes["lease_expires_at"] = stored[0]
            execute(RAW_INSERT, (new_id(), ENTITY, rid, "running", "running", code,
                                 summary, evidence, ACTOR.type, ACTOR.id, ts, metadata,
                                 version, dumps(changes), key))
            execute("COMMIT")
            expires[i] = new_exp
        elapsed = time.perf_counter() - start
        (facts,) = conn.execute("SELECT count(*) FROM status_transitions").fetchone()
        assert facts == rows + n, facts
    finally:
        conn.close()
    return n / elapsed


# ---------------------------------------------------------------- driver

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="a fast run (n=2000, rows=256)")
    ap.add_argument("--n", type=int, default=None,
                    help="timed transitions per measurement (default 20000; --quick 2000)")
    ap.add_argument("--rows", type=int, default=None,
                    help="schedule_run rows created before timing (default 1024; --quick 256)")
    ap.add_argument("--concurrency", type=int, default=64, help="concurrent callers (64)")
    ap.add_argument("--synchronous", choices=["NORMAL", "FULL"], default="NORMAL",
                    type=str.upper)
    ap.add_argument("--repeat", type=int, default=5,
                    help="interleaved rounds of every measurement; each figure is the median "
                         "(5: single rounds spread 1.06-1.67x on a noisy VM)")
    ap.add_argument("--idempotency-keys", action="store_true",
                    help="give every move an idempotency key (adds the replay SELECT and "
                         "the key index, on both sides)")
    ap.add_argument("--profile", choices=["sequential", "concurrent"], default=None,
                    help="run only that ledgerq measurement under cProfile and print the top")
    ap.add_argument("--dir", default=None, help="directory for the database files (a tempdir)")
    args = ap.parse_args(argv)

    n = args.n or (2000 if args.quick else 20000)
    rows = args.rows or (256 if args.quick else 1024)
    rows = max(rows, args.concurrency)
    check_statements()
    registry = default_registry()
    sync = args.synchronous
    keys = args.idempotency_keys

    with tempfile.TemporaryDirectory(prefix="ledgerq-bench-", dir=args.dir) as tmp:
        workdir = Path(tmp)
        if args.profile:
            return profile(args.profile, workdir, registry, sync, n, rows, args.concurrency,
                           keys)

        measures: dict[str, Callable[[int], float]] = {
            "raw sqlite3, sequential": lambda r: run_raw(
                fresh_path(workdir, f"raw{r}"), registry, sync, n, rows, keys),
            "transition(), sequential": lambda r: asyncio.run(run_ledgerq(
                fresh_path(workdir, f"seq{r}"), registry, sync, n, rows, 1, keys)),
            f"transition(), {args.concurrency} concurrent": lambda r: asyncio.run(run_ledgerq(
                fresh_path(workdir, f"conc{r}"), registry, sync, n, rows, args.concurrency,
                keys)),
        }
        # warm-up: imports, pydantic schemas, the page cache of the temp directory
        run_raw(fresh_path(workdir, "warm-raw"), registry, sync, min(n, 500), 64, keys)
        asyncio.run(run_ledgerq(fresh_path(workdir, "warm"), registry, sync, min(n, 500), 64,
                                8, keys))
        if SETTINGS["raw"] != SETTINGS["ledgerq"]:
            raise SystemExit(f"raw and ledgerq connections differ: {SETTINGS}")
        results: dict[str, list[float]] = {name: [] for name in measures}
        for r in range(args.repeat):
            for name, fn in measures.items():  # interleaved, so drift hits every side alike
                results[name].append(fn(r))

    med = {name: statistics.median(v) for name, v in results.items()}
    print(f"ledgerq transition benchmark: python {platform.python_version()}, "
          f"sqlite {sqlite3.sqlite_version}, {os.cpu_count()} cpu(s), {platform.machine()}")
    print(f"move: {ENTITY} running -> running (lease renewal, guard leased_by + "
          f"lease_expires_at, patch lease_expires_at); n={n} per measurement, rows={rows}, "
          f"synchronous={sync}, idempotency keys={'yes' if keys else 'no'}, "
          f"repeat={args.repeat} (median)")
    print("pragmas (both sides): " + ", ".join(f"{k}={v}" for k, v in SETTINGS["raw"].items()))
    print()
    width = max(len(k) for k in med)
    print(f"{'measurement':<{width}}  {'transitions/s':>13}  {'us/transition':>13}")
    for name, value in med.items():
        print(f"{name:<{width}}  {value:>13,.0f}  {1e6 / value:>13.1f}")
    print()
    raws, seqs, concs = results.values()
    r_seq, r_conc = ratio(seqs, raws), ratio(concs, raws)
    print(f"ratios: median over the {args.repeat} round(s) of each round's own [min, max]")
    print(f"sequential / raw          = {r_seq}   (target >= 0.40x: "
          f"{'met' if r_seq.median >= 0.40 else 'NOT met'})")
    print(f"{args.concurrency} concurrent / raw sequential = {r_conc}   "
          f"(target >= 1.50x: {'met' if r_conc.median >= 1.5 else 'NOT met'})")
    return 0


def profile(which: str, workdir: Path, registry: Registry, sync: str, n: int, rows: int,
            concurrency: int, keys: bool) -> int:
    import cProfile
    import pstats

    callers = 1 if which == "sequential" else concurrency
    prof = cProfile.Profile()
    coro: Any = run_ledgerq(fresh_path(workdir, "prof"), registry, sync, n, rows, callers, keys)
    prof.enable()
    rate = asyncio.run(coro)
    prof.disable()
    print(f"{which}: {rate:,.0f} transitions/s under cProfile, which sees the event-loop "
          "thread only: the database thread's work shows up as time in epoll")
    pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
