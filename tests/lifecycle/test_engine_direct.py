"""The engine's in-transaction entry points, called directly.

``transition()`` validates reason codes and column allowlists before it queues a unit,
so the tests that go through it would still pass if ``apply_move``, ``runs.move``,
``create_entity`` or ``create_entities`` stopped checking. Those functions are what the
queue calls (inside its own transactions, with reasons built by ``model_construct``),
so each must refuse on its own: a ValueError naming what is wrong, raised before any
statement runs, leaving the rows and the log as they were.

The second half pins that ``submit_many`` (whose plain applications go through
``create_entities``) writes exactly the facts ``submit_task`` (``create_entity``) writes.

Every spec fact used here comes from the packaged specs (``default_registry()``), never
from a hand-written spec file, so a change of the spec format does not break these tests.
"""

from __future__ import annotations

import math
import os
import re
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from helpers import pg
from ledgerq import StateDB
from ledgerq.codec import loads
from ledgerq.lifecycle import Actor, StateReason
from ledgerq.lifecycle.engine import (
    MoveTerms,
    apply_move,
    apply_moves,
    create_entities,
    create_entity,
)
from ledgerq.lifecycle.registry import STANDARD_COLUMNS, EntityPolicy, default_registry
from ledgerq.projections import verify
from ledgerq.queue import RetryPolicy, TaskApplication, runs, submit_many, submit_task
from ledgerq.queue.submission.application import digest, validate
from ledgerq.queue.submission.submit import run_row
from ledgerq.store.sqltx import SqlTx
from lifecycle_support import new_dispatch, new_run, run_values, snapshot, with_dispatch

RUN = default_registry().entity("schedule_run")
DISPATCH = with_dispatch().entity("dispatch")
ACTOR = Actor(type="operator", id="direct-test")
NOW = 1_700_000_000.25
HOST = "node-direct"

#: A declared edge from a creation state (queued -> cancelled) whose reason code, patch
#: and guard columns come from the packaged spec; every refusal below would otherwise
#: be a legal, applied move (each test's control proves it).
FROM, TO, CODE = "queued", "cancelled", "run.cancelled.operator"


def _declared_edge() -> None:
    assert RUN.allows(FROM, TO), "the packaged spec no longer declares queued -> cancelled"
    assert CODE in RUN.reason_codes
    assert "ended_at" in RUN.patch_columns and "leased_by" in RUN.guard_columns


_declared_edge()


def traced(fn: Callable[[sqlite3.Connection], Any]
           ) -> tuple[Callable[[sqlite3.Connection], Any], list[str]]:
    """Wrap an in-transaction call so every statement *it* executes is recorded.

    Only the wrapped call is traced, not the savepoint StateDB.write puts around it, so
    an empty list means the refusal came before the first read, not merely that a
    rollback hid a write.
    """
    statements: list[str] = []

    def unit(tx: SqlTx) -> Any:
        # Every statement of a transaction goes through its execute/executemany (either dialect).
        execute, executemany = tx.execute, tx.executemany  # type: ignore[attr-defined]

        def traced(sql: str, params: Any = ()) -> Any:
            statements.append(sql)
            return execute(sql, params)

        def traced_many(sql: str, rows: Any) -> Any:
            statements.append(sql)
            return executemany(sql, rows)

        tx.execute, tx.executemany = traced, traced_many  # type: ignore[attr-defined]
        try:
            return fn(tx)
        finally:
            del tx.execute, tx.executemany  # type: ignore[attr-defined]

    return unit, statements


def reason(code: str = CODE, **kw: Any) -> StateReason:
    return StateReason(code=code, **kw)


def direct_move(via: str, policy: EntityPolicy, entity_id: str, code: str, *,
                guard: dict[str, Any] | None = None, patch: dict[str, Any] | None = None,
                from_state: str = FROM, to_state: str = TO
                ) -> Callable[[sqlite3.Connection], Any]:
    """One move through ``apply_move``, ``apply_moves`` (the same move twice: the second
    finds it moved on) or ``runs.move``, as an in-transaction unit."""
    # model_construct, as the queue builds its reasons: no pydantic check in the way.
    why = StateReason.model_construct(code=code, summary="", evidence_refs=[], metadata={})
    if via == "apply_move":
        return lambda conn: apply_move(conn, policy, entity_id, from_state, to_state, why,
                                       ACTOR, guard=guard, patch=patch, now=NOW)
    if via == "apply_moves":
        terms = MoveTerms(entity_id, from_state, to_state, why, ACTOR, guard or {},
                          patch or {}, NOW)

        def twice(conn: Any) -> Any:
            first, again = apply_moves(conn, policy, [terms, terms])
            assert not again.applied and again.current_state == to_state, again
            return first

        return twice
    assert policy is RUN
    return lambda conn: runs.move(conn, policy, entity_id, from_state, to_state, code,
                                  actor=ACTOR, guard=guard, patch=patch, now=NOW)


