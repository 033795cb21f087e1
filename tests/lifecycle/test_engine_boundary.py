"""What the engine refuses at its boundary and its exact swap; which layer imports which,
and that both dialects implement every protocol of store operations."""

from __future__ import annotations

import ast
import asyncio
import inspect
import math
from pathlib import Path
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.errors import InvalidInput
from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, transition
from ledgerq.lifecycle.engine import apply_move
from ledgerq.lifecycle.store import EventStore
from ledgerq.projections import verify
from ledgerq.queue.maintenance.store import MaintenanceTx
from ledgerq.queue.scheduling.store import SchedulingTx
from ledgerq.queue.store import ReadsTx, SharedTx
from ledgerq.queue.submission.store import SubmissionTx
from ledgerq.queue.worker.store import ServiceTx, WorkerTx
from ledgerq.store.postgres.tx import PostgresTx
from ledgerq.store.sqlite.tx import SqliteTx
from ledgerq.store.sqltx import SqlTx
from lifecycle_support import fact_count, new_dispatch, new_run, request, row

RUN = "schedule_run"


@pytest.mark.parametrize("kind, column, value, says", [
    ("patch", "error_detail", b"\xff\x00", "bytes"),
    ("patch", "exit_code", 2**70, "64 bits"),
    ("patch", "exit_code", -(2**63) - 1, "64 bits"),
    ("patch", "error_detail", object(), "object"),
    ("patch", "lease_expires_at", math.nan, "finite"),
    ("patch", "lease_expires_at", math.inf, "finite"),
    ("patch", "error_detail", "\udcff", "UTF-8"),
    ("patch", "error_detail", ["a"], "JSON columns"),
    ("guard", "leased_by", b"w", "bytes"),
    ("guard", "lease_attempts", 2**64, "64 bits"),
])
async def test_unstorable_values_are_refused_naming_the_column(
        db: StateDB, kind: str, column: str, value: Any, says: str) -> None:
    rid = await new_run(db, "running")
    before = await row(db, "schedule_runs", rid)
    facts = await fact_count(db)
    given = {column: value}
    with pytest.raises(ValueError, match=f"{kind} column {column} of schedule_run.*{says}"):
        await transition(db, request(RUN, rid, "running", "failed", "run.failed.exception"),
                         **{kind: given})
    assert await row(db, "schedule_runs", rid) == before
    assert await fact_count(db) == facts


async def test_json_values_must_be_json_all_the_way_down(db: StateDB) -> None:
    did = await new_dispatch(db)
    # dispatch's allowlisted columns hold no JSON; the check is by column type.
    from ledgerq.lifecycle.engine import value_problem

    assert value_problem({"a": [1, 2.5, None, True, "x"]}, json=True) is None
    assert "keys must be strings" in str(value_problem({1: "a"}, json=True))
    assert "bytes" in str(value_problem({"a": [b"x"]}, json=True))
    assert "finite" in str(value_problem([math.nan], json=True))
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    assert "deeper than" in str(value_problem(deep, json=True))
    assert did


async def test_guard_keys_that_are_not_strings_are_value_errors(db: StateDB) -> None:
    rid = await new_run(db, "running")
    with pytest.raises(InvalidInput, match="guard column names must be strings"):
        await transition(db, request(RUN, rid, "running", "failed", "run.failed.exception"),
                         guard={1: "x"})  # type: ignore[dict-item]


async def test_exact_values_keep_row_equal_to_the_fold(db: StateDB) -> None:
    rid = await new_run(db, "running")
    res = await transition(db, request(RUN, rid, "running", "failed", "run.failed.exception"),
                           patch={"exit_code": 2**63 - 1, "error_detail": "e\u00e9\U0001f600",
                                  "ended_at": 1.5})
    assert res.applied
    assert (await verify(db)).ok


