"""Every hot queue query is served by the index the spec declares for it, never a table scan.

The indexes live in the spec file, so a contributor who edits them (drops one, changes a
partial WHERE) learns here, not in production at a million rows, that a query lost its
index: SQLite silently falls back to scanning when a partial index's WHERE is not implied
by the query's own.
"""

from __future__ import annotations

import sqlite3

import pytest

from ledgerq.lifecycle.engine import _select_sql, _update_sql
from ledgerq.lifecycle.registry import Registry, default_registry
from ledgerq.queue import worker
from ledgerq.queue.runs import _dependents_sql
from ledgerq.store.schema import create_schema

REGISTRY: Registry = default_registry()
POLICY = REGISTRY.entity("schedule_run")

# (what, sql, parameters, the index the plan must use)
QUERIES = [
    ("claim scan page", worker._candidates_sql(POLICY, 1), ("workflow", 0.0, "", 50),
     "idx_schedule_runs_claim"),
    ("claim scan page, no kind excluded", worker._candidates_sql(POLICY, 0), (0.0, "", 50),
     "idx_schedule_runs_claim"),
    ("running concurrency keys", worker._running_keys_sql(POLICY), (),
     "idx_schedule_runs_lease"),
    ("is this key running", worker._key_running_sql(POLICY), ("host:gpu",),
     "idx_schedule_runs_concurrency"),
    ("expired leases", worker._expired_sql(POLICY, "id"), (1.0,), "idx_schedule_runs_lease"),
    ("due retries", worker._due_sql(POLICY, "id"), (1.0,), "idx_schedule_runs_retry_due"),
    ("waiting runs", worker._waiting_sql(POLICY, "id"), (), "idx_schedule_runs_waiting"),
    ("dependents of a run", _dependents_sql(POLICY), ("x",), "idx_schedule_runs_waiting"),
    ("idempotency key lookup",
     "SELECT id, application_digest FROM schedule_runs WHERE idempotency_key = ?", ("k",),
     "uq_schedule_runs_idempotency_key"),
    ("a move's read", _select_sql("schedule_runs", ("lease_token", "leased_by")), ("x",),
     "sqlite_autoindex_schedule_runs_1"),
    ("a move's update",
     _update_sql("schedule_runs", ("leased_by",), ("updated_at",), (), False),
     ("running", 2, 1.0, "x", "queued", 1, None), "sqlite_autoindex_schedule_runs_1"),
    ("an entity's history",
     "SELECT * FROM status_transitions WHERE entity_type = ? AND entity_id = ? "
     "ORDER BY entity_version", ("schedule_run", "x"), "uq_status_transitions_version"),
]


@pytest.fixture(scope="module")
def conn() -> sqlite3.Connection:
    c = sqlite3.connect(":memory:")
    create_schema(c, REGISTRY)
    # Make a scan look expensive to the planner, as it is on a real queue.
    c.execute("ANALYZE")
    return c


@pytest.mark.parametrize(("what", "sql", "params", "index"), QUERIES,
                         ids=[q[0] for q in QUERIES])
def test_query_uses_its_index(conn: sqlite3.Connection, what: str, sql: str,
                              params: tuple[object, ...], index: str) -> None:
    plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params)]
    text = "\n".join(plan)
    assert index in text, f"{what}: expected {index} in the plan:\n{text}"
    for step in plan:
        if step.startswith("SCAN") and ("schedule_runs" in step
                                        or "status_transitions" in step):
            assert "USING" in step, f"{what}: full table scan in the plan:\n{text}"