async def stored_run(db: StateDB, run_id: str) -> dict[str, Any]:
    got = await db.fetch_one("SELECT * FROM schedule_runs WHERE id = ?", (run_id,))
    assert got is not None
    return got


async def facts_of(db: StateDB, entity_id: str) -> list[dict[str, Any]]:
    return await db.fetch_all(
        "SELECT * FROM status_transitions WHERE entity_id = ? ORDER BY entity_version",
        (entity_id,))


# ------------------------------------------------------------ apply_move / runs.move


UNDECLARED_CODES = [
    "run.cancelled.because",   # well-formed, never declared
    "dispatch.acked.ok",       # declared, but by the other entity
    "RUN.CANCELLED.OPERATOR",  # a declared code in another case: codes are exact
    "",
]


@pytest.mark.parametrize("via", ["apply_move", "apply_moves", "runs.move"])
@pytest.mark.parametrize("code", UNDECLARED_CODES)
async def test_move_refuses_an_undeclared_reason_code(db: StateDB, via: str, code: str) -> None:
    assert code not in RUN.reason_codes
    rid = await new_run(db)
    before = await snapshot(db)
    unit, statements = traced(direct_move(via, RUN, rid, code, patch={"ended_at": NOW}))
    with pytest.raises(ValueError, match=re.escape(repr(code))):
        await db.write(unit)
    assert statements == []
    assert await snapshot(db) == before
    # Control: the same move with a declared code is applied, so the refusal above is
    # the reason code's alone.
    moved = await db.write(direct_move(via, RUN, rid, CODE, patch={"ended_at": NOW}))
    assert moved.applied
    assert (await stored_run(db, rid))["status_reason_code"] == CODE


def _outside_allowlist_cases() -> list[tuple[str, str]]:
    """(kind, column) pairs the packaged spec does not allowlist for schedule_run."""
    cases: list[tuple[str, str]] = [
        ("guard", "action_kind"),   # a table column, not a guard column
        ("guard", "ended_at"),      # a patch column, not a guard column
        ("guard", "no_such_column"),
        ("patch", "action_kind"),   # a table column, not a patch column
        ("patch", "no_such_column"),
    ]
    # Every engine-maintained column: a patch of one would forge the row's bookkeeping.
    cases += [("patch", c) for c in STANDARD_COLUMNS]
    for kind, col in cases:
        allowed = RUN.guard_columns if kind == "guard" else RUN.patch_columns
        assert col not in allowed, f"the packaged spec now allowlists {kind} column {col}"
    return cases


@pytest.mark.parametrize("via", ["apply_move", "apply_moves", "runs.move"])
@pytest.mark.parametrize(("kind", "column"), _outside_allowlist_cases())
async def test_move_refuses_a_column_outside_the_allowlist(db: StateDB, via: str, kind: str,
                                                           column: str) -> None:
    rid = await new_run(db)
    current = await stored_run(db, rid)
    before = await snapshot(db)
    # A guard on the row's own value: without the allowlist check it would match and the
    # move would apply; a patch with a value the row does not hold would be written.
    value: Any = current.get(column) if kind == "guard" else "forged"
    guard = {column: value} if kind == "guard" else None
    patch = {"ended_at": NOW, column: value} if kind == "patch" else {"ended_at": NOW}
    unit, statements = traced(direct_move(via, RUN, rid, CODE, guard=guard, patch=patch))
    with pytest.raises(ValueError, match=rf"\b{column}\b") as info:
        await db.write(unit)
    assert kind in str(info.value)
    assert statements == []
    assert await snapshot(db) == before
    moved = await db.write(direct_move(via, RUN, rid, CODE, guard={"leased_by": None},
                                       patch={"ended_at": NOW}))
    assert moved.applied


