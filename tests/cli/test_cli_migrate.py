"""``ledgerq migrate`` and ``ledgerq specs diff`` as a user runs them: real subprocesses,
real databases of both backends, first created with the previous release's specs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolution_support import SPECS_V1, SpecDir, fill_v1


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerq", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


@pytest.fixture
async def v1_db(db_target: str) -> str:
    """A database made by the previous release's specs: four runs, two running."""
    await fill_v1(db_target)
    return db_target


def test_plan_changes_nothing_and_apply_migrates(v1_db: str, tmp_path: Path) -> None:
    specs = SpecDir(tmp_path / "specs").paused()
    plan = cli("--db", v1_db, "migrate", "--plan", "--specs", str(specs.path), "--json")
    assert plan.returncode == 0, plan.stderr
    body = json.loads(plan.stdout)
    assert not body["applied"] and "additive: add state schedule_run.paused" in body["steps"]
    again = cli("--db", v1_db, "migrate", "--plan", "--specs", str(specs.path), "--json")
    assert json.loads(again.stdout)["steps"] == body["steps"]  # the plan wrote nothing
    applied = cli("--db", v1_db, "migrate", "--apply", "--specs", str(specs.path))
    assert applied.returncode == 0, applied.stderr
    assert "applied" in applied.stdout
    done = cli("--db", v1_db, "migrate", "--plan", "--specs", str(specs.path))
    assert done.returncode == 0 and "nothing to do" in done.stdout


def test_a_refused_plan_names_the_rows_and_exits_1(v1_db: str, tmp_path: Path) -> None:
    specs = SpecDir(tmp_path / "specs").append('''
[[edges]]
from = "cancelled"
to = ["queued"]
''').replace('terminal = ["completed", "failed", "timed_out", "skipped", "cancelled"]',
             'terminal = ["completed", "failed", "timed_out", "skipped"]').replace(
        'outcome = "cancelled"\n', '')
    done = cli("--db", v1_db, "migrate", "--plan", "--specs", str(specs.path))
    assert done.returncode == 1
    assert "refused:" in done.stdout and "'cancelled'" in done.stdout
    # Opening with those specs (any command) is refused the same way, in one line.
    listed = cli("--db", v1_db, "--specs", str(specs.path), "submit", "agent",
                 "--args", "{}")
    assert listed.returncode == 1
    assert "nothing was changed" in listed.stderr and "Traceback" not in listed.stderr


def test_apply_with_map_state_moves_rows_out_of_a_removed_state(v1_db: str,
                                                                tmp_path: Path) -> None:
    paused = SpecDir(tmp_path / "paused").paused()
    ids = cli("--db", v1_db, "ls", "--json")
    assert ids.returncode == 0, ids.stderr
    runs = [r["id"] for r in json.loads(ids.stdout)["runs"] if r["status"] == "running"]
    assert len(runs) == 2
    code = ("import asyncio, sys\n"
            "from ledgerq import StateDB\n"
            "from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, transition\n"
            "from ledgerq.lifecycle.registry import load_registry\n"
            "async def main():\n"
            "    async with StateDB(sys.argv[1], registry=load_registry(sys.argv[2])) as db:\n"
            "        for i in sys.argv[3:]:\n"
            "            r = await transition(db, TransitionRequest(entity_type='schedule_run',"
            " entity_id=i, from_state='running', to_state='paused', reason=StateReason("
            "code='run.paused.operator'), actor=Actor(type='operator', id='t'),"
            " idempotency_key=i))\n"
            "            assert r.applied\n"
            "asyncio.run(main())\n")
    moved = subprocess.run([sys.executable, "-c", code, v1_db, str(paused.path), *runs],
                           capture_output=True, text=True, timeout=60)
    assert moved.returncode == 0, moved.stderr
    back = SpecDir(tmp_path / "back").codes(
        {"run.queued.migrated": "Moved out of a removed state."})
    refused = cli("--db", v1_db, "migrate", "--apply", "--specs", str(back.path))
    assert refused.returncode == 1
    assert "2 rows" in refused.stdout and "--map-state schedule_run:paused=STATE" in \
        refused.stdout
    bad = cli("--db", v1_db, "migrate", "--apply", "--specs", str(back.path),
              "--map-state", "schedule_run-paused")
    assert bad.returncode == 2 and "ENTITY:FROM=TO" in bad.stderr
    done = cli("--db", v1_db, "migrate", "--apply", "--specs", str(back.path),
               "--map-state", "schedule_run:paused=queued")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "move: schedule_run:paused=queued (reason run.queued.migrated)" in done.stdout
    shown = cli("--db", v1_db, "--specs", str(back.path), "show", runs[0], "--json")
    assert shown.returncode == 0, shown.stderr
    facts = json.loads(shown.stdout)["history"]
    assert facts[-1]["reason_code"] == "run.queued.migrated"
    verified = cli("--db", v1_db, "--specs", str(back.path), "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_specs_diff_compares_directories_and_databases(v1_db: str, tmp_path: Path) -> None:
    specs = SpecDir(tmp_path / "specs").paused().replace(
        'exit_code = "integer"', 'exit_code = "text"')
    by_dirs = cli("specs", "diff", str(SPECS_V1), str(specs.path))
    assert by_dirs.returncode == 0, by_dirs.stderr
    assert "additive: add state schedule_run.paused" in by_dirs.stdout
    assert "refused if rows hold values: change column schedule_run.exit_code" in \
        by_dirs.stdout
    back = cli("specs", "diff", str(specs.path), str(SPECS_V1))
    assert "removal: remove state schedule_run.paused" in back.stdout
    from_db = cli("specs", "diff", v1_db, str(specs.path), "--json")
    assert from_db.returncode == 0, from_db.stderr
    assert json.loads(from_db.stdout)["changes"] == json.loads(
        cli("specs", "diff", str(SPECS_V1), str(specs.path), "--json").stdout)["changes"]
    same = cli("specs", "diff", v1_db, str(SPECS_V1))
    assert same.stdout.strip() == "unchanged: no differences"
