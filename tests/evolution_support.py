"""Spec directories edited as a contributor would, and snapshots of a database to compare.

A test starts from a copy of a spec directory (the packaged one, or the saved copy of
the previous release's in tests/specs_v1) and edits the TOML text: a new state and its
edges appended, reason codes inserted under ``[reason_codes]``, a line replaced.
"""

from __future__ import annotations

import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from ledgerq import StateDB
from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, create, transition
from ledgerq.lifecycle.registry import load_registry, packaged_specs_dir

#: The spec files of the release before spec evolution, saved as they shipped.
SPECS_V1 = Path(__file__).parent / "specs_v1"

PAUSED = '''
[states.paused]
description = "Held by an operator; resumes to queued."

[[edges]]
from = "running"
to = ["paused"]
clears = ["lease"]

[[edges]]
from = "paused"
to = ["queued", "cancelled"]
'''
PAUSED_CODES = {"run.paused.operator": "Paused by an operator.",
                "run.queued.resumed": "Resumed by an operator."}


class SpecDir:
    """A writable copy of a spec directory."""

    def __init__(self, path: Path, source: Path | None = None) -> None:
        self.path = path
        shutil.copytree(source or packaged_specs_dir(), path)

    def file(self, entity_file: str = "schedule_run.toml") -> Path:
        return self.path / entity_file

    def append(self, text: str, entity_file: str = "schedule_run.toml") -> SpecDir:
        f = self.file(entity_file)
        f.write_text(f.read_text() + "\n" + text)
        return self

    def codes(self, codes: dict[str, str], entity_file: str = "schedule_run.toml") -> SpecDir:
        lines = "".join(f'"{k}" = "{v}"\n' for k, v in codes.items())
        return self.replace("[reason_codes]\n", "[reason_codes]\n" + lines, entity_file)

    def replace(self, old: str, new: str, entity_file: str = "schedule_run.toml") -> SpecDir:
        f = self.file(entity_file)
        text = f.read_text()
        assert old in text, f"{old!r} is not in {f}"
        f.write_text(text.replace(old, new, 1))
        return self

    def paused(self) -> SpecDir:
        return self.append(PAUSED).codes(PAUSED_CODES)


async def snapshot(db: StateDB) -> dict[str, Any]:
    """The schema's text and every table's rows: equal snapshots mean nothing changed."""
    if db.dialect == "sqlite":
        schema = await db.fetch_all("SELECT type, name, sql FROM sqlite_master ORDER BY name")
        tables = [r["name"] for r in schema if r["type"] == "table"]
    else:
        schema = await db.fetch_all(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = current_schema() "
            "ORDER BY table_name, column_name")
        schema += await db.fetch_all(
            "SELECT conname, pg_get_constraintdef(c.oid) AS def FROM pg_constraint c "
            "JOIN pg_namespace n ON n.oid = c.connamespace WHERE n.nspname = "
            "current_schema() ORDER BY conname")
        schema += await db.fetch_all(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "ORDER BY indexname")
        tables = sorted({str(r["table_name"]) for r in schema if "table_name" in r})
    rows = {t: await db.fetch_all(f'SELECT * FROM "{t}" ORDER BY 1') for t in tables}
    return {"schema": schema, "rows": rows}


OPERATOR = Actor(type="operator", id="alice")


async def move(db: StateDB, run: str, source: str, target: str, code: str,
               patch: dict[str, Any] | None = None) -> bool:
    result = await transition(db, TransitionRequest(
        entity_type="schedule_run", entity_id=run, from_state=source, to_state=target,
        reason=StateReason(code=code), actor=OPERATOR, idempotency_key=uuid.uuid4().hex),
        patch=patch)
    return result.applied


async def fill_v1(target: str) -> dict[str, list[str]]:
    """A database made by the previous release's specs, through the lifecycle API alone
    (that release's queue needs specs this one's refuses: no outcomes): four runs, two
    of them running under a lease, one cancelled."""
    async with StateDB(target, registry=load_registry(SPECS_V1)) as db:
        now = time.time()
        ids = [await create(db, "schedule_run", {
            "status": "queued", "trigger_context": "{}", "action_kind": "agent",
            "action_args": '{"p": 1}', "fired_at": now, "queued_at": now,
            "execution_target": "host"},
            reason=StateReason(code="run.queued.submitted"), actor=OPERATOR)
            for _ in range(4)]
        for run in ids[:2]:
            assert await move(db, run, "queued", "running", "run.started.ok",
                              {"leased_by": "w1", "lease_expires_at": now + 300})
        assert await move(db, ids[2], "queued", "cancelled", "run.cancelled.operator")
    return {"all": ids, "running": ids[:2], "cancelled": [ids[2]]}