async def test_apply_move_checks_the_allowlist_of_its_own_entity(db: StateDB) -> None:
    # 'attempt' is dispatch's guard and patch column, but not schedule_run's: the check
    # uses the policy it was handed, not the union of every spec's allowlist.
    assert "attempt" in DISPATCH.guard_columns and "attempt" not in RUN.guard_columns
    rid = await new_run(db)
    before = await snapshot(db)
    for guard, patch in (({"attempt": 0}, None), (None, {"attempt": 1})):
        unit, statements = traced(direct_move("apply_move", RUN, rid, CODE, guard=guard,
                                              patch=patch))
        with pytest.raises(ValueError, match="attempt"):
            await db.write(unit)
        assert statements == []
    assert await snapshot(db) == before
    # And the other way round: schedule_run's column on a dispatch row.
    did = await new_dispatch(db)
    before = await snapshot(db)
    unit, statements = traced(direct_move(
        "apply_move", DISPATCH, did, "dispatch.delivering.attempt", from_state="pending",
        to_state="delivering", patch={"ended_at": NOW}))
    with pytest.raises(ValueError, match="ended_at"):
        await db.write(unit)
    assert statements == []
    assert await snapshot(db) == before


async def test_apply_moves_reports_each_move_as_apply_move_would(db: StateDB) -> None:
    """Several moves at once (sent together on PostgreSQL): each is its own guarded move
    with its own fact; one whose guard no longer matches is a conflict reporting the
    row's state, one that finds its row moved on likewise, and the log still folds to
    every row."""
    rids = [await new_run(db) for _ in range(3)]
    why = StateReason.model_construct(code=CODE, summary="", evidence_refs=[], metadata={})

    def terms(rid: str, leased_by: str | None = None) -> MoveTerms:
        return MoveTerms(rid, FROM, TO, why, ACTOR, {"leased_by": leased_by},
                         {"ended_at": NOW}, NOW)

    unit, statements = traced(lambda tx: apply_moves(tx, RUN, [
        terms(rids[0]), terms(rids[1], "someone"), terms(rids[2]), terms(rids[0])]))
    moved = await db.write(unit)
    assert [(m.applied, m.previous_state, m.current_state) for m in moved] == [
        (True, FROM, TO), (False, FROM, FROM), (True, FROM, TO), (False, TO, TO)]
    assert [(await stored_run(db, r))["status"] for r in rids] == [TO, FROM, TO]
    for rid, m in zip(rids, moved, strict=False):
        facts = await facts_of(db, rid)
        assert [f["status"] for f in facts] == ([FROM, TO] if m.applied else [FROM])
        if m.applied:
            assert facts[-1]["id"] == m.transition_id
    assert (await verify(db)).ok
    if db.dialect == "postgresql":
        # The four swaps went out together (not through execute); the two that matched
        # nothing were then each taken again alone: their swap, then their read.
        assert len(statements) == 4 and statements[0] == statements[2], statements
        assert all("FOR UPDATE" in statements[i] for i in (1, 3)), statements
    else:
        # Each swap its own statement, nothing read first; the facts of the swaps that
        # matched are appended together, and before a move that matched nothing is
        # taken again alone (its swap, then its read): swap, swap, the first fact,
        # swap, read, swap, the third fact, swap, read.
        kinds = ["fact" if "status_transitions" in s else
                 "swap" if s.lstrip().upper().startswith("UPDATE") else "read"
                 for s in statements]
        assert kinds == ["swap", "swap", "fact", "swap", "read", "swap", "swap", "fact",
                         "swap", "read"], statements


async def test_apply_moves_refuses_a_row_that_is_not_there(db: StateDB) -> None:
    rid = await new_run(db)
    before = await snapshot(db)
    why = StateReason.model_construct(code=CODE, summary="", evidence_refs=[], metadata={})
    with pytest.raises(LookupError, match="no-such-run"):
        await db.write(lambda tx: apply_moves(tx, RUN, [
            MoveTerms(rid, FROM, TO, why, ACTOR, {}, {"ended_at": NOW}, NOW),
            MoveTerms("no-such-run", FROM, TO, why, ACTOR, {}, {"ended_at": NOW}, NOW)]))
    assert await snapshot(db) == before  # the first move went with the unit


# ------------------------------------------------------------ create_entity / create_entities


