"""Entity handles (``db.entity(name)``) on both backends: one line per move, events,
typed refusals, reads, transactions; every write still one guarded swap and one fact."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.errors import (
    ActorNotAllowed,
    Conflict,
    IllegalTransition,
    InvalidInput,
    MissingColumns,
    NotFound,
    UnknownReason,
)
from ledgerq.lifecycle import Actor, TransitionRequest, load_registry, transition
from ledgerq.lifecycle.models import StateReason
from ledgerq.projections import verify

SPECS = Path(__file__).parent / "specs_shop"
CUSTOMER = Actor(type="webhook", id="shop")
OPERATOR = Actor(type="operator", id="ops")


@pytest.fixture
async def shop(db_target: str) -> AsyncIterator[StateDB]:
    async with StateDB(db_target, registry=load_registry(SPECS)) as db:
        yield db


async def test_an_order_from_creation_to_delivery_in_one_line_per_move(shop: StateDB) -> None:
    orders = shop.entity("shop_order")
    oid = await orders.create({"customer": "c1", "amount_cents": 500,
                               "notes": {"gift": True}}, actor=CUSTOMER,
                              reason="order.created.placed")
    assert isinstance(oid, str)
    row = await orders.get(oid)
    assert (row["status"], row["customer"], row["notes"]) == ("created", "c1", {"gift": True})
    paid = await orders.send(oid, "pay", actor=CUSTOMER)  # the edge's default reason
    assert (paid.previous_state, paid.current_state) == ("created", "paid")
    await orders.move(oid, "shipped", actor=CUSTOMER, patch={"tracking": "T-1"})
    await orders.send(oid, "deliver", actor=CUSTOMER)
    row = await orders.get(oid)
    assert (row["status"], row["tracking"], row["status_reason_code"]) == (
        "delivered", "T-1", "order.delivered.ok")
    facts = await orders.history(oid)
    assert [f["status"] for f in facts] == ["created", "paid", "shipped", "delivered"]
    assert facts[0]["patch"]["notes"] == {"gift": True}  # decoded, as get() shows it
    assert facts[1]["reason_code"] == "order.paid.card"
    assert (await verify(shop)).ok


async def test_refusals_are_typed_and_write_nothing(shop: StateDB) -> None:
    orders = shop.entity("shop_order")
    oid = await orders.create({"customer": "c2"}, actor=CUSTOMER, reason="order.created.placed")
    with pytest.raises(IllegalTransition, match="allowed from created: cancelled, paid"):
        await orders.move(oid, "delivered", actor=CUSTOMER)
    with pytest.raises(IllegalTransition, match="event 'deliver' takes no edge"):
        await orders.send(oid, "deliver", actor=CUSTOMER)
    with pytest.raises(IllegalTransition, match="no event 'teleport'"):
        await orders.send(oid, "teleport", actor=CUSTOMER)
    with pytest.raises(UnknownReason):
        await orders.move(oid, "paid", actor=CUSTOMER, reason="order.paid.cash")
    await orders.send(oid, "pay", actor=CUSTOMER, reason="order.paid.invoice")
    with pytest.raises(MissingColumns, match="tracking"):
        await orders.send(oid, "ship", actor=CUSTOMER)
    with pytest.raises(ActorNotAllowed, match="operator"):
        await orders.send(oid, "refund", actor=CUSTOMER)
    with pytest.raises(Conflict, match="is paid, not created"):
        await orders.move(oid, "cancelled", actor=CUSTOMER, expect="created")
    with pytest.raises(Conflict):
        await orders.move(oid, "cancelled", actor=CUSTOMER, guard={"amount_cents": 1})
    with pytest.raises(NotFound):
        await orders.get("nope")
    with pytest.raises(NotFound):
        await orders.move("nope", "paid", actor=CUSTOMER)
    # Each is also what the ADR-0071 queue's callers catch.
    assert issubclass(IllegalTransition, ValueError) and issubclass(NotFound, LookupError)
    assert [f["status"] for f in await orders.history(oid)] == ["created", "paid"]
    await orders.send(oid, "refund", actor=OPERATOR)
    assert (await orders.get(oid))["status"] == "refunded"


async def test_transition_keeps_its_result_shape_and_raises_the_typed_errors(
        shop: StateDB) -> None:
    orders = shop.entity("shop_order")
    oid = await orders.create({"customer": "c3"}, actor=CUSTOMER, reason="order.created.placed")
    stale = await transition(shop, TransitionRequest(
        entity_type="shop_order", entity_id=oid, from_state="paid", to_state="shipped",
        reason=StateReason(code="order.shipped.ok"), actor=CUSTOMER, idempotency_key=""),
        patch={"tracking": "x"})
    assert stale.conflict and not stale.applied and stale.current_state == "created"
    with pytest.raises(IllegalTransition):
        await transition(shop, TransitionRequest(
            entity_type="shop_order", entity_id=oid, from_state="created",
            to_state="delivered", reason=StateReason(code="order.delivered.ok"),
            actor=CUSTOMER, idempotency_key=""))


async def test_list_pages_by_state_newest_first(shop: StateDB) -> None:
    orders = shop.entity("shop_order")
    ids = [await orders.create({"customer": f"c{i}"}, actor=CUSTOMER,
                               reason="order.created.placed") for i in range(5)]
    for oid in ids[:3]:
        await orders.send(oid, "pay", actor=CUSTOMER)
    first = await orders.list(status="paid", limit=2)
    assert [r["id"] for r in first.items] == [ids[2], ids[1]]
    assert first.next_cursor is not None
    rest = await orders.list(status=["paid"], limit=2, cursor=first.next_cursor)
    assert [r["id"] for r in rest.items] == [ids[0]] and rest.next_cursor is None
    assert len((await orders.list()).items) == 5
    with pytest.raises(InvalidInput, match="no state 'lost'"):
        await orders.list(status="lost")


async def test_moves_and_creations_in_a_transaction_commit_together(shop: StateDB) -> None:
    orders = shop.entity("shop_order")
    oid = await orders.create({"customer": "c9"}, actor=CUSTOMER, reason="order.created.placed")
    async with shop.transaction() as tx:
        moved = await orders.send(oid, "pay", actor=CUSTOMER, tx=tx)
        other = await orders.create({"customer": "c10"}, actor=CUSTOMER,
                                    reason="order.created.placed", tx=tx)
        assert (await orders.get(oid))["status"] == "created"  # not yet
    assert moved.value.current_state == "paid"
    assert (await orders.get(other.value))["customer"] == "c10"
    # One illegal move fails the block: the other writes are rolled back with it.
    with pytest.raises(IllegalTransition):
        async with shop.transaction() as tx:
            await orders.create({"customer": "c11"}, actor=CUSTOMER,
                                reason="order.created.placed", tx=tx)
            await orders.send(oid, "deliver", actor=CUSTOMER, tx=tx)
    assert len((await orders.list()).items) == 2
    assert (await verify(shop)).ok


async def test_keywords_are_names_an_order_in_table_order(db_target: str, tmp_path: Path) -> None:
    """``order``, ``group``, ``select``, ``index``: valid entity, table, column and index
    names, quoted in every statement the engine sends (create, moves, reads, verify,
    rebuild)."""
    from ledgerq.projections import rebuild

    text = (SPECS / "shop_order.toml").read_text()
    text = (text.replace('entity = "shop_order"', 'entity = "order"')
            .replace('table = "shop_orders"', 'table = "order"')
            .replace("customer = ", "group = ")
            .replace('tracking = "text"', 'tracking = "text"\nselect = "text"')
            + '\n[[indexes]]\nname = "index"\ncolumns = ["group", "select"]\n'
              'where_not_null = ["select"]\n')
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "order.toml").write_text(text)
    async with StateDB(db_target, registry=load_registry(specs)) as db:
        orders = db.entity("order")
        oid = await orders.create({"group": "g1", "select": "s"}, actor=CUSTOMER,
                                  reason="order.created.placed")
        await orders.send(oid, "pay", actor=CUSTOMER)
        await orders.send(oid, "ship", actor=CUSTOMER, patch={"tracking": "T"})
        assert (await orders.get(oid))["group"] == "g1"
        assert [r["id"] for r in (await orders.list(status="shipped")).items] == [oid]
        assert len(await orders.history(oid)) == 3
        assert (await verify(db)).ok
        await rebuild(db)
        assert (await verify(db)).ok


async def test_an_entity_declares_its_own_actor_types(shop: StateDB) -> None:
    orders = shop.entity("shop_order")
    customer = Actor(type="customer", id="c-42")
    oid = await orders.create({"customer": "c42"}, actor=customer,
                              reason="order.created.placed")
    await orders.send(oid, "pay", actor=customer)
    agent = Actor(type="agent", id="bot")
    with pytest.raises(ActorNotAllowed, match="customer, operator, webhook"):
        await orders.send(oid, "cancel", actor=agent)
    with pytest.raises(ActorNotAllowed):
        await orders.create({"customer": "c43"}, actor=agent, reason="order.created.placed")
    assert [f["actor"] for f in await orders.history(oid)] == ["c-42", "c-42"]
    with pytest.raises(ValueError):
        Actor(type="Not A Type", id="x")


def test_an_edge_names_only_the_entitys_actor_types(tmp_path: Path) -> None:
    from ledgerq.lifecycle import SpecError

    text = (SPECS / "shop_order.toml").read_text().replace(
        'actors = ["operator"]', 'actors = ["auditor"]')
    (tmp_path / "shop_order.toml").write_text(text)
    with pytest.raises(SpecError, match="unknown actor type 'auditor'"):
        load_registry(tmp_path)


def test_diagrams_show_events_and_default_reasons() -> None:
    from ledgerq.lifecycle.diagrams import mermaid

    text = mermaid(load_registry(SPECS).entity("shop_order"))
    assert "    created --> paid: pay / reason order.paid.card\n" in text
    assert "    paid --> refunded: refund / actor operator\n" in text
