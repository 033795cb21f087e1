"""A whole new entity from one file: docs/examples/deployment.toml.

A database is first made with the packaged specs only, with rows in it, and closed. It
is then opened again with a spec directory that is a copy of the packaged specs plus the
example file, and the new entity is driven through ``transition()``, ``history``,
``verify``, ``rebuild``, the ``ledgerq`` command (a real subprocess) and the docs
generator, on both backends: no Python change, only the file.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.codec import loads
from ledgerq.errors import IntegrityViolation
from ledgerq.lifecycle import (
    VOCABULARY_ERROR,
    Actor,
    StateReason,
    create,
    load_registry,
    transition,
)
from ledgerq.lifecycle.diagrams import mermaid
from ledgerq.lifecycle.docs import render_markdown
from ledgerq.lifecycle.registry import packaged_specs_dir
from ledgerq.projections import history, rebuild, verify
from ledgerq.queue import TaskApplication, add_schedule, submit_task
from lifecycle_support import OPERATOR, SYSTEM, request

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "deployment.toml"
BUILDER = Actor(type="system", id="builder-7")
BOT = Actor(type="agent", id="release-bot")


def spec_dir(tmp_path: Path) -> Path:
    """The packaged specs plus the example: what a user adding the entity would have."""
    specs = tmp_path / "specs"
    shutil.copytree(packaged_specs_dir(), specs)
    shutil.copy(EXAMPLE, specs)
    return specs


def ledgerq(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The command as an operator runs it, with this checkout's source first on the path."""
    src = str(ROOT / "src")
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERQ_")}
    return subprocess.run([sys.executable, "-m", "ledgerq", *map(str, args)],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**env, "PYTHONPATH": path})


def ok(*args: str | Path) -> str:
    res = ledgerq(*args)
    assert res.returncode == 0, (args, res.stdout, res.stderr)
    return res.stdout


def test_the_example_is_not_loaded_by_default() -> None:
    assert "deployment" not in load_registry().entities
    assert not (packaged_specs_dir() / EXAMPLE.name).exists()


async def _existing_database(target: str) -> tuple[str, str]:
    """A database of the packaged specs, with a run and a schedule in it, closed again."""
    async with StateDB(target) as db:
        assert "deployment" not in db.registry.entities
        run_id = await submit_task(db, TaskApplication("flow", {"n": 1}, "host"))
        schedule_id = await add_schedule(db, "nightly", every=3600, application=TaskApplication(
            "command", {"argv": ["true"]}, "host"))
    return run_id, schedule_id


def _deployment(service: str, environment: str = "production", **extra: Any) -> dict[str, Any]:
    return {"status": "pending", "service": service, "release_tag": "v1.4.0",
            "commit_sha": "9fceb02d0ae598e95dc970b74767f19372d61af8",
            "environment": environment, "previous_release_tag": "v1.3.2",
            "requested_by": "ci", **extra}