def create_unit(via: str, policy: EntityPolicy, values: list[dict[str, Any]],
                why: StateReason, actor: Actor = ACTOR) -> Callable[[sqlite3.Connection], Any]:
    if via == "create_entity":
        def one_by_one(conn: sqlite3.Connection) -> list[str]:
            return [create_entity(conn, policy, v, reason=why, actor=actor, now=NOW)
                    for v in values]
        return one_by_one
    return lambda conn: create_entities(conn, policy, values, reason=why, actor=actor, now=NOW)


CREATE_VIAS = ["create_entity", "create_entities"]


@pytest.mark.parametrize("via", CREATE_VIAS)
@pytest.mark.parametrize("code", ["run.queued.because", "dispatch.pending.created", ""])
async def test_create_refuses_an_undeclared_reason_code(db: StateDB, via: str, code: str) -> None:
    assert code not in RUN.reason_codes
    await new_run(db)  # something already there, so "nothing written" is not "empty"
    before = await snapshot(db)
    why = StateReason.model_construct(code=code, summary="", evidence_refs=[], metadata={})
    unit, statements = traced(create_unit(via, RUN, [run_values()], why))
    with pytest.raises(ValueError, match=re.escape(repr(code))):
        await db.write(unit)
    assert statements == []
    assert await snapshot(db) == before
    ids = await db.write(create_unit(via, RUN, [run_values()], reason("run.queued.submitted")))
    assert len(ids) == 1


BAD_VALUES: list[tuple[dict[str, Any], str]] = [
    (run_values(no_such_column=1), "no_such_column"),
    ({**run_values(), "status; DROP TABLE schedule_runs": 1}, "DROP TABLE"),
    (run_values("completed"), "completed"),           # declared, but not an initial state
    (run_values("retry_wait"), "retry_wait"),         # the same, non-terminal
    (run_values("paused"), "paused"),                 # not a state at all
    ({k: v for k, v in run_values().items() if k != "status"}, "None"),
    # Values the log cannot hold exactly, in rows whose JSON is given as text (the shape a
    # submit sends, whose values are looked at once, as its fact's patch is made): each
    # refused by name as in any other row.
    *((run_values(**{"trigger_context": "{}", "action_args": "[]", **bad}), named)
      for bad, named in (
        ({"error_detail": "a\x00b"}, "NUL"),
        ({"error_detail": "\ud800"}, "UTF-8"),
        ({"exit_code": 2**63}, "64 bits"),
        ({"timeout_seconds": float("nan")}, "finite"),
        ({"chain_depth": "3"}, "chain_depth"),
        ({"chain_depth": 1.5}, "chain_depth"),
        ({"trigger_context": b"{}"}, "trigger_context"),
    )),
]


@pytest.mark.parametrize("via", CREATE_VIAS)
@pytest.mark.parametrize(("values", "named"), BAD_VALUES)
async def test_create_refuses_values_the_spec_does_not_allow(db: StateDB, via: str,
                                                            values: dict[str, Any],
                                                            named: str) -> None:
    await new_run(db)
    before = await snapshot(db)
    unit, statements = traced(create_unit(via, RUN, [values], reason("run.queued.submitted")))
    with pytest.raises(ValueError, match=re.escape(named)):
        await db.write(unit)
    assert statements == []
    assert await snapshot(db) == before


async def test_create_entities_checks_every_row_before_writing_any(db: StateDB) -> None:
    # The bad row is last: a check made row by row, as each is inserted, would already
    # have run INSERTs for the first two (which a caller catching the ValueError inside
    # its own transaction would then commit).
    await new_run(db)
    before = await snapshot(db)
    values = [run_values(), run_values(fired_at=2.0), run_values(no_such_column=1)]
    unit, statements = traced(create_unit("create_entities", RUN, values,
                                          reason("run.queued.submitted")))
    with pytest.raises(ValueError, match="no_such_column"):
        await db.write(unit)
    assert statements == []
    assert await snapshot(db) == before


RICH_REASON = StateReason(
    code="run.queued.submitted",
    summary="submitted by the nightly import",
    evidence_refs=[{"kind": "ticket", "ref": "OPS-42"}, {"kind": "url", "ref": "https://x/y"}],
    metadata={"batch": 7, "tags": ["a", "b"]},
)


