"""Every hot queue query is served by the index the spec declares for it, never a table scan.

The indexes live in the spec file, so a contributor who edits them (drops one, changes a
partial WHERE) learns here, not in production at a million rows, that a query lost its
index: SQLite silently falls back to scanning when a partial index's WHERE is not implied
by the query's own.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

from ledgerq.lifecycle.registry import Registry, default_registry
from ledgerq.queue.moves import CANDIDATE_COLUMNS, DEFAULT_QUEUE, expired_columns
from ledgerq.queue.worker.executors import Executors
from ledgerq.queue.worker.store import Kinds
from ledgerq.store.sqlite.schema import create_schema
from ledgerq.store.sqlite.tx import SqliteTx
from ledgerq.store.sqltx import SqlTx

REGISTRY: Registry = default_registry()
POLICY = REGISTRY.entity("schedule_run")
#: What a worker's claim filters on: the kinds it has code for.
SERVED = Kinds(Executors().served_kinds, only=True)


class PlanTx(SqliteTx):
    """Runs each operation's real statement, recording its query plan first."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(conn)
        self.plans: list[list[str]] = []

    def execute(self, sql: str, params: Any = ()) -> Any:
        self.plans.append([r[3] for r in self.conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)])
        return self.conn.execute(sql, params)


Op = Callable[[SqlTx], object]
#: What a claim pass passes with each page it reads.
CLAIM: dict[str, Any] = {"columns": CANDIDATE_COLUMNS, "default_queue": DEFAULT_QUEUE}
# (what, the operation, the index its plan must use)
QUERIES: list[tuple[str, Op, str]] = [
    ("claim scan, first page",
     lambda tx: tx.read_claim_page(POLICY, SERVED, "default", None, 50, **CLAIM),
     "idx_schedule_runs_claim_order"),
    ("claim scan, next page",
     lambda tx: tx.read_claim_page(POLICY, SERVED, "default", (5, 0.0, ""), 50, **CLAIM),
     "idx_schedule_runs_claim_order"),
    ("claim scan page, no kind excluded",
     lambda tx: tx.read_claim_page(POLICY, SERVED, "q1", (0, 0.0, ""), 50, **CLAIM),
     "idx_schedule_runs_claim_order"),
    ("running concurrency keys", lambda tx: tx.list_running_keys(POLICY),
     "idx_schedule_runs_lease"),
    ("is this key running", lambda tx: tx.is_key_running(POLICY, "host:gpu"),
     "idx_schedule_runs_concurrency"),
    ("expired leases",
     lambda tx: tx.list_expired_leases(POLICY, 1.0, columns=expired_columns(POLICY)),
     "idx_schedule_runs_lease"),
    ("due retries", lambda tx: tx.list_due_retries(POLICY, 1.0), "idx_schedule_runs_retry_due"),
    ("settled waiting runs", lambda tx: tx.list_settled_waiting(POLICY),
     "idx_schedule_runs_waiting"),
    ("dependents of a run", lambda tx: tx.list_dependents(POLICY, ["x"]),
     "idx_schedule_runs_waiting"),
    ("idempotency key lookup", lambda tx: tx.find_run_by_idempotency_key(POLICY, "k"),
     "uq_schedule_runs_idempotency_key"),
    ("a move's read", lambda tx: tx.read_for_move(POLICY, "x", ("lease_token", "leased_by")),
     "sqlite_autoindex_schedule_runs_1"),
    ("a move's update", lambda tx: tx.update_entity(
        POLICY, "x", observed="queued", version=1, to_state="running",
        changes={"updated_at": 1.0}, guards={"leased_by": None}, returning=()),
     "sqlite_autoindex_schedule_runs_1"),
    ("a move's unread update", lambda tx: tx.update_entity(
        POLICY, "x", observed="queued", version=None, to_state="running",
        changes={"updated_at": 1.0}, guards={"leased_by": None}, returning=("version",)),
     "sqlite_autoindex_schedule_runs_1"),
    ("an entity's history", lambda tx: tx.read_facts("schedule_run", "x"),
     "uq_status_transitions_version"),
]


@pytest.fixture(scope="module")
def conn() -> sqlite3.Connection:
    c = sqlite3.connect(":memory:")
    create_schema(c, REGISTRY)
    # Make a scan look expensive to the planner, as it is on a real queue.
    c.execute("ANALYZE")
    return c


@pytest.mark.parametrize(("what", "op", "index"), QUERIES, ids=[q[0] for q in QUERIES])
def test_query_uses_its_index(conn: sqlite3.Connection, what: str, op: Op, index: str) -> None:
    tx = PlanTx(conn)
    op(tx)
    assert tx.plans, f"{what}: ran no statement"
    for plan in tx.plans:
        text = "\n".join(plan)
        assert index in text, f"{what}: expected {index} in the plan:\n{text}"
        # Read in the index's order: a sort would read every row of the range first.
        assert "FOR ORDER BY" not in text, f"{what}: sorts instead of reading in order:\n{text}"
        for step in plan:
            if step.startswith("SCAN") and ("schedule_runs" in step
                                            or "status_transitions" in step):
                assert "USING" in step, f"{what}: full table scan in the plan:\n{text}"