async def test_a_new_entity_from_one_file_in_an_existing_database(
        db_target: str, tmp_path: Path) -> None:
    run_id, schedule_id = await _existing_database(db_target)
    registry = load_registry(spec_dir(tmp_path))
    policy = registry.entity("deployment")
    assert policy.table == "deployments"
    ids: dict[str, str] = {}

    async with StateDB(db_target, registry=registry) as db:
        # What was there is untouched and still served.
        assert [f["status"] for f in await history(db, "schedule_run", run_id)] == ["queued"]
        assert [f["status"] for f in await history(db, "schedule", schedule_id)] == ["active"]
        created = StateReason(code="deployment.pending.requested", summary="merge to main")

        async def new(service: str, **extra: Any) -> str:
            return await create(db, "deployment", _deployment(service, **extra),
                                reason=created, actor=Actor(type="webhook", id="ci"))

        async def move(dep: str, src: str, dst: str, code: str, *, actor: Actor = SYSTEM,
                       guard: dict[str, Any] | None = None,
                       patch: dict[str, Any] | None = None) -> Any:
            return await transition(db, request("deployment", dep, src, dst, code, actor=actor),
                                    guard=guard, patch=patch)

        # -- the happy path: built, approved by an operator, rolled out in steps, live.
        dep = ids["live"] = await new("checkout", rollout_steps=2, canary=True)
        row = await _row(db, dep)
        assert (row["status"], row["environment"], row["canary"], row["rollout_step"]) == (
            "pending", "production", True, 0)
        with pytest.raises(ValueError, match="restricted to actor type"):
            await move(dep, "pending", "building", "deployment.building.started", actor=BOT,
                       patch={"builder": "builder-7", "started_at": 1.0})
        with pytest.raises(ValueError, match="requires patch column"):
            await move(dep, "pending", "building", "deployment.building.started")
        started = time.time()
        assert (await move(dep, "pending", "building", "deployment.building.started",
                           actor=BUILDER,
                           patch={"builder": "builder-7", "started_at": started})).applied
        # Only the builder that holds the build reports on it: a guard on the builder.
        stale = await move(dep, "building", "awaiting_approval",
                           "deployment.awaiting_approval.built", guard={"builder": "other"},
                           patch={"artifact_url": "oci://registry/checkout:v1.4.0"})
        assert stale.conflict and not stale.applied
        assert (await move(dep, "building", "awaiting_approval",
                           "deployment.awaiting_approval.built", guard={"builder": "builder-7"},
                           patch={"artifact_url": "oci://registry/checkout:v1.4.0"})).applied
        approval = {"approved_by": "alice", "approved_at": time.time()}
        for actor in (SYSTEM, BOT, Actor(type="scheduler", id="cron")):
            with pytest.raises(ValueError, match="restricted to actor type"):
                await move(dep, "awaiting_approval", "deploying",
                           "deployment.deploying.approved", actor=actor, patch=approval)
        assert (await move(dep, "awaiting_approval", "deploying",
                           "deployment.deploying.approved", actor=OPERATOR,
                           patch=approval)).applied
        for step in (0, 1):
            assert (await move(dep, "deploying", "deploying", "deployment.deploying.step",
                               guard={"rollout_step": step},
                               patch={"rollout_step": step + 1})).applied
        lost_race = await move(dep, "deploying", "deploying", "deployment.deploying.step",
                               guard={"rollout_step": 0}, patch={"rollout_step": 1})
        assert lost_race.conflict
        assert (await move(dep, "deploying", "verifying",
                           "deployment.verifying.rolled_out")).applied
        health = {"p99_ms": 41.5, "errors": 0, "checks": ["http", "db"]}
        assert (await move(dep, "verifying", "live", "deployment.live.healthy",
                           patch={"health": health, "finished_at": time.time()})).applied
        with pytest.raises(ValueError, match=VOCABULARY_ERROR):
            await move(dep, "live", "rolling_back", "deployment.rolling_back.unhealthy",
                       patch={"health": health})
        row = await _row(db, dep)
        assert (row["status"], row["builder"], row["approved_by"], row["rollout_step"]) == (
            "live", "builder-7", "alice", 2)
        assert row["health"] == health and row["version"] == 8

        # -- one in flight per service and environment (the spec's unique partial index).
        blocked = await new("search")
        with pytest.raises(IntegrityViolation):
            await new("search")
        ids["in_flight"] = blocked
        ids["staging"] = await new("search", environment="staging")  # another environment

        # -- unhealthy after the rollout: rolled back.
        back = ids["rolled_back"] = await new("billing")
        await move(back, "pending", "building", "deployment.building.started", actor=BUILDER,
                   patch={"builder": "b1", "started_at": started})
        await move(back, "building", "awaiting_approval", "deployment.awaiting_approval.built",
                   guard={"builder": "b1"}, patch={"artifact_url": "oci://billing"})
        await move(back, "awaiting_approval", "deploying", "deployment.deploying.approved",
                   actor=OPERATOR, patch=approval)
        await move(back, "deploying", "verifying", "deployment.verifying.rolled_out")
        await move(back, "verifying", "rolling_back", "deployment.rolling_back.unhealthy",
                   patch={"health": {"errors": 12}})
        assert (await move(back, "rolling_back", "rolled_back", "deployment.rolled_back.ok",
                           patch={"finished_at": time.time()})).applied

        # -- rejected by an operator while waiting for approval.
        rejected = ids["cancelled"] = await new("ledger")
        await move(rejected, "pending", "building", "deployment.building.started",
                   actor=BUILDER, patch={"builder": "b2", "started_at": started})
        await move(rejected, "building", "awaiting_approval",
                   "deployment.awaiting_approval.built", guard={"builder": "b2"},
                   patch={"artifact_url": "oci://ledger"})
        assert (await move(rejected, "awaiting_approval", "cancelled",
                           "deployment.cancelled.operator", actor=OPERATOR,
                           patch={"finished_at": time.time()})).applied

        # history: every fact, in order, with the reason and the actor.
        facts = await history(db, "deployment", ids["live"])
        assert [(f["previous_status"], f["status"], f["reason_code"], f["source"])
                for f in facts] == [
            (None, "pending", "deployment.pending.requested", "webhook"),
            ("pending", "building", "deployment.building.started", "system"),
            ("building", "awaiting_approval", "deployment.awaiting_approval.built", "system"),
            ("awaiting_approval", "deploying", "deployment.deploying.approved", "operator"),
            ("deploying", "deploying", "deployment.deploying.step", "system"),
            ("deploying", "deploying", "deployment.deploying.step", "system"),
            ("deploying", "verifying", "deployment.verifying.rolled_out", "system"),
            ("verifying", "live", "deployment.live.healthy", "system"),
        ]
        assert [f["entity_version"] for f in facts] == list(range(1, 9))
        assert [f["status"] for f in await history(db, "deployment", ids["rolled_back"])][-2:] \
            == ["rolling_back", "rolled_back"]

        # verify and rebuild cover the new table like any other.
        report = await verify(db)
        assert report.ok, [str(d) for d in report.drift]
        before = await db.fetch_all("SELECT * FROM deployments ORDER BY id")
        assert {r["status"] for r in before} == {"live", "pending", "rolled_back", "cancelled"}
        rebuilt = await rebuild(db)
        assert rebuilt.tables["deployments"] == len(ids) == 5
        assert await db.fetch_all("SELECT * FROM deployments ORDER BY id") == before
        assert (await verify(db)).ok
        facts_total = report.facts

    # The command, as an operator runs it: --specs names the directory with the example.
    specs = tmp_path / "specs"
    checked = json.loads(ok("specs", "check", specs, "--json"))
    assert checked["ok"]
    assert checked["entities"] == ["deployment", "schedule", "schedule_run"]
    verified = json.loads(ok("--specs", specs, "verify", "--db", db_target, "--json"))
    assert verified["ok"] is True and verified["facts"] == facts_total
    assert verified["rows"] == len(ids) + 2  # the deployments, the run and the schedule
    rebuilt_cli = json.loads(ok("--specs", specs, "rebuild", "--db", db_target, "--json"))
    assert rebuilt_cli["tables"]["deployments"] == len(ids)
    assert rebuilt_cli["verify_ok"] is True
    assert "no drift" in ok("--specs", specs, "verify", "--db", db_target)

    async with StateDB(db_target, registry=registry) as db:
        assert await db.fetch_all("SELECT * FROM deployments ORDER BY id") == before