@pytest.mark.parametrize("via", CREATE_VIAS)
async def test_a_created_row_carries_its_reason(db: StateDB, via: str) -> None:
    values = [run_values(), run_values("waiting_dependency", fired_at=3.0)]
    # Two initial states, one reason: the engine does not tie a code to a state.
    ids = await db.write(create_unit(via, RUN, values, RICH_REASON))
    assert len(ids) == 2
    for rid, given in zip(ids, values, strict=True):
        row = await stored_run(db, rid)
        assert row["status"] == given["status"]
        assert row["version"] == 1
        assert row["created_at"] == NOW
        assert row["status_reason_code"] == RICH_REASON.code
        assert row["status_reason_summary"] == RICH_REASON.summary
        assert loads(row["status_evidence_refs"]) == RICH_REASON.evidence_refs
        [fact] = await facts_of(db, rid)
        assert fact["entity_type"] == "schedule_run"
        assert fact["previous_status"] is None
        assert fact["status"] == given["status"]
        assert fact["reason_code"] == RICH_REASON.code
        assert fact["reason_summary"] == RICH_REASON.summary
        assert loads(fact["evidence_refs"]) == RICH_REASON.evidence_refs
        assert loads(fact["metadata"]) == RICH_REASON.metadata
        assert (fact["source"], fact["actor"]) == (ACTOR.type, ACTOR.id)
        assert fact["created_at"] == NOW
        assert fact["entity_version"] == 1
        assert fact["idempotency_key"] is None
        # The creation fact's patch is the row as stored (its non-NULL columns), so a
        # rebuild from the log alone recreates the reason columns too.
        patch = loads(fact["patch"])
        stored = {k: v for k, v in row.items() if v is not None and k not in ("status",
                                                                             "version")}
        assert patch == stored
    assert (await verify(db)).ok


@pytest.mark.parametrize("via", CREATE_VIAS)
async def test_the_defaults_a_creation_sends_are_not_read_back(db: StateDB, via: str) -> None:
    """Unsent columns whose spec default the dialect stores exactly (a run's attempt
    counters) go with the row, and its fact's patch records them as sent: no statement
    reads them back (SQLite's RETURNING or SELECT, PostgreSQL's patch from the stored
    row)."""
    values = [run_values(), run_values(fired_at=2.0)]
    unit, statements = traced(create_unit(via, RUN, values, reason("run.queued.submitted")))
    ids = await db.write(unit)
    reads = re.compile(r'RETURNING[^)]*"lease_attempts"|SELECT[^;]*"lease_attempts"'
                       r'|r\."lease_attempts"')
    assert not [s for s in statements if reads.search(s)], statements
    for rid in ids:
        row = await stored_run(db, rid)
        [fact] = await facts_of(db, rid)
        patch = loads(fact["patch"])
        assert (row["lease_attempts"], row["run_attempts"]) == (0, 0)
        assert (patch["lease_attempts"], patch["run_attempts"]) == (0, 0)
    assert (await verify(db)).ok


#: Values a column may store otherwise than sent: JSON text that reads as a number
#: (SQLite's JSON columns have NUMERIC affinity), -0.0 (SQLite's REAL keeps 0.0), an int in
#: a float column (stored as a float on both), JSON text PostgreSQL's jsonb normalizes.
AWKWARD = [
    {"trigger_context": "5"},
    {"trigger_context": "1.50"},
    {"trigger_context": ' {"b": 1,  "a": [1.0, 2]}'},
    {"action_args": '"a string"'},
    {"timeout_seconds": -0.0},
    {"timeout_seconds": 5},
    {"timeout_seconds": 2.5, "chain_depth": 3, "exit_code": None},
]


