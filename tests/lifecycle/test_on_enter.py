"""A state's ``on_enter`` tasks on both backends: one run per task per entry, written in
the transaction of the move (or creation) that enters the state, and none for a move
that does not commit, conflicts, is replayed or stays in its state."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ledgerq import App, RetryPolicy
from ledgerq.errors import Conflict, SpecError
from ledgerq.lifecycle import Actor, Registry, TransitionRequest, load_registry, transition
from ledgerq.lifecycle.creation import create_entities
from ledgerq.lifecycle.entering import Entry
from ledgerq.lifecycle.models import StateReason
from ledgerq.lifecycle.moves import MoveTerms, apply_moves
from ledgerq.lifecycle.registry import packaged_specs_dir
from ledgerq.projections import verify
from ledgerq.queue import get_run, list_runs, queue_stats
from ledgerq.queue.moves import check

SHOP = Path(__file__).parent / "specs_shop"
CUSTOMER = Actor(type="customer", id="c1")


def deferring(tmp_path: Path, **on_enter: list[str]) -> Path:
    """The shop's specs with ``on_enter`` added to the named states."""
    specs = tmp_path / "specs"
    shutil.copytree(SHOP, specs)
    spec = specs / "shop_order.toml"
    text = spec.read_text(encoding="utf-8")
    for state, tasks in on_enter.items():
        header = f"[states.{state}]\n"
        at = text.index(header) + len(header)
        end = text.index("\n", at) + 1  # after its description
        text = text[:end] + f"on_enter = {tasks!r}\n".replace("'", '"') + text[end:]
    spec.write_text(text, encoding="utf-8")
    return specs


@pytest.fixture
async def shop(db_target: str, tmp_path: Path) -> AsyncIterator[App]:
    app = App(db_target, registry=load_registry(deferring(
        tmp_path, paid=["shop.send_receipt"], created=["shop.welcome"])))
    app.entries = []  # type: ignore[attr-defined]

    @app.task(name="shop.send_receipt", queue="mail", priority=3, retry=RetryPolicy(2, 5.0),
              timeout=30)
    def send_receipt(entity_id: str, fact: Entry) -> None:
        app.entries.append(("receipt", entity_id, fact))  # type: ignore[attr-defined]

    @app.task(name="shop.welcome")
    def welcome(entity_id: str, fact: dict[str, Any]) -> None:
        app.entries.append(("welcome", entity_id, fact))  # type: ignore[attr-defined]

    async with app:
        yield app


async def runs_of(app: App, kind: str) -> list[dict[str, Any]]:
    page = await list_runs(app.db, limit=1000)
    return [await get_run(app.db, r["id"]) for r in reversed(page.runs)
            if r["action_kind"] == kind]


async def test_entering_a_state_defers_its_tasks_as_their_app_declared_them(shop: App) -> None:
    orders = shop.db.entity("shop_order")
    oid = await orders.create({"customer": "c1", "amount_cents": 500}, actor=CUSTOMER)
    paid = await orders.send(oid, "pay", actor=CUSTOMER)
    (run,) = await runs_of(shop, "shop.send_receipt")
    fact = (await orders.history(oid))[1]
    assert fact["id"] == paid.transition_id
    assert (run["queue"], run["priority"], run["timeout_seconds"]) == ("mail", 3, 30)
    assert run["retry_policy"]["max_attempts"] == 2
    args = run["action_args"]
    assert args["entity_id"] == oid
    assert {k: args["fact"][k] for k in ("id", "previous_status", "status", "reason_code",
                                         "source", "actor", "entity_version")} == {
        "id": fact["id"], "previous_status": "created", "status": "paid",
        "reason_code": "order.paid.card", "source": "customer", "actor": "c1",
        "entity_version": 2}
    assert run["trigger_context"] == {"entity": "shop_order", "entity_id": oid,
                                             "state": "paid", "fact_id": fact["id"]}
    assert await shop.drain() == 2  # the receipt, and the welcome its creation deferred
    assert sorted((kind, eid, f["status"]) for kind, eid, f in shop.entries) == [  # type: ignore[attr-defined]
        ("receipt", oid, "paid"), ("welcome", oid, "created")]
    assert (await verify(shop.db)).ok