async def test_large_floats_read_back_as_written(db: StateDB) -> None:
    """A float column's value past 2**53 reads back (row, fold, rebuild) as the float
    written, though the log's JSON (PostgreSQL's jsonb, a decimal) hands it back as an
    integer literal; an int sent to a float column folds to the float the column holds.
    A JSON value's float that large is refused: JSON does not carry it exactly. (Found
    by the testing kit on PostgreSQL.)"""
    rid = await new_run(db, "running")
    big = 2.477133468290013e16
    res = await transition(db, request(RUN, rid, "running", "failed", "run.failed.exception"),
                           patch={"ended_at": big, "queued_at": 2**62 + 1})
    assert res.applied
    got = await db.entity(RUN).get(rid)
    assert got["ended_at"] == big and got["queued_at"] == float(2**62 + 1)
    # Created so, too; and the history gives the floats back as floats.
    whole = 4.465528394183331e16
    other = await new_run(db, "queued", fired_at=whole)
    assert (await db.entity(RUN).get(other))["fired_at"] == whole
    created = (await db.entity(RUN).history(other))[0]["patch"]["fired_at"]
    assert type(created) is float and created == whole
    moved = (await db.entity(RUN).history(rid))[-1]["patch"]
    assert type(moved["ended_at"]) is float and moved["ended_at"] == big
    report = await verify(db)
    assert report.ok, [str(d) for d in report.drift]
    for value in (big, -1e300, [1, {"k": 2.5e16}]):
        with pytest.raises(InvalidInput, match="2\\*\\*53"):
            await transition(db, request(RUN, rid, "failed", "failed", "run.failed.exception"),
                             patch={"result": value})
        with pytest.raises(InvalidInput, match="2\\*\\*53"):
            await db.entity("dispatch").create({"channel": "c", "payload": value},
                                               actor=Actor(type="system", id="s"),
                                               reason="dispatch.pending.created")
    assert await fact_count(db, rid) == 2


async def test_json_numbers_keep_every_digit(db: StateDB) -> None:
    """A JSON column's number reads back exactly, created or moved: SQLite's JSON columns
    (numeric affinity) would convert a number sent as JSON text keeping only about
    fifteen significant digits (this one came back ending ...382e-299). (Found by the
    testing kit.)"""
    value = -2.2606631148481385e-299
    system = Actor(type="system", id="s")
    outbox = db.entity("dispatch")
    did = await outbox.create({"channel": "c", "payload": value}, actor=system,
                              reason="dispatch.pending.created")
    assert (await outbox.get(did))["payload"] == value
    rid = await new_run(db, "running")
    await db.entity(RUN).move(rid, "completed", actor=system, reason="run.completed.ok",
                              patch={"result": value})
    assert (await db.entity(RUN).get(rid))["result"] == value
    assert (await db.entity(RUN).history(rid))[-1]["patch"]["result"] == value
    report = await verify(db)
    assert report.ok, [str(d) for d in report.drift]


async def test_text_with_a_nul_is_refused_on_every_backend(db: StateDB) -> None:
    """PostgreSQL's text cannot hold NUL; SQLite's could, but the backends store alike."""
    rid = await new_run(db, "running")
    before = await fact_count(db)
    for patch in ({"error_detail": "e\x00"}, {"error_detail": "\u00e9\x00"}):
        with pytest.raises(InvalidInput, match=r"error_detail.*NUL"):
            await transition(db, request(RUN, rid, "running", "failed",
                                         "run.failed.exception"), patch=patch)
    assert await fact_count(db) == before


async def test_a_claim_without_a_lease_is_refused(db: StateDB) -> None:
    rid = await new_run(db)
    req = TransitionRequest(entity_type=RUN, entity_id=rid, from_state="queued",
                            to_state="running", reason=StateReason(code="run.started.ok"),
                            actor=Actor(type="system", id="t"), idempotency_key="")
    with pytest.raises(ValueError, match=r"requires patch column.*lease_expires_at, leased_by"):
        await transition(db, req)
    assert (await row(db, "schedule_runs", rid))["status"] == "queued"  # type: ignore[index]