@pytest.mark.parametrize("via", CREATE_VIAS)
async def test_a_creation_fact_records_each_value_as_its_row_stores_it(
        db: StateDB, via: str) -> None:
    """The creation fact is written from the values sent where the column stores them as
    they are, and from the row read back where it may not (the defaults, and the values
    above): either way its patch is the row as stored, value for value (JSON text never a
    number; on SQLite -0.0's sign included: PostgreSQL's jsonb log has no negative zero),
    so folding the log rebuilds the row exactly."""
    values = [run_values(**extra) for extra in AWKWARD]
    # The same with JSON given as text (as a submit's rows are), and text beyond ASCII.
    values += [run_values(**{"trigger_context": "{}", "action_args": '["echo"]', **extra})
               for extra in [*AWKWARD, {"error_detail": "é\u2028 ok"}]]
    # Each alone, and all at once (one value the dialect would convert sends the whole
    # batch the way that reads every row back).
    ids = [rid for v in values for rid in await db.write(create_unit(via, RUN, [v],
                                                                      RICH_REASON))]
    ids += await db.write(create_unit(via, RUN, values, RICH_REASON))
    for rid in ids:
        row = await stored_run(db, rid)
        [fact] = await facts_of(db, rid)
        patch = loads(fact["patch"])
        stored = {k: v for k, v in row.items()
                  if (v is not None or k in RUN.defaulted) and k not in ("status", "version")}
        assert patch == stored
        for k, v in stored.items():
            # JSON text stays text, a number a number (an integral float may read back
            # from SQLite's RETURNING as an int: equal, as a fold compares it).
            assert isinstance(patch[k], str) == isinstance(v, str), (k, patch[k], v)
            if isinstance(v, float) and db.dialect == "sqlite":  # (jsonb has no -0)
                assert math.copysign(1.0, patch[k]) == math.copysign(1.0, v), (k, v)
    assert (await verify(db)).ok


# ------------------------------------------------------------ submit_many == submit_task


def applications() -> list[TaskApplication]:
    """Plain applications (no key, no dependencies) that differ in every optional field,
    so a batch of them goes through create_entities."""
    return [
        TaskApplication("agent", {"prompt": "hi"}, "host"),
        TaskApplication("flow", {"steps": [1, 2, {"x": None}]}, "process",
                        required_capabilities=["gpu-exclusive", "warmed-cache", "linux"]),
        TaskApplication("agent", {}, "local_worktree", library_ref="lib/a",
                        library_content_hash="sha256:" + "0" * 64),
        TaskApplication("play", {"n": 1.5, "s": "é\u2028"}, "host",
                        retry=RetryPolicy(3, base_delay=0.5, jitter=0), timeout_seconds=12.5),
        TaskApplication("agent", {"prompt": "hi"}, "host"),  # equal to the first
    ]


@pytest.fixture
async def two_dbs(backend: str, request: pytest.FixtureRequest, tmp_path: Path
                  ) -> AsyncIterator[tuple[StateDB, StateDB]]:
    """Two fresh databases of one backend. On PostgreSQL ``submit_task`` writes a creation
    and its fact in one statement, the fact's patch computed from the values sent, while
    ``submit_many`` reads its rows back: the facts must still agree."""
    if backend == "sqlite":
        targets = [str(tmp_path / "one_by_one.db"), str(tmp_path / "batch.db")]
    else:
        base = request.getfixturevalue("pg_database")
        schemas = [f"two_dbs_{os.getpid()}_{i}" for i in range(2)]
        targets = [pg.create_schema(base, s) for s in schemas]
        request.addfinalizer(lambda: [pg.drop_schema(base, s) for s in schemas])
    async with StateDB(targets[0]) as a, StateDB(targets[1]) as b:
        yield a, b


async def all_facts(db: StateDB, ids: list[str]) -> list[dict[str, Any]]:
    """Every fact, in the order of ``ids`` (their runs' creation; one fact per run here)."""
    facts = await db.fetch_all("SELECT * FROM status_transitions")
    assert sorted(f["entity_id"] for f in facts) == sorted(ids)
    return sorted(facts, key=lambda f: ids.index(f["entity_id"]))


def without_ids(fact: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in fact.items() if k not in ("id", "entity_id", "patch")}
    patch = loads(fact["patch"])
    assert "id" in patch
    out["patch"] = {k: v for k, v in patch.items() if k != "id"}
    for col in ("evidence_refs", "metadata"):
        out[col] = loads(out[col])
    return out


