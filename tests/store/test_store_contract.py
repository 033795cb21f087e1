"""The store contract: every store operation, on every dialect.

The operations are declared by the engine (:class:`ledgerq.lifecycle.store.EventStore`) and by
the queue's wings (``ledgerq.queue.store``, ``ledgerq.queue.<wing>.store``); that both
dialects implement every one of them is checked in ``tests/lifecycle/test_engine_boundary.py``.

River's ``riverdrivertest`` is the model: one suite, each driver run through it. Each
test here calls named operations directly inside ``db.write``/``db.read`` and checks what
they return and what they leave behind, so a dialect whose SQL drifts from the other's
fails here by operation name, not somewhere deep in a queue test.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from helpers import pgbouncer
from helpers.raw import RAW_ERRORS
from ledgerq import StateDB
from ledgerq.codec import dumps, loads
from ledgerq.errors import IntegrityViolation
from ledgerq.lifecycle.facts import Fact
from ledgerq.lifecycle.ids import new_id
from ledgerq.lifecycle.store import FACT_COLUMNS, ClaimFacts, SentMove
from ledgerq.queue.moves import CANDIDATE_COLUMNS, DEFAULT_QUEUE, expired_columns, lease_columns
from ledgerq.queue.store import STUCK_KINDS
from ledgerq.queue.worker.store import Kinds
from ledgerq.store.postgres.tx import PostgresTx
from ledgerq.store.queries import Queries
from ledgerq.store.sqltx import SqlTx
from lifecycle_support import new_run

DIALECTS = ("ledgerq.store.sqlite", "ledgerq.store.postgres")
#: What a claim pass passes with each page it reads (the queue's vocabulary).
CLAIM: dict[str, Any] = {"columns": CANDIDATE_COLUMNS, "default_queue": DEFAULT_QUEUE}


#: Statements only PostgreSQL needs: what SQLite's single writer makes unnecessary (row
#: and key locks, the wake-up channel) and its connection management (schema fingerprint,
#: read-only snapshots), where SQLite uses pragmas and its own file checks.
POSTGRES_ONLY = {"notify_claimable", "listen", "listen_ended", "lock_key", "schema_lock",
                 "lock_for_migration",
                 "tables_present", "in_recovery", "replica_as_of",
                 "durability", "record_schema_version", "forget_prepared", "lock_archives",
                 # SQLite sets its busy timeout by pragma on connecting.
                 "set_timeouts", "set_local_timeouts",
                 # A pass's claims in one statement (SQLite: one swap per row), and
                 # their facts in it too (SQLite: an executemany after).
                 "claim_entities", "claim_pick", "claim_swap", "claim_entities_with_facts",
                 "guard_join", "assign_from_doc", "guard_from_doc",
                 # A move and its fact in one statement (SQLite: two).
                 "update_entity_with_fact",
                 # Several moves and their facts in one statement (SQLite: two a move).
                 "update_entities_with_facts",
                 # A creation and its fact in one statement (SQLite: two), and many
                 # creations as two COPYs (SQLite: two executemany), the facts' patches
                 # completed with jsonb's spelling of each JSON text.
                 "insert_entities_with_facts", "stored_object", "stored_value",
                 "stored_json_text", "copy_entities", "copy_facts", "jsonb_spellings",
                 # Many facts in one statement (SQLite: one executemany).
                 "append_facts", "fact_fields"}


@pytest.fixture(params=["sqlite", "postgresql", "pgbouncer"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each dialect, and PostgreSQL once more through PgBouncer in transaction mode
    (every transaction maybe on another server connection): the operations must hold
    there too."""
    return str(request.param)


def test_both_dialects_define_the_same_query_names() -> None:
    names = [set(Queries(pkg).templates) for pkg in DIALECTS]
    assert names[0] == names[1] - POSTGRES_ONLY, (
        f"only in sqlite: {sorted(names[0] - names[1])}; "
        f"only in postgres: {sorted(names[1] - names[0])}")


