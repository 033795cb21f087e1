"""``clears``: an edge taking rows out of a state that holds a column group (a lease) into
one that must not hold it sets the group's columns to NULL, recorded in its fact; specs
check refuses such an edge without it, naming the edge and the fix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evolution_support import PAUSED, PAUSED_CODES, SpecDir
from ledgerq import StateDB
from ledgerq.errors import SpecError
from ledgerq.lifecycle import Actor, load_registry
from ledgerq.lifecycle.registry import held_groups_left_held
from ledgerq.projections import history, verify
from ledgerq.queue import TaskApplication, claim_runs, submit_task

OPERATOR = Actor(type="operator", id="ops")
def paused_specs(tmp: Path, clears: str = 'clears = ["lease"]') -> Path:
    """The packaged specs with the docs' ``paused`` state, its edge clearing ``clears``."""
    paused = PAUSED.replace('clears = ["lease"]', clears)
    return SpecDir(tmp / "specs").append(paused).codes(PAUSED_CODES).path


async def test_a_clearing_edge_leaves_the_lease_behind(db_target: str, tmp_path: Path) -> None:
    async with StateDB(db_target, registry=load_registry(paused_specs(tmp_path))) as db:
        rid = await submit_task(db, TaskApplication("command", {"argv": ["true"]}, "host"))
        (claimed,) = (await claim_runs(db, worker_id="w1")).claimed
        assert claimed["leased_by"] == "w1" and claimed["lease_token"]
        runs = db.entity("schedule_run")
        await runs.move(rid, "paused", actor=OPERATOR)
        paused = await runs.get(rid)
        assert (paused["leased_by"], paused["lease_expires_at"], paused["lease_token"]) == \
            (None, None, None)
        await runs.move(rid, "queued", reason="run.queued.resumed", actor=OPERATOR)
        again = (await claim_runs(db, worker_id="w2")).claimed
        assert [r["id"] for r in again] == [rid]  # a queued run without a lease is claimed
        facts = await history(db, "schedule_run", rid)
        pause = next(f for f in facts if f["status"] == "paused")
        patch = json.loads(pause["patch"]) if isinstance(pause["patch"], str) else pause["patch"]
        assert {k: patch[k] for k in ("leased_by", "lease_expires_at",
                                               "lease_token")} == dict.fromkeys(
            ("leased_by", "lease_expires_at", "lease_token"))
        assert (await verify(db)).ok


def test_an_edge_that_should_clear_is_named_with_its_fix(tmp_path: Path) -> None:
    specs = paused_specs(tmp_path, clears="")
    registry = load_registry(specs)  # loads (logged): databases it made must still open
    (problem,) = held_groups_left_held(registry.entity("schedule_run"))
    assert "edge running -> paused" in problem.message
    assert 'Add clears = ["lease"]' in problem.message and problem.path.endswith(".clears")
    check = subprocess.run([sys.executable, "-m", "ledgerq", "specs", "check", str(specs)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "running -> paused" in check.stdout
    assert held_groups_left_held(load_registry(paused_specs(tmp_path / "b"))
                                 .entity("schedule_run")) == []


@pytest.mark.parametrize(("clears", "fragment"), [
    ('clears = ["leash"]', "'leash' is not a column group"),
])
def test_clears_names_a_declared_group(tmp_path: Path, clears: str, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        load_registry(paused_specs(tmp_path, clears=clears))


def test_the_packaged_specs_clear_every_held_group() -> None:
    for policy in load_registry().policies():
        assert held_groups_left_held(policy) == [], policy.name