@pytest.mark.parametrize("keyed", [False, True], ids=["plain", "with_a_keyed_app"])
async def test_submit_many_writes_the_facts_submit_task_writes(
        two_dbs: tuple[StateDB, StateDB], keyed: bool) -> None:
    one_db, batch_db = two_dbs
    apps = applications()
    if keyed:
        # A keyed application is inserted alone, splitting the batch in two runs.
        apps.insert(2, TaskApplication("agent", {"k": 1}, "host", idempotency_key="key-1"))
    one_ids = [await submit_task(one_db, app, now=NOW, host=HOST) for app in apps]
    batch_ids = await submit_many(batch_db, apps, now=NOW, host=HOST)
    assert len(set(batch_ids)) == len(apps)

    one_facts = await all_facts(one_db, one_ids)
    batch_facts = await all_facts(batch_db, batch_ids)
    assert [f["entity_id"] for f in one_facts] == one_ids
    assert [f["entity_id"] for f in batch_facts] == batch_ids
    for app, one, batch in zip(apps, one_facts, batch_facts, strict=True):
        assert without_ids(batch) == without_ids(one)
        # And what both must be, so the same mistake in both paths fails too.
        assert one["id"] != one["entity_id"]
        assert loads(one["patch"])["id"] == one["entity_id"]
        assert loads(batch["patch"])["id"] == batch["entity_id"]
        assert one["entity_type"] == "schedule_run"
        assert (one["previous_status"], one["status"]) == (None, "queued")
        assert one["reason_code"] == "run.queued.submitted"
        assert one["reason_summary"] == ""
        assert loads(one["evidence_refs"]) == []
        assert loads(one["metadata"]) == {}
        assert (one["source"], one["actor"]) == ("system", "ledgerq.submit")
        assert one["created_at"] == NOW
        assert one["entity_version"] == 1
        assert one["idempotency_key"] is None
        patch = loads(one["patch"])
        assert patch["created_at"] == patch["queued_at"] == patch["fired_at"] == NOW
        assert patch["action_kind"] == app.action_kind
        assert patch.get("idempotency_key") == app.idempotency_key

    # The rows agree as well (only their ids differ), and each log rebuilds its rows.
    for one_id, batch_id in zip(one_ids, batch_ids, strict=True):
        one_row = await stored_run(one_db, one_id)
        batch_row = await stored_run(batch_db, batch_id)
        assert {**batch_row, "id": None} == {**one_row, "id": None}
    assert (await verify(one_db)).ok and (await verify(batch_db)).ok


async def test_submit_many_passes_its_actor_to_every_fact(
        two_dbs: tuple[StateDB, StateDB]) -> None:
    one_db, batch_db = two_dbs
    who = Actor(type="webhook", id="hook-9")
    apps = applications()
    one_ids = [await submit_task(one_db, app, now=NOW, host=HOST, actor=who) for app in apps]
    batch_ids = await submit_many(batch_db, apps, now=NOW, host=HOST, actor=who)
    for db, ids in zip(two_dbs, (one_ids, batch_ids), strict=True):
        facts = await all_facts(db, ids)
        assert len(facts) == len(apps)
        assert {(f["source"], f["actor"]) for f in facts} == {("webhook", "hook-9")}


@pytest.mark.parametrize("batch", [False, True], ids=["create_entity", "create_entities"])
async def test_a_fact_written_from_the_values_sent_is_the_fact_read_back(
        db: StateDB, batch: bool) -> None:
    """PostgreSQL writes a creation's fact from the values sent and what the database fills
    in, in the row's own statement; the other way reads the row back first (SQLite, and
    PostgreSQL for a value its column would convert). Forced to read back, the same rows
    give the same facts and the same rows (ids apart)."""
    apps = applications()

    def unit(read_back: bool) -> Callable[[SqlTx], list[str]]:
        def fn(tx: SqlTx) -> list[str]:
            if read_back:
                tx.stores_as_sent = False
            rows = [run_row(validate(a), NOW, HOST, "queued", [], digest(a), policy=RUN)
                    for a in apps]
            why = StateReason(code="run.queued.submitted")
            if batch:
                return create_entities(tx, RUN, rows, reason=why, actor=ACTOR, now=NOW)
            return [create_entity(tx, RUN, r, reason=why, actor=ACTOR, now=NOW) for r in rows]
        return fn

    sent_ids = await db.write(unit(False))
    read_ids = await db.write(unit(True))
    for sent_id, read_id in zip(sent_ids, read_ids, strict=True):
        [sent], [read] = await facts_of(db, sent_id), await facts_of(db, read_id)
        assert without_ids(sent) == without_ids(read)
        assert {**await stored_run(db, sent_id), "id": None} == \
            {**await stored_run(db, read_id), "id": None}
    assert (await verify(db)).ok