async def test_a_move_that_does_not_commit_or_enters_nothing_defers_nothing(shop: App) -> None:
    orders = shop.db.entity("shop_order")
    oid = await orders.create({"customer": "c1"}, actor=CUSTOMER)
    with pytest.raises(RuntimeError, match="changed my mind"):
        async with shop.db.transaction() as tx:
            await orders.send(oid, "pay", actor=CUSTOMER, tx=tx)
            raise RuntimeError("changed my mind")
    with pytest.raises(Conflict):
        await orders.move(oid, "paid", actor=CUSTOMER, expect="paid")
    assert await runs_of(shop, "shop.send_receipt") == []
    assert (await orders.get(oid))["status"] == "created"
    request = TransitionRequest(entity_type="shop_order", entity_id=oid, from_state="created",
                                to_state="paid", reason=StateReason(code="order.paid.card"),
                                actor=CUSTOMER, idempotency_key="pay-once")
    first = await transition(shop.db, request)
    again = await transition(shop.db, request)  # replayed: the same fact, no new entry
    assert first.applied and again.transition_id == first.transition_id
    assert len(await runs_of(shop, "shop.send_receipt")) == 1


async def test_every_entry_of_a_batch_defers_its_own_runs(shop: App) -> None:
    """The engine's batched paths: creations of many rows, and moves of many rows in one
    unit (one statement for all on PostgreSQL, swaps then facts on SQLite)."""
    policy = shop.db.registry.entity("shop_order")
    reason = StateReason(code="order.created.placed")
    ids = await shop.db.write(lambda tx: create_entities(
        tx, policy, [{"customer": f"c{i}", "status": "created"} for i in range(5)],
        reason=reason, actor=CUSTOMER))
    paid = StateReason(code="order.paid.card")
    await shop.db.write(lambda tx: apply_moves(tx, policy, [
        MoveTerms(i, "created", "paid", paid, CUSTOMER, {}, {}) for i in ids[:4]]))
    welcomed = await runs_of(shop, "shop.welcome")
    receipts = await runs_of(shop, "shop.send_receipt")
    assert sorted(r["action_args"]["entity_id"] for r in welcomed) == sorted(ids)
    assert sorted(r["action_args"]["entity_id"] for r in receipts) == sorted(ids[:4])
    assert {r["action_args"]["fact"]["entity_version"] for r in receipts} == {2}
    assert (await verify(shop.db)).ok


async def test_a_task_no_app_has_recorded_waits_as_an_unserved_kind(db_target: str,
                                                                    tmp_path: Path) -> None:
    app = App(db_target, registry=load_registry(deferring(tmp_path, paid=["shop.audit"])))
    async with app:
        orders = app.db.entity("shop_order")
        oid = await orders.create({"customer": "c1"}, actor=CUSTOMER)
        await orders.send(oid, "pay", actor=CUSTOMER)
        (run,) = await runs_of(app, "shop.audit")
        assert (run["queue"], run["status"]) == ("default", "queued")
        assert (await queue_stats(app.db)).unserved_kinds == ["shop.audit"]


def test_the_queue_refuses_on_enter_it_could_not_run(tmp_path: Path) -> None:
    specs = deferring(tmp_path, paid=["command", "shop.receipt", "shop.receipt"])
    with pytest.raises(SpecError) as refused:
        load_registry(specs)
    assert "'shop.receipt' is listed more than once" in str(refused.value)
    specs = deferring(tmp_path / "b", paid=["command"])
    with pytest.raises(SpecError, match="one of the ADR-0071 queue's action kinds"):
        check(load_registry(specs))
    with pytest.raises(SpecError, match="no 'schedule_run' entity to queue them in"):
        check(load_registry(specs / "shop_order.toml", packaged=False))
    runs = tmp_path / "runs"
    shutil.copytree(packaged_specs_dir(), runs)
    text = (runs / "schedule_run.toml").read_text(encoding="utf-8")
    text = text.replace('[states.completed]\n', '[states.completed]\non_enter = ["x.y"]\n', 1)
    (runs / "schedule_run.toml").write_text(text, encoding="utf-8")
    with pytest.raises(SpecError, match="every run entering it would defer another run"):
        check(load_registry(runs, packaged=False))