async def test_postgres_claim_pages_read_the_claim_index_in_order(pg_target: str) -> None:
    """PostgreSQL: each claim statement is a range of idx_schedule_runs_claim_order read in
    the index's order (no Sort node, so no row past the LIMIT is read). Sequential scans
    are priced out, as on a deep queue."""
    from ledgerq import StateDB

    async with StateDB(pg_target) as db:
        policy = db.registry.entity("schedule_run")

        def probe(tx: SqlTx) -> list[str]:
            plans: list[str] = []
            real = tx.execute

            def recording(sql: str, params: Any = ()) -> Any:
                if sql.lstrip().startswith("SELECT"):
                    plans.append("\n".join(
                        r[0] for r in real(f"EXPLAIN {sql}", params).fetchall()))
                return real(sql, params)

            real("SET LOCAL enable_seqscan = off")
            tx.execute = recording  # type: ignore[method-assign]
            tx.read_claim_page(policy, SERVED, "default", None, 50, **CLAIM)
            tx.read_claim_page(policy, Kinds((), only=False), "q1", (5, 0.0, ""), 50, **CLAIM)
            return plans

        plans = await db.read(probe)
    assert len(plans) == 3, plans  # the first page: one range; the next: level, then below
    for plan in plans:
        assert "idx_schedule_runs_claim_order" in plan, plan
        assert "Sort" not in plan, plan


async def stale_queue(db: Any) -> list[str]:
    """400 queued runs under statistics taken while the table was empty (as a burst of
    submits leaves them until autovacuum's next ANALYZE); the first 12 ids."""
    from ledgerq.queue import TaskApplication, submit_many

    def stale(tx: SqlTx) -> None:
        tx.execute("ANALYZE schedule_runs")
        tx.execute("ALTER TABLE schedule_runs SET (autovacuum_enabled = false)")

    await db.write(stale)
    await submit_many(db, [TaskApplication("command", {"argv": ["true"]}, "host")] * 400)
    return [r["id"] for r in await db.fetch_all(
        "SELECT id FROM schedule_runs ORDER BY id LIMIT 12")]


def explained(tx: SqlTx, *, deep: bool = True) -> list[dict[str, Any]]:
    """From here on, every statement ``tx`` runs is first run under ``EXPLAIN ANALYZE`` (in
    a savepoint rolled back), its plan appended to the list returned; if ``deep``,
    sequential scans are priced out, as on a deep table."""
    plans: list[dict[str, Any]] = []
    real = tx.execute

    def recording(sql: str, params: Any = ()) -> Any:
        real("SAVEPOINT probe")
        (plan,) = real(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params).fetchone()
        plans.append(plan if isinstance(plan, list) else json.loads(plan))
        real("ROLLBACK TO probe")
        return real(sql, params)

    if deep:
        real("SET LOCAL enable_seqscan = off")
    tx.execute = recording  # type: ignore[method-assign]
    return plans


def read_rows(node: dict[str, Any]) -> int:
    """Rows a plan's scans of schedule_runs read (kept or filtered out)."""
    scan = node.get("Relation Name") == "schedule_runs" and node["Node Type"].endswith("Scan")
    own = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0) \
        + node.get("Rows Removed by Index Recheck", 0) if scan else 0
    return own * node.get("Actual Loops", 1) + sum(read_rows(n) for n in node.get("Plans", []))


async def explained_claims(db: Any, ids: list[str], limit: int, *, deep: bool = True
                           ) -> tuple[list[dict[str, Any]], int]:
    """One claim statement over ``ids`` (up to ``limit`` claimed), explained (see
    :func:`explained`); its plans and how many rows it claimed."""
    policy = db.registry.entity("schedule_run")

    def probe(tx: SqlTx) -> tuple[list[dict[str, Any]], int]:
        plans = explained(tx, deep=deep)
        claimed = tx.claim_entities(
            policy, [(i, {"leased_by": None}, {"leased_by": "w1"}) for i in ids],
            observed="queued", to_state="running", changes={}, limit=limit)
        return plans, len(claimed)

    result: tuple[list[dict[str, Any]], int] = await db.write(probe)
    return result