async def test_a_record_style_claim_gets_a_fresh_fencing_token(db: StateDB) -> None:
    tokens = []
    for _ in range(2):
        rid = await new_run(db)
        req = TransitionRequest(entity_type=RUN, entity_id=rid, from_state="queued",
                                to_state="running", reason=StateReason(code="run.started.ok"),
                                actor=Actor(type="system", id="t"), idempotency_key="")
        res = await transition(db, req, patch={"leased_by": "w", "lease_expires_at": 10.0,
                                               "lease_attempts": 1})
        assert res.applied
        tokens.append((await row(db, "schedule_runs", rid))["lease_token"])  # type: ignore[index]
    assert all(isinstance(t, str) and len(t) == 32 for t in tokens)
    assert tokens[0] != tokens[1]
    assert (await verify(db)).ok  # the minted token is in the fact too


async def test_a_caller_supplied_token_is_kept(db: StateDB) -> None:
    rid = await new_run(db)
    req = request(RUN, rid, "queued", "running", "run.started.ok")
    await transition(db, req, patch={"leased_by": "w", "lease_expires_at": 10.0,
                                     "lease_token": "mine"})
    assert (await row(db, "schedule_runs", rid))["lease_token"] == "mine"  # type: ignore[index]


async def test_two_moves_from_one_version_never_both_apply(tmp_path: Path) -> None:
    """The swap includes the version read: a second move computed from the same row
    conflicts even when status and guards still match (a same-state renewal)."""
    path = tmp_path / "state.db"
    async with StateDB(path) as db:
        rid = await new_run(db, "running")
        policy = db.registry.entity(RUN)
        reason = StateReason(code="run.running.lease_renewed")
        actor = Actor(type="system", id="w")
        stale_version: list[int] = []

        def stale(conn: Any) -> Any:
            # Read the row, let another move land, then try to apply from the stale read
            # by pinning version through the engine's own statement: run apply_move twice
            # in one unit with the first one's effect hidden from the second's read.
            first = apply_move(conn, policy, rid, "running", "running", reason, actor,
                               patch={"lease_expires_at": 1.0})
            stale_version.append(1)
            return first

        assert (await db.write(stale)).applied
        def lagging(tx: SqlTx) -> Any:
            # A reader that saw the row one version ago (what READ COMMITTED allows).
            real = tx.read_for_move

            def stale_read(policy: Any, entity_id: str, cols: tuple[str, ...],
                           **kw: Any) -> Any:
                got = real(policy, entity_id, cols, **kw)
                return None if got is None else (got[0], got[1] - 1, *got[2:])

            tx.read_for_move = stale_read  # type: ignore[method-assign]
            try:
                # from_state None: the move is computed from the (stale) read, so the
                # engine reads first and the swap must hold the version it read.
                return apply_move(tx, policy, rid, None, "running", reason, actor,
                                  patch={"lease_expires_at": 2.0})
            finally:
                del tx.read_for_move

        second = await db.write(lagging)
        assert not second.applied
        got = await row(db, "schedule_runs", rid)
        assert got is not None and got["lease_expires_at"] == 1.0
        assert (await verify(db)).ok
    await asyncio.sleep(0)


@pytest.mark.parametrize("column", ["version", "status_reason_code", "status_reason_summary",
                                    "status_evidence_refs"])
async def test_creation_refuses_engine_maintained_columns(db: StateDB, column: str) -> None:
    from ledgerq.lifecycle.engine import create
    from lifecycle_support import run_values

    facts = await fact_count(db)
    with pytest.raises(InvalidInput, match=f"{column} are maintained by the engine"):
        await create(db, RUN, run_values(**{column: 7}),
                     reason=StateReason(code="run.queued.submitted"),
                     actor=Actor(type="system", id="t"))
    assert await fact_count(db) == facts


# ---------------------------------------------------------------- the layers' imports

SRC = Path(__file__).resolve().parents[2] / "src" / "ledgerq"
#: The drivers: only ``store/<dialect>/`` imports one.
DRIVERS = ("sqlite3", "aiosqlite", "psycopg", "psycopg_pool")


