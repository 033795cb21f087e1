"""The states the store's queries select runs by reach SQL by name, as ``{table}`` does:
no dialect's SQL spells a state, and a spec whose queue states are renamed (with the
names the queue gives them) is served by the same queries, on both backends."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.codec import dumps
from ledgerq.lifecycle.ids import new_id
from ledgerq.lifecycle.naming import name_states, named_states
from ledgerq.lifecycle.registry import load_registry, packaged_specs_dir
from ledgerq.queue.moves import CANDIDATE_COLUMNS, DEFAULT_QUEUE, ENTITY, expired_columns
from ledgerq.queue.worker.store import Kinds
from ledgerq.store import postgres, sqlite
from ledgerq.store.postgres import schema as pg_schema

RENAMED = {"queued": "ready", "running": "busy", "retry_wait": "backing_off",
           "delayed": "later", "waiting_dependency": "blocked"}


def test_no_dialects_sql_spells_a_run_state() -> None:
    states = sorted(load_registry(packaged_specs_dir()).entity(ENTITY).states)
    spelled = re.compile("'(" + "|".join(states) + ")'")
    texts = {f.name: f.read_text(encoding="utf-8") for package in (sqlite, postgres)
             for f in Path(package.__file__).parent.glob("*.sql")}
    texts["postgres/schema.py"] = pg_schema.WAKEUP_DDL + pg_schema.WORKERS_DDL
    found = {name: spelled.findall(text) for name, text in texts.items()}
    assert {name: hits for name, hits in found.items() if hits} == {}
    assert dict(named_states(ENTITY)) == {name: name for name in RENAMED}


@pytest.fixture
def renamed(tmp_path: Path) -> Iterator[Path]:
    """The packaged specs with the queue's states renamed, and the queue's names for them
    renamed with them (restored after)."""
    specs = tmp_path / "renamed"
    shutil.copytree(packaged_specs_dir(), specs)
    spec = specs / "schedule_run.toml"
    text = spec.read_text(encoding="utf-8")
    for old, new in RENAMED.items():
        text = re.sub(rf"\b{old}\b", new, text)
    spec.write_text(text, encoding="utf-8")
    before = named_states(ENTITY)
    name_states(ENTITY, RENAMED)
    try:
        yield specs
    finally:
        name_states(ENTITY, before)


def run(status: str, **extra: Any) -> dict[str, Any]:
    row = {"id": new_id(), "status": status, "trigger_context": "{}", "action_kind": "k",
           "action_args": dumps({}), "fired_at": 1.0, "created_at": 1.0, "queued_at": 1.0,
           "version": 1}
    return {**row, **extra}


async def test_renamed_queue_states_are_served_by_the_same_queries(db_target: str,
                                                                   renamed: Path) -> None:
    registry = load_registry(renamed)
    policy = registry.entity(ENTITY)
    assert {"ready", "busy", "backing_off", "later", "blocked"} <= set(policy.states)
    assert "queued" not in policy.states
    lease = {"leased_by": "w1", "lease_token": "t", "lease_expires_at": 5.0}
    rows = {
        "ready": run("ready"),
        "busy": run("busy", concurrency_key="h:gpu", **lease),
        "backing_off": run("backing_off", retry_due_at=5.0),
        "later": run("later", not_before=5.0),
        "blocked": run("blocked", depends_on=dumps(["x"])),
        "held": run("ready", queued_at=2.0, **lease),  # a ready row still holding a lease
    }
    async with StateDB(db_target, registry=registry) as db:
        await db.write(lambda tx: [tx.insert_entity(policy, r) for r in rows.values()])

        def reads(tx: Any) -> dict[str, Any]:
            page = tx.read_claim_page(policy, Kinds((), only=False), DEFAULT_QUEUE, None, 10,
                                      columns=CANDIDATE_COLUMNS, default_queue=DEFAULT_QUEUE)
            return {
                "claimable": sorted(r["id"] for r in page),
                "kinds": tx.list_queued_kinds(policy),
                "oldest": tx.find_oldest_queued_at(policy),
                "expired": [r["id"] for r in tx.list_expired_leases(
                    policy, 10.0, columns=expired_columns(policy))],
                "retries": [r["id"] for r in tx.list_due_retries(policy, 10.0)],
                "starts": [r["id"] for r in tx.list_due_starts(policy, 10.0)],
                "waiting": [i for i, _ in tx.list_all_waiting(policy)],
                "keys": tx.list_running_keys(policy),
                "key_running": tx.is_key_running(policy, "h:gpu"),
                "per_worker": tx.count_running_by_worker(policy),
                "held": tx.find_stuck_runs(policy, "held", 10.0, 0.0, 10)[0],
            }

        got = await db.read(reads)
    assert got == {
        "claimable": sorted([rows["ready"]["id"], rows["held"]["id"]]),
        "kinds": ["k"], "oldest": 1.0, "expired": [rows["busy"]["id"]],
        "retries": [rows["backing_off"]["id"]], "starts": [rows["later"]["id"]],
        "waiting": [rows["blocked"]["id"]], "keys": {"h:gpu"}, "key_running": True,
        "per_worker": {"w1": 1}, "held": 1}