def test_on_enter_is_recorded_with_the_spec_and_absent_when_empty(tmp_path: Path) -> None:
    from ledgerq.lifecycle.evolution import normalize, policy_normal

    plain = load_registry(SHOP).entity("shop_order")
    added = load_registry(deferring(tmp_path, paid=["shop.send_receipt"])).entity("shop_order")
    assert "on_enter" not in policy_normal(plain)["states"]["paid"]
    assert policy_normal(added)["states"]["paid"]["on_enter"] == ["shop.send_receipt"]
    assert isinstance(plain.peers, type(None)) and isinstance(added.peers, Registry)
    assert normalize(plain.spec) == policy_normal(plain)  # type: ignore[arg-type]


def test_the_docs_page_lists_what_a_state_defers(tmp_path: Path) -> None:
    from ledgerq.lifecycle.docs import render_markdown

    policy = load_registry(deferring(tmp_path, paid=["shop.b", "shop.a"])).entity("shop_order")
    row = next(line for line in render_markdown(policy).splitlines()
               if line.startswith("| `paid` |"))
    assert "| `shop.b`, `shop.a` |" in row  # in the order they are deferred


async def test_specs_check_names_tasks_no_app_recorded_or_that_take_no_entry(
        tmp_path: Path) -> None:
    import subprocess
    import sys

    specs = deferring(tmp_path, paid=["shop.send_receipt", "shop.audit", "shop.wrong"])
    db = str(tmp_path / "shop.db")
    app = App(db, registry=load_registry(specs))

    @app.task(name="shop.send_receipt")
    def send_receipt(entity_id: str, fact: Entry) -> None: ...

    @app.task(name="shop.wrong")
    def wrong(order_id: str) -> None: ...

    async with app:
        pass
    res = subprocess.run([sys.executable, "-m", "ledgerq", "specs", "check", str(specs),
                          "--db", db], capture_output=True, text=True, timeout=60,
                         check=False)
    assert res.returncode == 1
    lines = res.stdout.splitlines()
    assert len(lines) == 2, res.stdout
    assert "$.states.paid.on_enter: task 'shop.audit' is not recorded in" in lines[0]
    assert "task 'shop.wrong' does not take what an entry gives it" in lines[1]
    assert "'order_id'" in lines[1]


async def test_a_worker_says_which_deferred_tasks_it_does_not_serve(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = App(str(tmp_path / "shop.db"), registry=load_registry(
        deferring(tmp_path, paid=["shop.send_receipt", "shop.audit"])))

    @app.task(name="shop.send_receipt")
    def send_receipt(entity_id: str, fact: Entry) -> None: ...

    async with app:
        worker = app.worker(max_runtime=0.3, handle_signals=False)
        with caplog.at_level("WARNING", logger="ledgerq"):
            await worker.run()
    unserved = [r.getMessage() for r in caplog.records if "does not serve" in r.getMessage()]
    assert len(unserved) == 1 and "shop_order.paid defers task shop.audit" in unserved[0]


def test_the_lifecycle_machine_holds_every_entry_to_one_run_per_task(tmp_path: Path) -> None:
    """The testing kit's machine on an entity that defers tasks on two states: legal,
    illegal, stale and racing moves, each entry checked against the runs it deferred."""
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test

    from ledgerq.testing import LifecycleMachine

    registry = load_registry(deferring(tmp_path, paid=["shop.receipt", "shop.ledger"],
                                       refunded=["shop.refund"]))
    tested = LifecycleMachine.for_entity("shop_order", registry=registry)
    run_state_machine_as_test(tested, settings=settings(
        max_examples=25, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow]))
    assert ("created", "paid") in tested.applied
