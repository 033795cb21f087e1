"""``ledgerq entity ls``, ``ledgerq move`` and ``ledgerq send`` on an entity the packaged
specs lack: judged by the spec the database recorded, no --specs needed."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from ledgerq import StateDB
from ledgerq.lifecycle import Actor, load_registry

SPECS = Path(__file__).resolve().parents[1] / "lifecycle" / "specs_shop"


def ledgerq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerq", *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_any_entity_is_listed_and_moved_from_the_command_line(tmp_path: Path) -> None:
    target = str(tmp_path / "shop.db")

    async def made() -> str:
        async with StateDB(target, registry=load_registry(SPECS)) as db:
            oid = await db.entity("shop_order").create(
                {"customer": "c1"}, actor=Actor(type="webhook", id="shop"),
                reason="order.created.placed")
            return oid

    oid = asyncio.run(made())
    listed = ledgerq("entity", "ls", "shop_order", "--db", target, "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)["items"]
    assert (row["id"], row["status"]) == (oid, "created")
    paid = ledgerq("send", "shop_order", oid, "pay", "--db", target, "--json")
    assert paid.returncode == 0, paid.stderr
    assert json.loads(paid.stdout)["current_state"] == "paid"
    illegal = ledgerq("move", "shop_order", oid, "delivered", "--db", target)
    assert illegal.returncode == 2 and "allowed from paid" in illegal.stderr
    stale = ledgerq("move", "shop_order", oid, "cancelled", "--expect", "created",
                    "--reason", "order.cancelled.customer", "--db", target)
    assert stale.returncode == 1 and "is paid, not created" in stale.stderr
    shipped = ledgerq("move", "shop_order", oid, "shipped", "--patch", "tracking=T-9",
                      "--reason", "order.shipped.ok", "--db", target)
    assert shipped.returncode == 0, shipped.stderr
    assert "paid -> shipped" in shipped.stdout
    unknown = ledgerq("entity", "ls", "nothing", "--db", target)
    assert unknown.returncode == 2 and "shop_order" in unknown.stderr


def test_any_entity_over_http(tmp_path: Path) -> None:
    from helpers.server import serve

    target = str(tmp_path / "http.db")

    async def made() -> str:
        async with StateDB(target, registry=load_registry(SPECS)) as db:
            return await db.entity("shop_order").create(
                {"customer": "c1", "notes": {"gift": True}},
                actor=Actor(type="webhook", id="shop"), reason="order.created.placed")

    oid = asyncio.run(made())
    with serve(target) as server, server.client() as api:
        page = api.get("/api/entities/shop_order", params={"status": "created"}).json()
        assert [r["id"] for r in page["items"]] == [oid]
        assert page["items"][0]["notes"] == {"gift": True}
        moved = api.post(f"/api/entities/shop_order/{oid}/move", json={"event": "pay"})
        assert moved.status_code == 200, moved.text
        assert moved.json()["current_state"] == "paid"
        refused = api.post(f"/api/entities/shop_order/{oid}/move",
                           json={"state": "delivered"})
        assert refused.status_code == 422 and "allowed from paid" in refused.text
        stale = api.post(f"/api/entities/shop_order/{oid}/move",
                         json={"state": "cancelled", "expect": "created",
                               "reason": "order.cancelled.customer"})
        assert stale.status_code == 409
        detail = api.get(f"/api/entities/shop_order/{oid}").json()
        assert detail["row"]["status"] == "paid"
        assert [f["status"] for f in detail["history"]] == ["created", "paid"]
        assert api.get("/api/entities/shop_order/nope").status_code == 404
        assert api.get("/api/entities/nothing").status_code == 404


def test_show_finds_a_row_of_any_entity_by_its_id(tmp_path: Path) -> None:
    target = str(tmp_path / "show.db")

    async def made() -> str:
        async with StateDB(target, registry=load_registry(SPECS)) as db:
            orders = db.entity("shop_order")
            oid = await orders.create({"customer": "c7"}, actor=Actor(type="webhook", id="s"),
                                      reason="order.created.placed")
            await orders.send(oid, "pay", actor=Actor(type="webhook", id="s"))
            return oid

    oid = asyncio.run(made())
    shown = ledgerq("show", oid, "--db", target, "--json")
    assert shown.returncode == 0, shown.stderr
    body = json.loads(shown.stdout)
    assert body["entity"] == "shop_order" and body["row"]["status"] == "paid"
    assert [f["status"] for f in body["history"]] == ["created", "paid"]
    text = ledgerq("show", oid, "--db", target)
    assert f"shop_order {oid}: paid" in text.stdout
    missing = ledgerq("show", "0" * 36, "--db", target)
    assert missing.returncode == 1
