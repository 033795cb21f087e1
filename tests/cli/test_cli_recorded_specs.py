"""Without ``--specs``, commands judge by the specs the database records: an app that
added ``paused`` to runs leaves no operator command calling a paused run "ended" or a
``--status paused`` filter unknown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from evolution_support import SpecDir
from ledgerq import StateDB
from ledgerq.lifecycle import Actor, load_registry
from ledgerq.queue import TaskApplication, claim_runs, submit_task

OPERATOR = Actor(type="operator", id="ops")


def ledgerq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerq", *args], capture_output=True,
                          text=True, timeout=120)


async def test_commands_without_specs_know_the_recorded_states(db_target: str,
                                                                tmp_path: Path) -> None:
    specs = SpecDir(tmp_path / "specs").paused().path
    async with StateDB(db_target, registry=load_registry(specs)) as db:
        rid = await submit_task(db, TaskApplication("command", {"argv": ["true"]}, "host"))
        await claim_runs(db, worker_id="w1")
        await db.entity("schedule_run").move(rid, "paused", actor=OPERATOR)
    listed = ledgerq("ls", "--status", "paused", "--db", db_target, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [r["id"] for r in json.loads(listed.stdout)["runs"]] == [rid]
    stats = json.loads(ledgerq("stats", "--db", db_target, "--json").stdout)
    assert stats["counts"]["paused"] == 1
    cancelled = ledgerq("cancel", rid, "--db", db_target, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["cancelled"] is True
    shown = json.loads(ledgerq("show", rid, "--db", db_target, "--json").stdout)
    assert [f["status"] for f in shown["history"]][-2:] == ["paused", "cancelled"]


def test_specs_only_uses_the_directory_alone(tmp_path: Path) -> None:
    """``--specs-only``: the packaged entities a directory does not declare are left out,
    so ``migrate --apply`` can drop one (``schedule``) from a database; without it they
    come back with the directory (``load_registry``'s merge)."""
    from ledgerq.lifecycle.registry import packaged_specs_dir

    db = str(tmp_path / "s.db")
    assert ledgerq("submit", "--db", db, "command", "--", "true").returncode == 0
    mine = tmp_path / "specs"
    mine.mkdir()
    (mine / "schedule_run.toml").write_text(
        (packaged_specs_dir() / "schedule_run.toml").read_text())
    merged = ledgerq("--specs", str(mine), "migrate", "--plan", "--db", db)
    assert merged.returncode == 0 and "remove entity" not in merged.stdout, merged.stdout
    only = ledgerq("--specs", str(mine), "--specs-only", "migrate", "--apply", "--db", db)
    assert only.returncode == 0, only.stderr
    assert "remove entity schedule" in only.stdout, only.stdout
    check = ledgerq("--specs", str(mine), "--specs-only", "specs", "check", "--json")
    assert json.loads(check.stdout)["entities"] == ["schedule_run"]
    refused = ledgerq("--specs-only", "ls", "--db", db)
    assert refused.returncode == 2 and "--specs-only needs --specs" in refused.stderr