def imported(package: str) -> dict[str, set[str]]:
    """Every module each file under ``src/ledgerq/<package>`` imports (a file's own
    relative imports resolved), wherever the import stands: at the top, inside a
    function, or only for type checking."""
    found: dict[str, set[str]] = {}
    top = SRC / package
    files = [top.with_suffix(".py")] if top.with_suffix(".py").is_file() else \
        sorted(top.rglob("*.py"))
    for path in files:
        names: set[str] = set()
        parts = ("ledgerq", *path.relative_to(SRC).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = parts[:len(parts) - node.level]
                    base = ".".join((*up, base)) if base else ".".join(up)
                names.add(base)
                names.update(f"{base}.{a.name}" for a in node.names)
        found[str(path.relative_to(SRC.parent))] = names
    return found


def offending(package: str, forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{path}: {name}" for path, names in imported(package).items()
                  for name in names
                  if any(name == f or name.startswith(f + ".") for f in forbidden))


def test_the_store_imports_nothing_of_the_queue() -> None:
    """The store is below the queue: the queue's protocols match its transaction class by
    structure, and what a statement needs of the queue's vocabulary comes as arguments."""
    assert offending("store", ("ledgerq.queue",)) == []


def test_the_engine_imports_neither_the_store_nor_the_queue() -> None:
    for package in ("lifecycle", "projections", "operations"):
        assert offending(package, ("ledgerq.store", "ledgerq.queue")) == [], package


def test_only_the_dialects_import_a_driver() -> None:
    found = [hit for package in [p.name for p in SRC.iterdir()
                                 if p.suffix == ".py" or (p / "__init__.py").exists()]
             for hit in offending(package.removesuffix(".py"), DRIVERS)
             if not hit.startswith(("ledgerq/store/sqlite/", "ledgerq/store/postgres/"))]
    assert found == []


# ---------------------------------------------------------------- the protocols

#: Every protocol of store operations: the engine's, and the queue's (each owned by the
#: package that calls them).
PROTOCOLS = (EventStore, SharedTx, ReadsTx, SubmissionTx, WorkerTx, MaintenanceTx,
             SchedulingTx, ServiceTx)


def declared(protocol: type) -> dict[str, Any]:
    """The operations (methods and properties) ``protocol`` declares, its bases' too."""
    out: dict[str, Any] = {}
    for cls in reversed(protocol.__mro__):
        if not getattr(cls, "_is_protocol", False) or cls.__module__ == "typing":
            continue
        out.update((name, value) for name, value in vars(cls).items()
                   if not name.startswith("_")
                   and (inspect.isfunction(value) or isinstance(value, property)))
    return out


@pytest.mark.parametrize("tx_class", [SqliteTx, PostgresTx])
@pytest.mark.parametrize("protocol", PROTOCOLS, ids=[p.__name__ for p in PROTOCOLS])
def test_each_protocol_is_implemented_by_both_dialects(protocol: type,
                                                       tx_class: type) -> None:
    """What mypy checks of ``StateDB`` (it is a ``Database`` of every protocol), at run
    time: each operation is the dialect's own (not the protocol's empty stub), with the
    protocol's parameters."""
    operations = declared(protocol)
    assert operations, f"{protocol.__name__} declares no operations?"
    for name, stub in operations.items():
        impl = inspect.getattr_static(tx_class, name, None)
        assert impl is not None and impl is not stub, \
            f"{tx_class.__name__} does not implement {protocol.__name__}.{name}"
        if inspect.isfunction(stub):
            assert inspect.signature(impl).parameters.keys() == \
                inspect.signature(stub).parameters.keys(), f"{protocol.__name__}.{name}"


def test_each_operation_is_declared_once() -> None:
    """A wing's protocol lists what it alone calls; what several call is declared once,
    in the protocol they share."""
    owners: dict[str, list[str]] = {}
    for protocol in PROTOCOLS:
        for name, value in vars(protocol).items():
            if not name.startswith("_") and (inspect.isfunction(value)
                                             or isinstance(value, property)):
                owners.setdefault(name, []).append(protocol.__name__)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