async def test_postgres_a_claim_swap_reads_its_candidates_alone_whatever_the_statistics(
        pg_target: str) -> None:
    """PostgreSQL: a pass's claim statement looks its candidates up by primary key in the
    given order and stops at its limit, so it reads (and locks) no more rows than it
    claims, not every queued row. The statistics here were taken while the queue was
    empty, as a burst of submits leaves them until autovacuum's next ANALYZE: with them,
    the statement used to read the whole status through its index (21 ms a pass at 100k
    queued, bench/pg_scaling.py). Sequential scans are priced out, as on a deep queue."""
    from ledgerq import StateDB

    async with StateDB(pg_target) as db:
        plans, claimed = await explained_claims(db, await stale_queue(db), 10)
    assert claimed == 10
    (plan,) = plans

    # Ten rows claimed: each read once to pick and lock it, once to swap it; none of
    # the two spares, and no sort that would have read every candidate before the limit.
    assert read_rows(plan[0]["Plan"]) <= 2 * 10, json.dumps(plan, indent=1)
    assert '"Sort"' not in json.dumps(plan), json.dumps(plan, indent=1)


async def test_postgres_a_claim_swap_reads_its_candidates_alone_on_a_short_table(
        pg_target: str) -> None:
    """PostgreSQL: on a table short enough that a sequential scan is cheap, with fresh
    statistics, the claim statement still reads only its candidates. Joined to the rows
    it locked, the swap hashed them against a scan of the whole table on every pass
    (1,700 rows for 25 claims midway through a 2,000-task drain: 1.3 ms a statement, 0.7
    ms with the rows found by key)."""
    from ledgerq import StateDB
    from ledgerq.queue import TaskApplication, submit_many

    async with StateDB(pg_target) as db:
        await submit_many(db, [TaskApplication("command", {"argv": ["true"]}, "host")] * 2000)
        await db.write(lambda tx: tx.execute("ANALYZE schedule_runs"))
        ids = [r["id"] for r in await db.fetch_all(
            "SELECT id FROM schedule_runs ORDER BY id LIMIT 75")]
        plans, claimed = await explained_claims(db, ids, 25, deep=False)
    assert claimed == 25
    (plan,) = plans
    assert read_rows(plan[0]["Plan"]) <= 2 * 25, json.dumps(plan, indent=1)


async def test_postgres_moves_sent_together_read_their_own_rows_alone(
        pg_target: str) -> None:
    """PostgreSQL: several moves sent as one statement (a pass's outcomes) find each row by
    primary key, with statistics taken while the table was empty and sequential scans
    priced out (a deep table). Joined to their JSON document instead, the swap hashed the
    whole table (6.4-7.1 ms for 20 outcomes over 10k rows, against 2.6-2.9 ms by key)."""
    from ledgerq import StateDB
    from ledgerq.lifecycle.facts import Fact
    from ledgerq.lifecycle.ids import new_id
    from ledgerq.lifecycle.store import SentMove

    async with StateDB(pg_target) as db:
        policy = db.registry.entity("schedule_run")
        ids = await stale_queue(db)

        def probe(tx: SqlTx) -> tuple[list[dict[str, Any]], list[int | None]]:
            plans = explained(tx)
            changes = {"leased_by": "w1", "updated_at": 2.0, "status_evidence_refs": "[]"}
            return plans, tx.update_entities_with_facts(policy, [SentMove(
                i, "queued", None, "running", changes, {"leased_by": None}, False,
                Fact(new_id(), "schedule_run", i, "queued", "running", "run.started.ok", "",
                     "[]", "system", "w1", 2.0, "{}", 0, '{"leased_by":"w1"}', None))
                for i in ids])

        plans, versions = await db.write(probe)
    assert versions == [2] * 12
    (plan,) = plans
    assert read_rows(plan[0]["Plan"]) <= 12, json.dumps(plan, indent=1)


def test_the_oldest_queued_run_is_found_through_the_claim_order_index() -> None:
    """Every statement of the level-by-level search (first level, the level below, the
    next queue, a level's oldest row) is one step into idx_schedule_runs_claim_order, read
    in its order: no (queued_at) index is kept for this query alone."""
    c = sqlite3.connect(":memory:")
    create_schema(c, REGISTRY)
    names = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "idx_schedule_runs_claim" not in names  # a new database has only the claim order's
    c.executemany(
        "INSERT INTO schedule_runs (id, status, trigger_context, action_kind, action_args, "
        "fired_at, created_at, queued_at, version, queue, priority) "
        "VALUES (?, 'queued', '{}', 'k', '{}', 1, 1, ?, 1, ?, ?)",
        [(f"r{i}", 100.0 - i, q, p) for i, (q, p) in enumerate(
            [("a", 5), ("a", 0), ("b", 1), ("b", 1), ("c", -2)] * 40)])
    c.execute("ANALYZE")
    tx = PlanTx(c)
    assert tx.find_oldest_queued_at(POLICY) == min(100.0 - i for i in range(200))
    kinds = {" ".join(p) for p in tx.plans}
    assert len(tx.plans) >= 4 and len(kinds) >= 3, tx.plans
    for plan in tx.plans:
        text = "\n".join(plan)
        assert "idx_schedule_runs_claim_order" in text, text
        assert "TEMP B-TREE" not in text, text