def test_a_query_defined_twice_across_a_dialects_files_is_an_error(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "twice_sql"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.sql").write_text("-- name: one\nSELECT 1\n")
    (package / "b.sql").write_text("-- name: two\nSELECT 2\n\n-- name: one\nSELECT 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=r"'one' is defined twice \(a.sql, b.sql\)"):
        Queries("twice_sql")
    (package / "b.sql").write_text("-- name: two\nSELECT 2\n")
    assert Queries("twice_sql").templates == {"one": "SELECT 1", "two": "SELECT 2"}


RUN = "schedule_run"


async def policy_of(db: StateDB) -> Any:
    return db.registry.entity(RUN)


def row_values(**extra: Any) -> dict[str, Any]:
    base = {"id": new_id(), "status": "queued", "trigger_context": "{}", "action_kind": "k",
            "action_args": dumps({"a": [1, 2]}), "fired_at": 1.0, "created_at": 1.0,
            "queued_at": 1.0, "version": 1}
    base.update(extra)
    return base


def fact(**fields: Any) -> Fact:
    """A fact with ``fields``, its other fields a plain creation's."""
    base: dict[str, Any] = {
        "id": new_id(), "entity_type": RUN, "entity_id": "e", "previous_status": None,
        "status": "queued", "reason_code": "run.queued.submitted", "reason_summary": "",
        "evidence_refs": "[]", "source": "system", "actor": "t", "created_at": 1.0,
        "metadata": "{}", "entity_version": 1, "patch": "{}", "idempotency_key": None}
    return Fact(**{**base, **fields})


async def test_insert_and_read_back(db: StateDB) -> None:
    policy = await policy_of(db)
    values = row_values(concurrency_key="h:gpu", required_capabilities=dumps(["gpu"]))
    stored = await db.write(lambda tx: tx.insert_entity(policy, values))
    assert stored["id"] == values["id"] and stored["lease_attempts"] == 0  # a default
    assert loads(stored["action_args"]) == {"a": [1, 2]}  # JSON comes back as JSON text
    got = await db.read(lambda tx: tx.read_entity(policy, values["id"]))
    assert got == stored
    assert await db.read(lambda tx: tx.read_entity(policy, "nope")) is None
    assert await db.read(lambda tx: tx.read_statuses(policy, [values["id"], "nope"])) == {
        values["id"]: "queued"}
    many = [row_values() for _ in range(3)]
    cols = tuple(many[0])
    await db.write(lambda tx: tx.insert_entities(policy, cols, [list(r.values()) for r in many]))
    found = await db.read(lambda tx: tx.read_entities(policy, [r["id"] for r in many]))
    assert sorted(r["id"] for r in found) == sorted(r["id"] for r in many)


async def test_update_entity_is_a_compare_and_swap(db: StateDB) -> None:
    policy = await policy_of(db)
    values = row_values(leased_by=None)
    rid = values["id"]
    await db.write(lambda tx: tx.insert_entity(policy, values))
    assert await db.write(lambda tx: tx.read_for_move(policy, rid, ("leased_by",))) == \
        ("queued", 1, None)

    def swap(version: int, guard: Any) -> Any:
        return db.write(lambda tx: tx.update_entity(
            policy, rid, observed="queued", version=version, to_state="running",
            changes={"leased_by": "w1", "updated_at": 2.0}, guards={"leased_by": guard},
            returning=("leased_by",)))

    assert await swap(1, "someone") is None  # guard (NULL-safe) does not match
    assert await swap(2, None) is None  # version does not match
    assert await swap(1, None) == {"leased_by": "w1"}
    assert await swap(1, None) is None  # status moved on: no second swap
    same = await db.write(lambda tx: tx.update_entity(
        policy, rid, observed="running", version=2, to_state=None,
        changes={"lease_expires_at": 9.5}, guards={}, returning=None))
    assert same is not None and (same["status"], same["version"], same["lease_expires_at"]) \
        == ("running", 3, 9.5)


async def test_an_unread_swap_holds_status_and_guards_and_bumps_the_version(
        db: StateDB) -> None:
    """``version=None``: nothing was read first, so the swap is the read; status and the
    guards still decide, and the row's own version is incremented and returned."""
    policy = await policy_of(db)
    values = row_values(leased_by=None)
    rid = values["id"]
    await db.write(lambda tx: tx.insert_entity(policy, values))

    def swap(observed: str, guard: Any) -> Any:
        return db.write(lambda tx: tx.update_entity(
            policy, rid, observed=observed, version=None, to_state="running",
            changes={"leased_by": "w1", "updated_at": 2.0}, guards={"leased_by": guard},
            returning=("version", "leased_by")))

    assert await swap("queued", "someone") is None  # guard does not match
    assert await swap("running", None) is None  # status does not match
    assert await swap("queued", None) == {"version": 2, "leased_by": "w1"}
    assert await swap("queued", None) is None  # moved on: no second swap
    same = await db.write(lambda tx: tx.update_entity(
        policy, rid, observed="running", version=None, to_state=None,
        changes={"lease_expires_at": 9.5}, guards={"leased_by": "w1"}, returning=None,
        skip_locked=True))
    assert same is not None and (same["status"], same["version"], same["lease_expires_at"]) \
        == ("running", 3, 9.5)


async def test_a_swap_statement_is_made_once_and_runs_in_any_transaction(
        db: StateDB) -> None:
    """The engine keeps one statement per shape of move and runs it with each move's
    values, in transactions after the one that made it: the same compare-and-swap as
    ``update_entity`` (status, version and guards decide; the returned columns as
    stored)."""
    policy = await policy_of(db)
    first, second = row_values(leased_by=None), row_values(leased_by=None)
    for values in (first, second):
        await db.write(lambda tx, v=values: tx.insert_entity(policy, v))
    unread, read = await db.write(lambda tx: tuple(tx.prepare_swap(
        policy, same_state=False, change_cols=("leased_by", "updated_at"),
        guard_cols=("leased_by",), read=read, skip_locked=False,
        returning=("leased_by",) if read else ("version", "leased_by"))
        for read in (False, True)))

    def swap(statement: Any, rid: str, version: int | None, guard: Any) -> Any:
        return db.write(lambda tx: tx.swap(statement, rid, "queued", version, "running",
                                           ["w1", 2.0], [guard]))

    assert await swap(unread, first["id"], None, "someone") is None  # guard decides
    assert await swap(unread, first["id"], None, None) == {"version": 2, "leased_by": "w1"}
    assert await swap(unread, first["id"], None, None) is None  # moved on
    assert await swap(read, second["id"], 2, None) is None  # version decides
    assert await swap(read, second["id"], 1, None) == {"leased_by": "w1"}
    assert await db.read(lambda tx: tx.read_statuses(policy, [first["id"], second["id"]])) == {
        first["id"]: "running", second["id"]: "running"}


async def test_a_move_naming_its_state_runs_no_read_before_its_swap(db: StateDB) -> None:
    """The hot path: a legal move whose caller names the state it expects is one UPDATE
    and one fact INSERT (on PostgreSQL one statement doing both); the row is read only
    when the swap matches nothing (to tell a missing row from a conflict, in the checks'
    order)."""
    from ledgerq.lifecycle import Actor, StateReason
    from ledgerq.lifecycle.engine import apply_move

    policy = await policy_of(db)
    rid = await new_run(db)
    reason = StateReason(code="run.started.ok")
    actor = Actor(type="system", id="w")

    def traced(tx: SqlTx, frm: str, to: str, entity: str = rid) -> tuple[Any, list[str]]:
        seen: list[str] = []
        real = tx.execute

        def spy(sql: str, params: Any = ()) -> Any:
            seen.append(" ".join(sql.split())[:6].upper())
            return real(sql, params)

        tx.execute = spy  # type: ignore[method-assign]
        try:
            return apply_move(tx, policy, entity, frm, to, reason, actor,
                              patch={"leased_by": "w", "lease_expires_at": 5.0}), seen
        finally:
            del tx.execute

    # PostgreSQL stores these values as sent: the swap and its fact are one statement.
    swap = ["WITH U"] if db.dialect == "postgresql" else ["UPDATE", "INSERT"]
    moved, seen = await db.write(lambda tx: traced(tx, "queued", "running"))
    assert moved.applied and seen == swap
    stale, seen = await db.write(lambda tx: traced(tx, "queued", "running"))
    assert not stale.applied and stale.current_state == "running"
    assert seen[:2] == [swap[0], "SELECT"] and "INSERT" not in seen
    with pytest.raises(LookupError):
        await db.write(lambda tx: traced(tx, "queued", "running", "no-such-run"))
    facts = await db.read(lambda tx: tx.read_facts(RUN, rid))
    assert [f["entity_version"] for f in facts] == [1, 2]


@pytest.mark.parametrize("layout", ["one level", "levels and queues", "none queued"])
async def test_oldest_queued_is_the_minimum_over_every_queue_and_priority(
        db: StateDB, layout: str) -> None:
    """Found level by level through the claim order's index (no (queued_at) index): the
    oldest may sit at any priority of any queue, behind newer rows of higher levels."""
    policy = await policy_of(db)
    rows = {
        "one level": [row_values(queued_at=5.0), row_values(queued_at=3.0)],
        "levels and queues": [
            row_values(queue="alpha", priority=9, queued_at=50.0),
            row_values(queue="alpha", priority=0, queued_at=40.0),
            row_values(queue="alpha", priority=-3, queued_at=7.5),
            row_values(queue="beta", priority=1000, queued_at=60.0),
            row_values(queue="default", priority=0, queued_at=30.0),
            row_values(queue="zulu", priority=-1000, queued_at=45.0),
            row_values(status="running", queue="alpha", priority=5, queued_at=1.0),
        ],
        "none queued": [row_values(status="running", queued_at=2.0)],
    }[layout]
    for r in rows:
        await db.write(lambda tx, r=r: tx.insert_entity(policy, r))
    expected = {"one level": 3.0, "levels and queues": 7.5, "none queued": None}[layout]
    assert await db.read(lambda tx: tx.find_oldest_queued_at(policy)) == expected


def test_a_facts_fields_are_the_logs_columns() -> None:
    """The drivers take a Fact as a row in FACT_COLUMNS order, and code reads its fields
    by name: each name must be its column's."""
    assert Fact._fields == FACT_COLUMNS


async def test_many_facts_append_as_given(db: StateDB) -> None:
    """Facts appended together are stored as given: JSON columns as JSON, NULLs as NULL,
    floats and versions exact, each entity's in order."""
    facts = [fact(entity_id=f"e{i % 3}", previous_status=None if i < 3 else "queued",
                  status="running", reason_code="run.started.ok",
                  reason_summary=None if i == 4 else f"s{i}",
                  evidence_refs=dumps([f"r{i}"]), actor=None, created_at=1.0 + i / 3,
                  metadata=dumps({"m": i}), entity_version=i // 3 + 1,
                  patch=dumps({"leased_by": f"w{i}", "lease_expires_at": 0.1 + i}),
                  idempotency_key=None if i % 2 else f"k{i}") for i in range(7)]
    await db.write(lambda tx: tx.append_facts([list(f) for f in facts]))  # any sequence
    for eid in ("e0", "e1", "e2"):
        got = await db.read(lambda tx, eid=eid: tx.read_facts(RUN, eid))
        want = [f for f in facts if f.entity_id == eid]
        assert [g["id"] for g in got] == [f.id for f in want]
        for g, f in zip(got, want, strict=True):
            for c in ("previous_status", "reason_summary", "actor", "created_at",
                      "entity_version", "idempotency_key"):
                assert g[c] == getattr(f, c)
            for c in ("evidence_refs", "metadata", "patch"):
                assert loads(g[c]) == loads(getattr(f, c))
    fresh = fact(entity_id="e9", created_at=9.0)
    with pytest.raises(IntegrityViolation):  # the second repeats (e0, 1): neither is kept
        await db.write(lambda tx: tx.append_facts([fresh, facts[0]._replace(id=new_id())]))
    assert await db.read(lambda tx: tx.read_facts(RUN, "e9")) == []
    # Several entities in one read: (entity_id, version) order, whatever order was asked,
    # missing ids absent, other entity types never included.
    many = await db.read(lambda tx: tx.read_facts_of(RUN, ["e2", "missing", "e0", "e2"]))
    assert [(g["entity_id"], g["entity_version"]) for g in many] == sorted(
        (f.entity_id, f.entity_version) for f in facts if f.entity_id in ("e0", "e2"))
    assert many[0] == (await db.read(lambda tx: tx.read_facts(RUN, "e0")))[0]
    assert await db.read(lambda tx: tx.read_facts_of("dispatch", ["e0"])) == []
    assert await db.read(lambda tx: tx.read_facts_of(RUN, [])) == []


@pytest.mark.parametrize("field, value, carried", [
    (None, None, True), ("created_at", 3, True), ("reason_summary", None, True),
    ("created_at", float("nan"), False), ("created_at", float("inf"), False),
    ("entity_version", 1 << 63, False), ("entity_version", 2.0, False),
    ("reason_code", 3, False), ("patch", b"{}", False), ("actor", True, False)])
def test_a_fact_goes_as_json_only_where_json_carries_it_exactly(
        field: str | None, value: Any, carried: bool) -> None:
    """PostgreSQL sends many facts as one JSON document only when each survives it: a
    time JSON would turn to null or round, a version past 64 bits, a field that is not
    text sends that batch the usual way (typed parameters)."""
    from ledgerq.store.postgres.tx import _as_json

    given = fact(previous_status="queued", status="running", reason_code="c", actor="w",
                 created_at=1.5, entity_version=2)
    if field is not None:
        given = given._replace(**{field: value})
    assert _as_json(given) is carried
    assert _as_json(list(given)) is carried  # any sequence in FACT_COLUMNS order


@pytest.mark.parametrize("text, embedded", [
    ("[]", True), ('{"a": [1, 2.5]}', True), ("1e2", True), ('"s"', True),
    (" null ", False), ("null", False), ("nul", False), ("", False),
    ('"x", "status": "failed"', False), ('[1] {"b": 2}', False), (3, False)])
def test_a_json_columns_text_is_embedded_only_as_one_json_value(text: Any,
                                                                embedded: bool) -> None:
    """PostgreSQL embeds a JSON column's text in a move's document only where it is one
    JSON value other than null: anything else could change the document around it, or
    read back as SQL NULL, so that move goes the usual way (its text cast to jsonb)."""
    from ledgerq.store.postgres.tx import _json_text

    assert _json_text(text) is embedded


async def test_facts_append_and_stream(db: StateDB) -> None:
    facts = [fact(entity_id=eid, entity_version=v, patch=dumps({"x": v}),
                  idempotency_key=f"key-{eid}-{v}" if v == 2 else None)
             for eid in ("b", "a") for v in (1, 2)]
    await db.write(lambda tx: tx.append_facts(facts))
    assert await db.read(lambda tx: tx.count_facts()) == 4
    streamed = await db.read(lambda tx: list(tx.stream_facts(RUN)))
    assert [(f[0], f[2]) for f in streamed] == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
    assert [loads(f[3]) for f in streamed] == [{"x": 1}, {"x": 2}, {"x": 1}, {"x": 2}]
    of_a = await db.read(lambda tx: tx.read_facts(RUN, "a"))
    assert [f["entity_version"] for f in of_a] == [1, 2]
    assert await db.read(lambda tx: tx.find_fact_by_idempotency_key(RUN, "a", "key-a-2")) == (
        facts[3].id, None, "queued")
    assert await db.read(lambda tx: tx.find_fact_by_idempotency_key(RUN, "a", "other")) is None
    with pytest.raises(IntegrityViolation):  # (entity, version) is unique
        await db.write(lambda tx: tx.append_facts([facts[0]._replace(id=new_id())]))


async def test_savepoint_rolls_back_alone(db: StateDB) -> None:
    policy = await policy_of(db)
    kept, lost = row_values(), row_values()

    def unit(tx: SqlTx) -> str:
        tx.insert_entity(policy, kept)
        with pytest.raises(RuntimeError), tx.savepoint():
            tx.insert_entity(policy, lost)
            raise RuntimeError("undo me")
        with pytest.raises(RAW_ERRORS), tx.savepoint():
            tx.insert_entity(policy, kept)  # a duplicate key fails inside its savepoint
        return "ok"

    assert await db.write(unit) == "ok"
    got = await db.read(lambda tx: tx.read_statuses(policy, [kept["id"], lost["id"]]))
    assert got == {kept["id"]: "queued"}


async def test_a_write_alone_is_the_same_write_however_it_is_sent(db: StateDB) -> None:
    # ``alone`` is a hint (PostgreSQL sends a unit of one unread statement without a pool
    # thread): a unit of one statement, one that reads first, one of two statements and
    # one that raises keep and return what they would without it.
    from ledgerq.lifecycle import Actor, StateReason
    from ledgerq.lifecycle.engine import create_entity

    policy = await policy_of(db)
    reason, actor = StateReason(code="run.queued.submitted"), Actor(type="system", id="t")

    def create(tx: SqlTx, values: dict[str, Any]) -> str:
        fields = {k: v for k, v in values.items() if k != "version"}  # (the engine's own)
        return create_entity(tx, policy, fields, reason=reason, actor=actor)

    one, two, three, never = row_values(), row_values(), row_values(), row_values()
    assert await db.write(lambda tx: create(tx, one), alone=True) == one["id"]

    def read_then_create(tx: SqlTx) -> dict[str, str]:
        seen = tx.read_statuses(policy, [one["id"], two["id"]])
        create(tx, two)
        return seen

    assert await db.write(read_then_create, alone=True) == {one["id"]: "queued"}
    assert await db.write(lambda tx: [create(tx, three), create(tx, row_values())],
                          alone=True) == [three["id"], ANY_ID]

    def create_then_raise(tx: SqlTx) -> None:
        create(tx, never)
        raise RuntimeError("undo me")

    with pytest.raises(RuntimeError, match="undo me"):
        await db.write(create_then_raise, alone=True)
    ids = [one["id"], two["id"], three["id"], never["id"]]
    got = await db.read(lambda tx: tx.read_statuses(policy, ids))
    assert got == dict.fromkeys(ids[:3], "queued")
    facts = await db.read(lambda tx: [len(tx.read_facts(RUN, i)) for i in ids])
    assert facts == [1, 1, 1, 0]


class _AnyId:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and len(other) == 36


ANY_ID: Any = _AnyId()


async def test_a_write_that_reads_first_reads_then_writes_in_one_transaction(
        db: StateDB) -> None:
    # reads_first changes when a dialect takes its lock, never what the unit sees or keeps:
    # what it read is current when it writes, a unit that raises leaves nothing behind.
    policy = await policy_of(db)
    first, second = row_values(), row_values()
    await db.write(lambda tx: tx.insert_entity(policy, first))

    def read_then_insert(tx: SqlTx) -> dict[str, str]:
        seen = tx.read_statuses(policy, [first["id"], second["id"]])
        tx.insert_entity(policy, second)
        return seen

    assert await db.write(read_then_insert, reads_first=True) == {first["id"]: "queued"}

    def read_insert_raise(tx: SqlTx) -> None:
        tx.insert_entity(policy, row_values(id="left-behind"))
        raise RuntimeError("undo me")

    with pytest.raises(RuntimeError):
        await db.write(read_insert_raise, reads_first=True)
    got = await db.read(lambda tx: tx.read_statuses(policy, [first["id"], second["id"],
                                                             "left-behind"]))
    assert got == {first["id"]: "queued", second["id"]: "queued"}
    assert await db.write(lambda tx: tx.read_statuses(policy, [second["id"]]),
                          reads_first=True) == {second["id"]: "queued"}


async def test_worker_rows(db: StateDB) -> None:
    await db.write(lambda tx: tx.upsert_worker("w1", '["gpu"]', '["host"]', 5.0, "h", 42,
                                                  '["default"]'))
    await db.write(lambda tx: tx.upsert_worker("w1", '["gpu"]', '["host"]', 7.0, "h", 43,
                                                  '["a", "b"]'))
    assert await db.read(lambda tx: tx.read_worker_heartbeat("w1")) == 7.0
    assert await db.read(lambda tx: tx.read_worker_heartbeat("nobody")) is None
    assert await db.read(lambda tx: tx.list_workers()) == [
        {"worker_id": "w1", "hostname": "h", "pid": 43, "last_heartbeat_at": 7.0}]
    (row,) = await db.read(lambda tx: tx.list_worker_rows())
    queues = loads(row["queues"]) if isinstance(row["queues"], str) else row["queues"]
    assert queues == ["a", "b"]  # the latest heartbeat's queues (jsonb comes back decoded)
    assert row["kinds"] is None  # a heartbeat that does not say which kinds it claims
    await db.write(lambda tx: tx.upsert_worker("w1", "[]", "[]", 8.0, "h", 43, "[]",
                                                  '["command", "app.task"]'))
    (row,) = await db.read(lambda tx: tx.list_worker_rows())
    kinds = loads(row["kinds"]) if isinstance(row["kinds"], str) else row["kinds"]
    assert kinds == ["command", "app.task"]


async def test_worker_stop_requests(db: StateDB) -> None:
    await db.write(lambda tx: tx.upsert_worker("w1", "[]", '["host"]', 5.0, "h", 42,
                                                  '["default"]'))
    assert await db.read(lambda tx: tx.read_worker_stop_request("w1")) is None
    assert await db.write(lambda tx: tx.request_worker_stop("w1", 9.0)) is True
    assert await db.write(lambda tx: tx.request_worker_stop("nobody", 9.0)) is False
    assert await db.read(lambda tx: tx.read_worker_stop_request("w1")) == 9.0
    # A heartbeat keeps the request: only the worker process it was meant for decides.
    await db.write(lambda tx: tx.upsert_worker("w1", "[]", '["host"]', 10.0, "h", 42,
                                                  '["default"]'))
    rows = await db.read(lambda tx: tx.list_worker_rows())
    assert [(r["worker_id"], r["stop_requested_at"], r["started_at"]) for r in rows] == [
        ("w1", 9.0, 5.0)]


async def test_facts_after_and_since_filters(db: StateDB) -> None:
    policy = await policy_of(db)
    ids = [await new_run(db) for _ in range(3)]
    everything = await db.read(lambda tx: tx.read_facts_after(RUN, "", 100))
    # In id order: the millisecond each was made in, then random bits.
    assert [f["id"] for f in everything] == sorted(f["id"] for f in everything)
    assert sorted(f["entity_id"] for f in everything) == sorted(ids)
    after_first = await db.read(lambda tx: tx.read_facts_after(RUN, everything[0]["id"], 100))
    assert after_first == everything[1:]
    assert len(await db.read(lambda tx: tx.read_facts_after(RUN, "", 2))) == 2
    assert await db.read(lambda tx: tx.read_facts_after("dispatch", "", 100)) == []
    for rid, created, updated in (("early", 1.0, 30.0), ("late", 1.0, 50.0),
                                  ("never_moved", 45.0, None)):
        await db.write(lambda tx, r=rid, c=created, u=updated: tx.insert_entity(
            policy, row_values(id=r, created_at=c, updated_at=u, action_kind="since")))
    total, rows = await db.read(lambda tx: tx.read_page(
        policy, {"action_kind": ["since"]}, ("id",), 10, 0, since=("updated_at", 40.0)))
    assert total == 2 and sorted(r["id"] for r in rows) == ["late", "never_moved"]


#: A claim filter that takes every kind.
ANY_KIND = Kinds((), only=False)


async def test_queue_scans(db: StateDB) -> None:
    policy = await policy_of(db)
    rows = [
        row_values(id="q1", queued_at=1.0),
        row_values(id="q2", queued_at=2.0, action_kind="skipme"),
        row_values(id="q3", queued_at=3.0, concurrency_key="h:gpu"),
        row_values(id="r1", status="running", leased_by="w1", lease_expires_at=5.0,
                   lease_token="t", lease_attempts=1, concurrency_key="h:gpu"),
        row_values(id="r2", status="running", leased_by="w2", lease_expires_at=50.0),
        row_values(id="rw", status="retry_wait", retry_due_at=4.0),
        row_values(id="d1", status="delayed", not_before=6.0),
    ]
    for r in rows:
        await db.write(lambda tx, r=r: tx.insert_entity(policy, r))
    page = await db.read(lambda tx: tx.read_claim_page(
        policy, Kinds(("skipme",), only=False), "default", None, 10, **CLAIM))
    assert [r["id"] for r in page] == ["q1", "q3"]
    assert set(page[0]) == set(CANDIDATE_COLUMNS)
    # A worker claims only the kinds it has code for.
    page = await db.read(lambda tx: tx.read_claim_page(
        policy, Kinds(("skipme", "other"), only=True), "default", None, 10, **CLAIM))
    assert [r["id"] for r in page] == ["q2"]
    assert await db.read(lambda tx: tx.read_claim_page(
        policy, Kinds((), only=True), "default", None, 10, **CLAIM)) == []
    page = await db.read(lambda tx: tx.read_claim_page(
        policy, ANY_KIND, "default", (0, 1.0, "q1"), 1, **CLAIM))
    assert [r["id"] for r in page] == ["q2"]
    expired = await db.read(lambda tx: tx.list_expired_leases(
        policy, 10.0, columns=expired_columns(policy)))
    assert [r["id"] for r in expired] == ["r1"] and set(expired[0]) == set(expired_columns(policy))
    assert await db.read(lambda tx: tx.list_expired_leases(
        policy, 100.0, limit=1, columns=expired_columns(policy))) != []
    assert [r["id"] for r in await db.read(lambda tx: tx.list_due_retries(policy, 4.0))] == ["rw"]
    assert await db.read(lambda tx: tx.list_due_retries(policy, 3.9)) == []
    due = await db.read(lambda tx: tx.list_due_starts(policy, 6.0))
    assert due == [{"id": "d1", "not_before": 6.0}]
    assert await db.read(lambda tx: tx.list_due_starts(policy, 5.9)) == []
    assert await db.read(lambda tx: tx.list_running_keys(policy)) == {"h:gpu"}
    assert await db.read(lambda tx: tx.is_key_running(policy, "h:gpu"))
    assert not await db.read(lambda tx: tx.is_key_running(policy, "h:other"))
    leases = await db.read(lambda tx: tx.read_leases(
        policy, ["r1", "q1"], columns=lease_columns(policy)))
    assert {r["id"]: r["leased_by"] for r in leases} == {"r1": "w1", "q1": None}
    assert set(leases[0]) == set(lease_columns(policy)) == {
        "id", "status", "leased_by", "lease_expires_at", "lease_token"}
    assert await db.read(lambda tx: tx.count_running_by_worker(policy)) == {"w1": 1, "w2": 1}
    assert await db.read(lambda tx: tx.find_oldest_queued_at(policy)) == 1.0
    assert await db.read(lambda tx: tx.list_queued_kinds(policy)) == ["k", "skipme"]
    assert (await db.read(lambda tx: tx.count_statuses(policy))) == {
        "queued": 3, "running": 2, "retry_wait": 1, "delayed": 1}
    total, got = await db.read(lambda tx: tx.read_page(
        policy, {"status": ["queued", "running"], "action_kind": ["k"]}, ("id", "status"), 2, 1))
    assert total == 4 and len(got) == 2 and set(got[0]) == {"id", "status"}
    assert await db.read(lambda tx: tx.list_ids_matching(policy, "q", suffix=False, limit=5)) == [
        "q1", "q2", "q3"]
    assert await db.read(lambda tx: tx.list_ids_matching(policy, "1", suffix=True, limit=5)) == [
        "d1", "q1", "r1"]
    assert (await db.write(lambda tx: tx.read_for_move(policy, "q1", (), skip_locked=True))
            == ("queued", 1))
    # Claim order: priority descending, then (queued_at, id); one queue at a time; a
    # page continues within its cursor's priority level, then goes below it.
    for r in (row_values(id="p5a", queued_at=9.0, priority=5),
              row_values(id="p5b", queued_at=8.0, priority=5),
              row_values(id="n1", queued_at=0.5, priority=-1),
              row_values(id="o1", queued_at=0.1, priority=9, queue="other")):
        await db.write(lambda tx, r=r: tx.insert_entity(policy, r))
    page = await db.read(lambda tx: tx.read_claim_page(
        policy, ANY_KIND, "default", None, 10, **CLAIM))
    assert [r["id"] for r in page] == ["p5b", "p5a", "q1", "q2", "q3", "n1"]
    page = await db.read(lambda tx: tx.read_claim_page(
        policy, ANY_KIND, "default", (5, 8.0, "p5b"), 2, **CLAIM))
    assert [r["id"] for r in page] == ["p5a", "q1"]
    page = await db.read(lambda tx: tx.read_claim_page(
        policy, ANY_KIND, "default", (0, 3.0, "q3"), 5, **CLAIM))
    assert [r["id"] for r in page] == ["n1"]
    page = await db.read(lambda tx: tx.read_claim_page(policy, ANY_KIND, "other", None, 5, **CLAIM))
    assert [(r["id"], r["priority"], r["queue"]) for r in page] == [("o1", 9, "other")]
    assert await db.read(lambda tx: tx.read_claim_page(
        policy, ANY_KIND, "nobody", None, 5, **CLAIM)) == []


async def test_dependencies_and_settling(db: StateDB) -> None:
    policy = await policy_of(db)
    done, bad = await new_run(db), await new_run(db)
    await db.write(lambda tx: tx.update_entity(
        policy, bad, observed="queued", version=1, to_state="cancelled", changes={},
        guards={}, returning=()))
    waits = {
        "w-ok": [done], "w-bad": [done, bad], "w-none": [], "w-broken": "not json",
    }
    for rid, deps in waits.items():
        text = deps if isinstance(deps, str) else dumps(deps)
        if isinstance(deps, str) and db.dialect == "postgresql":
            text = dumps({"not": "a list"})  # jsonb holds only JSON: the nearest breakage
        values = row_values(id=rid, status="waiting_dependency", depends_on=text)
        await db.write(lambda tx, v=values: tx.insert_entity(policy, v))
    waiting = await db.read(lambda tx: tx.list_waiting_runs(policy, list(waits)))
    assert {r[0] for r in waiting} == set(waits)
    assert {r[0] for r in await db.read(lambda tx: tx.list_dependents(policy, [done]))} == {
        "w-ok", "w-bad"}
    # Of several ended runs at once: each dependent once, however many it names.
    both = await db.read(lambda tx: tx.list_dependents(policy, [done, bad, "nobody"]))
    assert sorted(r[0] for r in both) == ["w-bad", "w-ok"]
    assert await db.read(lambda tx: tx.list_dependents(policy, ["nobody"])) == []
    # w-bad: a dependency ended badly; w-none: nothing to wait for; w-ok waits on "done",
    # still queued. The broken row never settles.
    assert set(await db.read(lambda tx: tx.list_settled_waiting(policy))) == {"w-bad", "w-none"}
    n, sample = await db.read(lambda tx: tx.find_stuck_runs(policy, "waiting", 0.0, 0.0, 10))
    assert n == 1 and sample[0][0] == "w-broken"


async def test_stuck_kinds_all_answer(db: StateDB) -> None:
    policy = await policy_of(db)
    for kind in STUCK_KINDS:
        n, sample = await db.read(lambda tx, k=kind: tx.find_stuck_runs(policy, k, 100.0, 1.0, 5))
        assert (n, sample) == (0, [])
    with pytest.raises(ValueError, match="unknown kind"):
        await db.read(lambda tx: tx.find_stuck_runs(policy, "other", 0.0, 0.0, 1))


async def test_schedules_and_rebuild_operations(db: StateDB) -> None:
    policy = await policy_of(db)
    await db.write(lambda tx: tx.ensure_schedule("s1", "nightly", 1.0))
    await db.write(lambda tx: tx.ensure_schedule("s1", "other name", 2.0))  # no-op
    assert await db.fetch_all("SELECT id, name FROM schedules") == [
        {"id": "s1", "name": "nightly"}]
    rid = await new_run(db)
    rows = await db.read(lambda tx: list(tx.stream_entities(policy)))
    assert [r["id"] for r in rows] == [rid]

    def wipe(tx: SqlTx) -> int:
        tx.defer_constraints()
        tx.delete_entities(policy)
        return len(tx.read_statuses(policy, [rid]))

    assert await db.write(wipe) == 0
    await db.write(lambda tx: tx.notify_claimable())  # harmless everywhere
    await db.write(lambda tx: tx.lock_key("h:gpu"))


async def test_two_connections_race_one_compare_and_swap(db_target: str) -> None:
    """Two handles (two connections, two processes' worth of isolation) move the same row
    from the same version at once: exactly one applies, on either backend."""
    from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, transition

    async with StateDB(db_target, **pgbouncer.options(db_target)) as a, \
            StateDB(db_target, **pgbouncer.options(db_target)) as b:
        rid = await new_run(a)
        for attempt in range(20):
            to = "running" if attempt % 2 == 0 else "queued"
            frm = "queued" if to == "running" else "running"
            patch = {"leased_by": "w", "lease_expires_at": 1.0} if to == "running" else {}
            reason = "run.started.ok" if to == "running" else "run.queued.lease_expired"

            def req(who: str, frm: str = frm, to: str = to, reason: str = reason,
                    attempt: int = attempt) -> TransitionRequest:
                return TransitionRequest(entity_type=RUN, entity_id=rid, from_state=frm,
                                         to_state=to, reason=StateReason(code=reason),
                                         actor=Actor(type="system", id=who),
                                         idempotency_key=f"{who}-{attempt}")

            results = await asyncio.gather(transition(a, req("a"), patch=patch),
                                           transition(b, req("b"), patch=patch))
            assert sorted(r.applied for r in results) == [False, True], (attempt, results)
        from ledgerq.projections import verify

        assert (await verify(a)).ok


async def test_a_claimants_read_skips_a_row_another_transaction_holds(db: StateDB) -> None:
    """``skip_locked``: where writers run at once, a row another transaction holds reads as
    absent at once (no wait); the row itself is untouched. SQLite has one writer."""
    if db.dialect == "sqlite":
        pytest.skip("SQLite's single writer never meets another's row lock")
    from helpers.raw import raw

    policy = await policy_of(db)
    rid = await new_run(db)
    holder = raw(db.path)
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT id FROM schedule_runs WHERE id = ? FOR UPDATE", (rid,))
        got = await asyncio.wait_for(db.write(
            lambda tx: tx.read_for_move(policy, rid, (), skip_locked=True)), 5)
        assert got is None
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert await db.write(lambda tx: tx.read_for_move(policy, rid, (), skip_locked=True)) \
        == ("queued", 1)


async def test_a_claimants_unread_swap_skips_a_row_another_transaction_holds(
        db: StateDB) -> None:
    """The unread swap with ``skip_locked`` matches nothing at once while another
    transaction holds the row (no wait), and applies once it is released."""
    if db.dialect == "sqlite":
        pytest.skip("SQLite's single writer never meets another's row lock")
    from helpers.raw import raw

    policy = await policy_of(db)
    rid = await new_run(db)

    def claim() -> Any:
        return db.write(lambda tx: tx.update_entity(
            policy, rid, observed="queued", version=None, to_state="running",
            changes={"leased_by": "w1", "updated_at": 2.0}, guards={"leased_by": None},
            returning=("version",), skip_locked=True))

    holder = raw(db.path)
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT id FROM schedule_runs WHERE id = ? FOR UPDATE", (rid,))
        assert await asyncio.wait_for(claim(), 5) is None
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert await claim() == {"version": 2}


async def test_keyset_pages_and_log_aggregates(db: StateDB) -> None:
    """run_page_before pages newest first by (created_at, id) with filters; fact_counts
    groups the log by reason code; wait_histogram measures each fact from the previous."""
    policy = await policy_of(db)
    rows = [row_values(id=f"p{i}", created_at=float(i // 2), action_kind="a" if i % 3 else "b")
            for i in range(7)]
    for r in rows:
        await db.write(lambda tx, r=r: tx.insert_entity(policy, r))
    cols = ("id", "created_at", "action_kind")
    first = await db.read(lambda tx: tx.read_page_before(policy, {}, cols, None, 3))
    assert [r["id"] for r in first] == ["p6", "p5", "p4"] and set(first[0]) == set(cols)
    after = (first[-1]["created_at"], first[-1]["id"])
    rest = await db.read(lambda tx: tx.read_page_before(policy, {}, cols, after, 10))
    assert [r["id"] for r in rest] == ["p3", "p2", "p1", "p0"]
    only_a = await db.read(lambda tx: tx.read_page_before(
        policy, {"action_kind": ["a"], "status": []}, cols, (2.0, "p5"), 10))
    assert [r["id"] for r in only_a] == ["p4", "p2", "p1"]

    def waited(eid: str, version: int, code: str, at: float) -> Fact:
        return fact(entity_id=eid, entity_version=version, reason_code=code, created_at=at)

    await db.write(lambda tx: tx.append_facts([
        waited("x", 1, "run.queued.submitted", 10.0), waited("x", 2, "run.started.ok", 10.5),
        waited("x", 3, "run.queued.lease_expired", 20.0),
        waited("x", 4, "run.started.ok", 23.0),
        waited("y", 1, "run.queued.submitted", 5.0), waited("y", 2, "run.started.ok", 6.0),
    ]))
    assert await db.read(lambda tx: tx.count_facts_by_reason()) == [
        (RUN, "run.queued.lease_expired", 1), (RUN, "run.queued.submitted", 2),
        (RUN, "run.started.ok", 3)]
    cumulative, count, total = await db.read(
        lambda tx: tx.read_wait_histogram(RUN, "run.started.ok", [0.5, 1.0, 2.0]))
    assert (cumulative, count, total) == ([1, 2, 2], 3, 4.5)
    assert await db.read(lambda tx: tx.read_wait_histogram(RUN, "nothing", [1.0])) == ([0], 0, 0.0)


async def test_claim_entities_swaps_in_order_until_the_limit(db: StateDB) -> None:
    """Several claimants' swaps at once: each row guarded on its own values, in the given
    order, only the first ``limit`` that match; the rest untouched."""
    policy = await policy_of(db)
    rids = [await new_run(db) for _ in range(4)]
    # The second row no longer has the guard's value (another lease meanwhile).
    await db.write(lambda tx: tx.update_entity(
        policy, rids[1], observed="queued", version=None, to_state=None,
        changes={"lease_attempts": 5}, guards={}, returning=("version",)))
    rows = [(rid, {"lease_attempts": 0, "leased_by": None},
             {"leased_by": "w1", "lease_token": f"t{i}", "lease_attempts": 1})
            for i, rid in enumerate(rids)]
    got = await db.write(lambda tx: tx.claim_entities(
        policy, rows, observed="queued", to_state="running",
        changes={"updated_at": 2.0}, limit=2))
    assert [(r["id"], r["status"], r["version"], r["lease_token"], r["leased_by"],
             r["updated_at"]) for r in got] == [
        (rids[0], "running", 2, "t0", "w1", 2.0), (rids[2], "running", 2, "t2", "w1", 2.0)]
    assert [(await db.write(lambda tx, r=r: tx.read_for_move(policy, r, ())))
            for r in rids] == [("running", 2), ("queued", 2), ("running", 2), ("queued", 1)]
    again = await db.write(lambda tx: tx.claim_entities(
        policy, rows, observed="queued", to_state="running", changes={}, limit=5))
    assert [r["id"] for r in again] == [rids[3]]  # moved on, or guards no longer match


@pytest.mark.parametrize("exact", [False, True])
async def test_claim_entities_with_facts_writes_a_fact_for_each_row_claimed(
        db: StateDB, exact: bool) -> None:
    """The claims as claim_entities makes them, and each claimed row's fact: the shared
    fields and patch, its own id, row, new version and stored values; none for a row
    that was not claimed. The same whether the dialect may build the patches in the
    claims' statement (``exact``) or builds them from the rows it got back."""
    policy = await policy_of(db)
    rids = [await new_run(db) for _ in range(4)]
    await db.write(lambda tx: tx.update_entity(  # the second no longer matches its guard
        policy, rids[1], observed="queued", version=None, to_state=None,
        changes={"lease_attempts": 5}, guards={}, returning=("version",)))
    rows = [(rid, {"lease_attempts": 0, "leased_by": None},
             {"leased_by": "w1", "lease_token": f"t{i}", "lease_attempts": 1})
            for i, rid in enumerate(rids)]
    ids = [new_id(), new_id()]
    fields = fact(id="", entity_id="", previous_status="queued", status="running",
                  reason_code="run.started.ok", reason_summary="claimed",
                  evidence_refs='["e"]', actor="w1", created_at=2.0, metadata='{"m": 1}',
                  entity_version=0)
    facts = ClaimFacts(ids, fields, {"updated_at": 2.0, "lease_expires_at": 7.5},
                       ("lease_token", "lease_attempts", "status_evidence_refs"), exact)
    got = await db.write(lambda tx: tx.claim_entities_with_facts(
        policy, rows, observed="queued", to_state="running",
        changes={"updated_at": 2.0, "status_evidence_refs": '["e"]'}, limit=2, facts=facts))
    assert [(r["id"], r["version"], r["lease_token"]) for r in got] == [
        (rids[0], 2, "t0"), (rids[2], 2, "t2")]
    written = await db.read(lambda tx: tx.read_facts(RUN, rids[0]) + tx.read_facts(RUN, rids[1])
                            + tx.read_facts(RUN, rids[2]) + tx.read_facts(RUN, rids[3]))
    claims = [f for f in written if f["status"] == "running"]
    assert sorted(f["id"] for f in claims) == sorted(ids)
    by_run = {f["entity_id"]: f for f in claims}
    assert sorted(by_run) == sorted([rids[0], rids[2]])
    for i in (0, 2):
        f = by_run[rids[i]]
        assert (f["previous_status"], f["reason_code"], f["reason_summary"], f["actor"],
                f["created_at"], f["entity_version"], f["idempotency_key"]) == (
            "queued", "run.started.ok", "claimed", "w1", 2.0, 2, None)
        assert loads(f["evidence_refs"]) == ["e"] and loads(f["metadata"]) == {"m": 1}
        assert loads(f["patch"]) == {"updated_at": 2.0, "lease_expires_at": 7.5,
                                     "lease_token": f"t{i}", "lease_attempts": 1,
                                     "status_evidence_refs": '["e"]'}


async def test_claim_facts_written_with_the_claims_equal_those_written_after_them(
        db: StateDB, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL writes a pass's claim facts in the claims' own statement, their patch
    partly built by the server from the rows as stored: the facts must be the ones the
    claims and a second statement wrote (compared with the dialect told it cannot)."""
    if db.dialect == "sqlite":
        pytest.skip("SQLite writes a pass's claim facts after its claims: nothing to compare")
    from ledgerq.lifecycle import StateReason
    from ledgerq.lifecycle.engine import apply_claims
    from ledgerq.queue.runs import worker_actor

    ids = [await new_run(db) for _ in range(2)]
    policy = await policy_of(db)
    reason = StateReason(code="run.started.ok", summary="claimed by w",
                         evidence_refs=[{"kind": "lease", "n": 1}])
    actor = worker_actor("w")

    def claim(rid: str, token: str) -> Any:
        return lambda tx: apply_claims(
            tx, policy, [(rid, {"lease_attempts": 0, "leased_by": None},
                          {"leased_by": "w", "lease_expires_at": 1300.25,
                           "lease_token": token, "lease_attempts": 1})],
            "queued", "running", reason, actor, limit=1, now=1000.0)

    together = await db.write(claim(ids[0], "t"))
    monkeypatch.setattr(PostgresTx, "stores_as_sent", False)
    after = await db.write(claim(ids[1], "t"))
    assert len(together) == len(after) == 1

    async def fact(rid: str) -> dict[str, Any]:
        rows = await db.fetch_all(
            "SELECT * FROM status_transitions WHERE entity_id = ? AND status = 'running'",
            (rid,))
        assert len(rows) == 1
        return {k: (loads(v) if k in ("patch", "evidence_refs", "metadata") else v)
                for k, v in rows[0].items() if k not in ("id", "entity_id")}

    assert await fact(ids[0]) == await fact(ids[1])
    patch = (await fact(ids[0]))["patch"]
    assert patch["lease_expires_at"] == 1300.25 and patch["updated_at"] == 1000.0
    assert loads(patch["status_evidence_refs"]) == [{"kind": "lease", "n": 1}]


async def test_claim_entities_takes_each_rows_values_by_column_name(db: StateDB) -> None:
    """Rows give the same columns, not necessarily in the same order: each value goes to
    its own column, whichever order its row's guard and patch list them in."""
    policy = await policy_of(db)
    rids = [await new_run(db) for _ in range(2)]
    rows = [(rids[0], {"lease_attempts": 0, "leased_by": None},
             {"leased_by": "w1", "lease_token": "t0", "lease_expires_at": 10.0}),
            (rids[1], {"leased_by": None, "lease_attempts": 0},
             {"lease_expires_at": 20.0, "lease_token": "t1", "leased_by": "w2"})]
    got = await db.write(lambda tx: tx.claim_entities(
        policy, rows, observed="queued", to_state="running", changes={}, limit=2))
    assert [(r["leased_by"], r["lease_token"], r["lease_expires_at"]) for r in got] == [
        ("w1", "t0", 10.0), ("w2", "t1", 20.0)]


async def test_claim_entities_skips_a_row_another_transaction_holds(db: StateDB) -> None:
    if db.dialect == "sqlite":
        pytest.skip("SQLite's single writer never meets another's row lock")
    from helpers.raw import raw

    policy = await policy_of(db)
    rids = [await new_run(db) for _ in range(3)]
    rows = [(rid, {"leased_by": None}, {"leased_by": "w1"}) for rid in rids]

    def claim() -> Any:
        return db.write(lambda tx: tx.claim_entities(
            policy, rows, observed="queued", to_state="running", changes={}, limit=2))

    holder = raw(db.path)
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT id FROM schedule_runs WHERE id = ? FOR UPDATE", (rids[0],))
        got = await asyncio.wait_for(claim(), 5)
        assert [r["id"] for r in got] == rids[1:]  # no wait; the held row uses no slot
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    assert [r["id"] for r in await claim()] == rids[:1]


async def test_writes_together_commit_apart_from_one_that_raises(db: StateDB) -> None:
    """Group commit: writes that share a transaction are each still all-or-nothing; the
    one that raises leaves nothing and raises alone, the others commit."""
    policy = await policy_of(db)
    rids = [await new_run(db) for _ in range(5)]

    def move(rid: str, fail: bool) -> Any:
        def unit(tx: SqlTx) -> Any:
            got = tx.update_entity(policy, rid, observed="queued", version=None,
                                   to_state="running", changes={"leased_by": "w1"},
                                   guards={}, returning=("version",))
            if fail:
                raise RuntimeError("unit blew up")
            return got
        return db.write_together(unit)

    results = await asyncio.gather(*(move(r, i == 2) for i, r in enumerate(rids)),
                                   return_exceptions=True)
    assert [r if isinstance(r, dict) else type(r).__name__ for r in results] == \
        [{"version": 2}, {"version": 2}, "RuntimeError", {"version": 2}, {"version": 2}]
    states = [await db.write(lambda tx, r=r: tx.read_for_move(policy, r, ())) for r in rids]
    assert states == [("running", 2), ("running", 2), ("queued", 1), ("running", 2),
                      ("running", 2)]


def sent_move(rid: str, guard: Any, worker: str = "w1", to_state: str | None = "running"
              ) -> SentMove:
    """A move off queued (None: staying there), guarded on leased_by, and its fact."""
    return SentMove(rid, "queued", None, to_state, {"leased_by": worker, "updated_at": 2.0},
                    {"leased_by": guard}, False, fact(
                        entity_id=rid, previous_status="queued", status=to_state or "queued",
                        reason_code="run.started.ok", actor="w", created_at=2.0,
                        entity_version=0, patch=dumps({"leased_by": worker})))


async def test_update_entities_with_facts_writes_a_fact_only_where_its_swap_matched(
        db: StateDB) -> None:
    policy = await policy_of(db)
    rid = await new_run(db)

    def move(guard: Any) -> Any:
        return db.write(lambda tx: tx.update_entities_with_facts(
            policy, [sent_move(rid, guard)]))

    assert await move("someone") == [None]  # guard does not match: no fact
    assert await move(None) == [2]
    assert await move(None) == [None]  # moved on
    facts = await db.read(lambda tx: tx.read_facts(RUN, rid))
    assert [(f["entity_version"], f["status"], loads(f["patch"])) for f in facts][1:] == \
        [(2, "running", {"leased_by": "w1"})]


async def test_update_entities_with_facts_takes_each_move_in_order(db: StateDB) -> None:
    """Several moves at once (PostgreSQL sends them together): each its own guarded swap,
    its own fact only where it matched, its own result, in order; moves of two shapes
    (one guarded, one leaving the status where it is) keep their order."""
    policy = await policy_of(db)
    rids = [await new_run(db) for _ in range(4)]
    got = await db.write(lambda tx: tx.update_entities_with_facts(policy, [
        sent_move(rids[0], None), sent_move(rids[1], "someone"), sent_move(rids[2], None),
        sent_move(rids[3], None, to_state=None),
        sent_move(rids[0], None, worker="w2")]))  # rids[0] moved on by the first
    assert got == [2, None, 2, 2, None]
    states = [await db.write(lambda tx, r=r: tx.read_for_move(policy, r, ("leased_by",)))
              for r in rids]
    assert states == [("running", 2, "w1"), ("queued", 1, None), ("running", 2, "w1"),
                      ("queued", 2, "w1")]
    facts = {r: await db.read(lambda tx, r=r: tx.read_facts(RUN, r)) for r in rids}
    assert [len(facts[r]) for r in rids] == [2, 1, 2, 2]
    assert [(f["entity_version"], f["status"]) for f in facts[rids[3]]] == \
        [(1, "queued"), (2, "queued")]


@pytest.mark.parametrize("evidence", ['["e", {"n": 1.5}]', " null ", None])
async def test_update_entities_with_facts_together_store_what_one_at_a_time_stores(
        db: StateDB, evidence: str | None) -> None:
    """Moves of one shape sent together (PostgreSQL: one statement, their terms as JSON
    documents, or pipelined where a document cannot carry a value exactly, as JSON's null
    in a JSON column) leave every row and fact as the same moves sent one at a time; a
    move whose guard no longer holds among them writes nothing."""
    policy = await policy_of(db)

    def moves(rids: list[str]) -> list[SentMove]:
        out = []
        for i, rid in enumerate(rids):
            changes = {"leased_by": "w1", "updated_at": 2.5 + i, "lease_expires_at": 1e10 / 3,
                       "status_evidence_refs": evidence, "error_detail": None,
                       "lease_attempts": 7, "stdout_tail": "out\u00e9 'x'"}
            out.append(SentMove(rid, "queued", None, "running", changes,
                                {"leased_by": "someone" if i == 1 else None}, False, fact(
                                    entity_id=rid, previous_status="queued", status="running",
                                    reason_code="run.started.ok", actor="w",
                                    created_at=2.5 + i, metadata='{"m": 1}', entity_version=0,
                                    patch=dumps(changes))))
        return out

    together = [await new_run(db) for _ in range(3)]
    alone = [await new_run(db) for _ in range(3)]
    got = await db.write(lambda tx: tx.update_entities_with_facts(policy, moves(together)))
    one_by_one = [await db.write(lambda tx, m=m: tx.update_entities_with_facts(policy, [m]))
                  for m in moves(alone)]
    assert got == [2, None, 2] and one_by_one == [[2], [None], [2]]

    def same(row: dict[str, Any], rid: str) -> dict[str, Any]:
        drop = {"id", "created_at", "queued_at", "fired_at"}
        return {k: v for k, v in row.items() if k not in drop}

    for t, a in zip(together, alone, strict=True):
        rt = await db.read(lambda tx, r=t: tx.read_entity(policy, r))
        ra = await db.read(lambda tx, r=a: tx.read_entity(policy, r))
        assert same(rt, t) == same(ra, a)
        ft = await db.read(lambda tx, r=t: tx.read_facts(RUN, r))
        fa = await db.read(lambda tx, r=a: tx.read_facts(RUN, r))
        assert [{k: v for k, v in f.items() if k not in {"id", "entity_id"}} for f in ft[1:]] \
            == [{k: v for k, v in f.items() if k not in {"id", "entity_id"}} for f in fa[1:]]
    moved = await db.read(lambda tx: tx.read_entity(policy, together[0]))
    assert moved["status"] == "running" and moved["lease_expires_at"] == 1e10 / 3
    assert moved["stdout_tail"] == "out\u00e9 'x'" and moved["lease_attempts"] == 7


@pytest.mark.parametrize("odd", [None, "time", "json"])
async def test_creations_together_store_what_one_at_a_time_stores(
        db: StateDB, odd: str | None) -> None:
    """Many creations in one call (PostgreSQL: two COPYs, each fact's patch completed on
    the client with jsonb's spelling of the row's JSON texts) store the rows and facts
    that one call a creation stores, odd values included (an infinite time; a JSON
    column's ``null``; floats, escapes and big integers inside JSON)."""
    policy = await policy_of(db)
    extra: dict[str, Any] = {"time": {"fired_at": float("inf")},
                             "json": {"trigger_context": "null"}}.get(odd or "", {})
    shapes = [{"action_args": dumps({"b": [1, 2.5e-7], "a": "x\u00e9\n'\"", "c": None})},
              {"action_args": dumps([True, 1 << 62, -0.1]), **extra},
              {"action_args": dumps({}), "fired_at": 1e10 / 3}]
    together = [row_values(**s) for s in shapes]
    alone = [row_values(**s) for s in shapes]
    cols = tuple(together[0])

    def made(given: list[dict[str, Any]]) -> list[tuple[list[Any], Fact]]:
        return [(list(v.values()), fact(entity_id=v["id"], reason_summary=None,
                                        patch=dumps({"fired_at": v["fired_at"]})))
                for v in given]

    await db.write(lambda tx: tx.insert_entities_with_facts(
        policy, cols, made(together), ("action_args", "trigger_context", "lease_attempts")))
    for one in made(alone):
        await db.write(lambda tx, one=one: tx.insert_entities_with_facts(
            policy, cols, [one], ("action_args", "trigger_context", "lease_attempts")))
    for t, a in zip(together, alone, strict=True):
        rt = await db.read(lambda tx, r=t["id"]: tx.read_entity(policy, r))
        ra = await db.read(lambda tx, r=a["id"]: tx.read_entity(policy, r))
        assert {**rt, "id": None} == {**ra, "id": None}
        [ft] = await db.read(lambda tx, r=t["id"]: tx.read_facts(RUN, r))
        [fa] = await db.read(lambda tx, r=a["id"]: tx.read_facts(RUN, r))
        assert {**ft, "id": None, "entity_id": None, "seq": None} == \
            {**fa, "id": None, "entity_id": None, "seq": None}
        assert loads(ft["patch"])["action_args"] == rt["action_args"]


@pytest.mark.parametrize("rows", [1, 3])
async def test_insert_entities_with_facts_complete_each_patch_from_its_stored_row(
        db: StateDB, rows: int) -> None:
    policy = await policy_of(db)
    given = [row_values(action_args=dumps({"b": [1, 2.5], "a": f"x{i}"})) for i in range(rows)]
    cols = tuple(given[0])
    facts = [fact(entity_id=v["id"], reason_summary=None,
                  patch=dumps({"action_kind": "k", "fired_at": 1.0})) for v in given]
    await db.write(lambda tx: tx.insert_entities_with_facts(
        policy, cols, [(list(v.values()), f) for v, f in zip(given, facts, strict=True)],
        ("action_args", "lease_attempts")))
    for v in given:
        row = await db.read(lambda tx, v=v: tx.read_entity(policy, v["id"]))
        [written] = await db.read(lambda tx, v=v: tx.read_facts(RUN, v["id"]))
        # The JSON column as the row stores its text (normalized on PostgreSQL), the
        # default as the database filled it in, and the patch sent as it was sent.
        assert loads(written["patch"]) == {"action_kind": "k", "fired_at": 1.0,
                                           "action_args": row["action_args"],
                                           "lease_attempts": 0}
        assert (written["entity_version"], written["status"]) == (1, "queued")