async def _row(db: StateDB, dep: str) -> dict[str, Any]:
    """The row, its JSON columns decoded (SQLite hands back the text, PostgreSQL the value)."""
    rows = [r for r in await db.fetch_all("SELECT * FROM deployments") if r["id"] == dep]
    assert len(rows) == 1
    json_columns = db.registry.entity("deployment").json_columns
    return {c: loads(v) if c in json_columns and isinstance(v, str) else v
            for c, v in rows[0].items()}


def test_the_command_and_the_docs_generator_show_it(tmp_path: Path) -> None:
    specs = spec_dir(tmp_path)
    policy = load_registry(specs).entity("deployment")
    graph = ok("specs", "graph", "deployment", "--specs", specs)
    assert graph == mermaid(policy)
    assert "awaiting_approval --> deploying: actor operator / patch approved_at,approved_by" \
        in graph
    as_json = json.loads(ok("specs", "graph", "deployment", "--specs", specs, "--json"))
    assert as_json["table"] == "deployments"
    assert as_json["terminal"] == ["cancelled", "failed", "live", "rolled_back"]

    out = tmp_path / "lifecycles"
    written = ok("--specs", specs, "specs", "docs", "--out", out)
    assert f"wrote {out / 'deployment.md'}" in written
    page = (out / "deployment.md").read_text(encoding="utf-8")
    assert page == render_markdown(policy)
    assert "# Lifecycle: `deployment`" in page
    assert "Projection table: `deployments` · spec file: `specs/deployment.toml` · " \
           "10 states, 15 edges, 15 reason codes." in page
    assert mermaid(policy).rstrip("\n") in page
    assert "| `awaiting_approval` | `deploying` |  |  | `operator` |  | " \
        "`approved_at`, `approved_by` |" in page
    assert "| `uq_deployments_in_flight` | `service`, `environment` | yes | `status IN (" in page
    assert "| `canary` | `boolean not null default False` | spec |" in page
    assert ok("--specs", specs, "specs", "docs", "--out", out, "--check").startswith("ok: 3")


def test_the_http_api_shows_and_verifies_it(tmp_path: Path) -> None:
    """The entity reaches the HTTP API with no Python change: its spec, its diagram, and
    verify over its rows (both created through the library, the way a user would)."""
    import asyncio

    import httpx

    from helpers.server import TOKEN, serve

    specs = spec_dir(tmp_path)
    target = str(tmp_path / "api.db")

    async def fill() -> None:
        async with StateDB(target, registry=load_registry(specs)) as db:
            await create(db, "deployment", _deployment("api"),
                         reason=StateReason(code="deployment.pending.requested"), actor=SYSTEM)

    asyncio.run(fill())
    with serve(target, root=["--specs", str(specs)]) as server, httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        assert "deployment" in {s["entity"] for s in api.get("/api/specs").json()}
        detail = api.get("/api/specs/deployment").json()
        policy = load_registry(specs).entity("deployment")
        assert detail["states"] == list(policy.states)
        assert set(detail["terminal"]) == set(policy.terminal)
        assert detail["mermaid"] == mermaid(policy)
        svg = api.get("/api/specs/deployment/diagram.svg")
        assert svg.status_code == 200 and "awaiting_approval" in svg.text
        verified = api.get("/api/verify").json()
        assert verified["ok"] and verified["rows"] >= 1
