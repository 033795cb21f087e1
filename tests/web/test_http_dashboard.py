"""The dashboard in headless Chromium (Debian's ``chromium``, driven by Playwright).

The page loads behind the login form, takes the token, shows a task submitted through
the API and follows it to ``completed`` without a reload, shows its timeline and the
lifecycle diagrams; any JavaScript error or console error fails the test. Screenshots
go to ``$LEDGERQ_SCREENSHOTS`` when set (``make screenshots`` sets docs/img).

Chromium is required in CI (``.ci/run`` installs it and sets LEDGERQ_REQUIRE_BROWSER=1):
missing, these tests fail there instead of skipping.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.server import TOKEN, Server, command, serve, start_worker, stop

CHROMIUM = os.environ.get("LEDGERQ_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update"]
#: Waits for the page (not assertions on time): generous for a loaded CI machine.
WAIT_MS = 60_000


def _require_browser() -> None:
    if Path(CHROMIUM).exists():
        return
    why = f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    if os.environ.get("LEDGERQ_REQUIRE_BROWSER") == "1":
        pytest.fail(f"a browser is required (LEDGERQ_REQUIRE_BROWSER=1): {why}")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Server]:
    with serve(str(tmp_path / "ui.db")) as s:
        yield s


def shoot(page: Any, name: str) -> None:
    folder = os.environ.get("LEDGERQ_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(folder) / name), full_page=True)


def signed_in(browser: Any, url: str, errors: list[str], **context: Any) -> tuple[Any, Any]:
    """A new browser context and page on ``url`` with the token given; page errors go to
    ``errors``."""
    ctx = browser.new_context(**context)
    page = ctx.new_page()
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.goto(url + "/")
    page.wait_for_selector("#login:not([hidden])", timeout=WAIT_MS)
    page.fill("#token", TOKEN)
    page.click("#login button[type=submit]")
    return ctx, page


def test_dashboard_follows_a_task_to_completed(browser: Any, site: Server) -> None:
    errors: list[str] = []
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", lambda msg: errors.append(f"console: {msg.text}")
            if msg.type == "error" else None)
    page.goto(site.url + "/")
    page.wait_for_selector("#login:not([hidden])", timeout=WAIT_MS)  # the token is asked
    page.fill("#token", "wrong")
    page.click("#login button[type=submit]")
    page.wait_for_selector("#login-error:has-text('refused')", timeout=WAIT_MS)
    errors.clear()  # the refused token's 401 is logged by the browser itself
    page.fill("#token", TOKEN)
    page.click("#login button[type=submit]")
    page.wait_for_selector("#overview:not([hidden])", timeout=WAIT_MS)
    # One 401 per request the refused attempt made: under load some are logged after
    # its message. The only errors allowed, and only before the token was accepted.
    refused = "the server responded with a status of 401"
    assert all(refused in e for e in errors), errors
    errors.clear()
    assert TOKEN not in page.url
    assert page.evaluate("sessionStorage.getItem('ledgerq-token')") == TOKEN

    with site.client() as api:
        failing = api.post("/api/tasks", json=command(sys.executable, "-c",
                                                      "import sys; sys.exit('<b>boom</b>')"))
        run_id = api.post("/api/tasks", json=command(
            sys.executable, "-c", "import time; time.sleep(1)")).json()["id"]
        elsewhere = api.post("/api/tasks", json={**command("true"), "queue": "ops",
                                                 "priority": 7}).json()["id"]
    row = f"#tasks tr[data-id='{run_id}']"
    page.wait_for_selector(row, timeout=WAIT_MS)  # appears without a reload
    assert page.inner_text(f"{row} .status") == "queued"
    other = f"#tasks tr[data-id='{elsewhere}']"
    page.wait_for_selector(other, timeout=WAIT_MS)
    assert (page.inner_text(f"{other} td.queue"), page.inner_text(f"{other} td.priority")) \
        == ("ops", "7")  # not the worker's queue: it stays queued
    assert page.inner_text(f"{row} td.queue") == "default"
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    worker = start_worker(site.db, "--worker-id", "ui-worker")
    try:
        page.wait_for_selector(f"{row} .status:has-text('completed')", timeout=WAIT_MS)
        page.wait_for_selector("#workers tr[data-id='ui-worker']", timeout=WAIT_MS)
        page.wait_for_selector(f"#failures tr[data-id='{failing.json()['id']}']",
                               timeout=WAIT_MS)
    finally:
        stop(worker)
    assert navigations == []  # live updates, no reload
    # Task text is shown as text: the failure's "<b>boom</b>" is not markup.
    detail = page.inner_text(f"#failures tr[data-id='{failing.json()['id']}'] td.detail")
    assert "<b>boom</b>" in detail
    assert page.locator("#failures b").count() == 0
    # Every lifecycle diagram is drawn (a decoded image with a size).
    page.wait_for_selector("#diagrams img[data-entity='schedule_run']", timeout=WAIT_MS)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#diagrams img')].length >= 2 && "
        "[...document.querySelectorAll('#diagrams img')].every(i => i.complete && "
        "i.naturalWidth > 0)", timeout=WAIT_MS)
    page.wait_for_selector("#depth polyline", timeout=WAIT_MS)
    shoot(page, "dashboard.png")

    page.click(f"{row} a")
    page.wait_for_selector("#task:not([hidden])", timeout=WAIT_MS)
    page.wait_for_selector("#timeline li[data-status='completed']", timeout=WAIT_MS)
    statuses = page.eval_on_selector_all("#timeline li",
                                         "items => items.map(i => i.dataset.status)")
    assert statuses[0] == "queued" and statuses[-1] == "completed" and "running" in statuses
    assert "run.completed.ok" in page.inner_text("#timeline")
    assert page.inner_text("#task-id") == run_id
    shoot(page, "task.png")
    context.close()
    assert errors == []


def test_a_task_address_that_is_not_an_id_is_said_and_the_page_lives_on(
        browser: Any, site: Server) -> None:
    """A hand-edited ``#/task/%E0%A4%A`` cannot be decoded: the page says so and shows the
    overview instead of throwing on every tick with the last view left standing."""
    errors: list[str] = []
    context, page = signed_in(browser, site.url, errors)
    page.wait_for_selector("#overview:not([hidden])", timeout=WAIT_MS)
    page.evaluate("location.hash = '#/task/%E0%A4%A'")
    page.wait_for_selector("#error:has-text('not a task address')", timeout=WAIT_MS)
    page.wait_for_selector("#overview:not([hidden])", timeout=WAIT_MS)
    page.wait_for_timeout(2500)  # more ticks: none may throw
    context.close()
    assert errors == []


def test_an_entity_of_an_app_has_a_page_with_counts_rows_and_a_timeline(
        browser: Any, tmp_path: Path) -> None:
    """An app's own entity (recorded in the database, unknown to the server's specs):
    its page shows rows per state (cards, and on the diagram), recent rows, and a row's
    timeline."""
    import asyncio
    import threading

    from ledgerq import StateDB
    from ledgerq.lifecycle import Actor, load_registry

    db_file = str(tmp_path / "shop.db")
    customer = Actor(type="customer", id="c-1")
    shop = Path(__file__).resolve().parents[1] / "lifecycle" / "specs_shop"

    async def fill() -> list[str]:
        async with StateDB(db_file, registry=load_registry(shop)) as db:
            orders = db.entity("shop_order")
            ids = [await orders.create({"customer": f"c{i}"}, actor=customer,
                                       reason="order.created.placed") for i in range(3)]
            await orders.send(ids[0], "pay", actor=customer)
            return ids

    # (In a thread of its own: Playwright's sync API keeps a loop running in this one.)
    filled: list[list[str]] = []
    thread = threading.Thread(target=lambda: filled.append(asyncio.run(fill())))
    thread.start()
    thread.join(60)
    (ids,) = filled
    errors: list[str] = []
    with serve(db_file) as s:
        context, page = signed_in(browser, s.url, errors,
                                  viewport={"width": 1280, "height": 900})
        page.wait_for_selector("#diagrams a[href='#/entity/shop_order']", timeout=WAIT_MS)
        page.click("#diagrams a[href='#/entity/shop_order']")
        page.wait_for_selector("#entity:not([hidden])", timeout=WAIT_MS)
        page.wait_for_selector("#entity-counts .card[data-status='paid']", timeout=WAIT_MS)
        counts = page.eval_on_selector_all(
            "#entity-counts .card", "cards => Object.fromEntries(cards.map(c => "
            "[c.dataset.status, Number(c.querySelector('.n').textContent)]))")
        assert counts["created"] == 2 and counts["paid"] == 1, counts
        page.wait_for_function(
            "() => { const i = document.querySelector('#entity-diagram img'); "
            "return i && i.complete && i.naturalWidth > 0; }", timeout=WAIT_MS)
        for rid in ids:
            page.wait_for_selector(f"#entity-rows tr[data-id='{rid}']", timeout=WAIT_MS)
        shoot(page, "entity.png")
        page.click(f"#entity-rows tr[data-id='{ids[0]}'] a")
        page.wait_for_selector("#entity-row:not([hidden])", timeout=WAIT_MS)
        page.wait_for_selector("#row-timeline li[data-status='paid']", timeout=WAIT_MS)
        statuses = page.eval_on_selector_all("#row-timeline li",
                                             "items => items.map(i => i.dataset.status)")
        assert statuses == ["created", "paid"]
        assert page.inner_text("#row-id") == ids[0]
        context.close()
        with s.client() as api:
            svg = api.get("/api/specs/shop_order/diagram.svg?counts=true").text
            assert "created \u00b7 2" in svg and "paid \u00b7 1" in svg
            summary = {e["entity"]: e for e in api.get("/api/entities").json()}
            assert summary["shop_order"]["counts"]["created"] == 2
    assert errors == []
