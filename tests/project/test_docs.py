"""The documentation is executable: README example, generated diagrams, spec worked example."""

from __future__ import annotations

import asyncio
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerq import StateDB
from ledgerq.lifecycle import (
    Actor,
    StateReason,
    TransitionRequest,
    default_registry,
    load_registry,
    transition,
)
from ledgerq.lifecycle.diagrams import mermaid
from ledgerq.lifecycle.docs import render_all, stale_pages
from ledgerq.queue import TaskApplication, cancel_task, submit_task

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SPECS_DOC = ROOT / "docs" / "specs.md"
LIFECYCLES = ROOT / "docs" / "lifecycles"


def block(path: Path, marker: str, lang: str) -> str:
    """The fenced ``lang`` block right after ``<!-- marker ... -->`` in ``path``."""
    text = path.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {re.escape(marker)}\b[^>]*-->\n```{lang}\n(.*?)```", text, re.S)
    assert found is not None, f"{path.name}: no ```{lang} block after <!-- {marker} -->"
    return found.group(1)


def run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    script = cwd / "example.py"
    script.write_text(code, encoding="utf-8")
    res = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    return res


# ----------------------------------------------------------------- README


def test_readme_first_example_runs_with_a_real_worker(tmp_path: Path) -> None:
    """The README's first lines, as a reader runs them: tasks.py, a ``ledgerq worker
    --app tasks:app`` process, then ``python tasks.py``; Ctrl-C stops the worker cleanly."""
    import os
    import signal

    code = block(README, "example: first", "python")
    assert len(code.splitlines()) <= 16
    (tmp_path / "tasks.py").write_text(code, encoding="utf-8")
    assert "ledgerq worker --app tasks:app &" in README.read_text(encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    worker = subprocess.Popen([sys.executable, "-m", "ledgerq", "worker", "--app", "tasks:app",
                               "--poll-interval", "0.05"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        res = subprocess.run([sys.executable, "tasks.py"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout == "cat.png resized to 100px\n"
    finally:
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "stopped: 1 completed" in err


def test_readme_example_runs(tmp_path: Path) -> None:
    res = run_python(block(README, "example: readme", "python"), tmp_path)
    lines = res.stdout.splitlines()
    assert lines[0].endswith("'completed'}")
    assert "1 None -> queued run.queued.submitted" in lines[1]
    assert "queued -> running run.started.ok" in lines[2]
    assert "running -> completed run.completed.ok" in lines[-1]
    assert len(block(README, "example: readme", "python").splitlines()) <= 35


def test_readme_diagram_is_the_spec() -> None:
    diagram = block(README, "generated: ledgerq specs graph schedule_run", "mermaid")
    assert diagram == mermaid(default_registry().entity("schedule_run")), (
        "README diagram is stale: paste `ledgerq specs graph schedule_run` into it")


def test_readme_names_the_two_setup_commands() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make demo" in text and "make test" in text
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "$(BIN)/ledgerq demo" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_doc_links_resolve() -> None:
    for doc in (README, *sorted((ROOT / "docs").glob("*.md"))):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text("utf-8")):
            if "://" in target:
                continue
            if target == "docs/performance.md" or target.endswith("/performance.md"):
                continue  # written by the benchmark work, not by the docs
            assert (doc.parent / target).exists(), f"{doc.name}: broken link {target}"


# ----------------------------------------------------------------- generated pages


def test_lifecycle_pages_are_fresh() -> None:
    stale = stale_pages(default_registry(), LIFECYCLES)
    assert not stale, f"docs/lifecycles is stale ({', '.join(stale)}): run `ledgerq specs docs`"
    assert sorted(p.name for p in LIFECYCLES.glob("*.md")) == sorted(
        render_all(default_registry())), "docs/lifecycles has a page for an unknown entity"


def test_mermaid_labels_parse() -> None:
    """Mermaid's state-diagram lexer ends a transition label at ':' or ';'."""
    for policy in default_registry().policies():
        for line in mermaid(policy).splitlines()[1:]:
            label = line.partition(": ")[2]
            assert ":" not in label and ";" not in label, line


# ----------------------------------------------------------------- docs/specs.md


def spec_dir_with_examples(tmp_path: Path) -> Path:
    """The packaged specs plus every spec block of docs/specs.md, inserted as it says."""
    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    run_spec = specs / "schedule_run.toml"
    text = run_spec.read_text(encoding="utf-8")
    for marker in ("example: schedule_run-state", "example: schedule_run-edge"):
        snippet = block(SPECS_DOC, marker, "toml")
        tables, _, codes = snippet.partition("[reason_codes]\n")
        # tables beside the other states and edges; codes under the existing [reason_codes]
        text = text.replace("[reason_codes]\n", tables + "[reason_codes]\n" + codes, 1)
    run_spec.write_text(text, encoding="utf-8")
    (specs / "approval.toml").write_text(block(SPECS_DOC, "example: approval.toml", "toml"),
                                         encoding="utf-8")
    return specs


def test_worked_example_specs_load(tmp_path: Path) -> None:
    registry = load_registry(spec_dir_with_examples(tmp_path))
    runs = registry.entity("schedule_run")
    assert "on_hold" in runs.states
    assert runs.allows("queued", "on_hold") and runs.allows("on_hold", "cancelled")
    assert runs.rule("queued", "on_hold").actors == frozenset({"operator"})
    assert runs.rule("retry_wait", "failed").requires_patch == {"ended_at", "error_detail"}
    assert {"run.on_hold.operator", "run.queued.released",
            "run.failed.abandoned"} <= set(runs.reason_codes)
    approval = registry.entity("approval")
    assert approval.table == "approvals" and approval.terminal == {"approved", "rejected",
                                                                   "expired"}


def test_worked_example_entity_code_runs(tmp_path: Path) -> None:
    spec_dir_with_examples(tmp_path)
    res = run_python(block(SPECS_DOC, "example: approval.py", "python"), tmp_path)
    lines = res.stdout.splitlines()
    assert lines[0].startswith("refused:") and "requires patch column(s)" in lines[0]
    assert lines[1].startswith("refused:") and "restricted to actor type(s)" in lines[1]
    assert lines[2:] == ["None -> requested approval.requested.created system ci",
                         "requested -> approved approval.approved.operator operator alice"]


def test_worked_example_state_and_edge_on_a_fresh_database(tmp_path: Path) -> None:
    registry = load_registry(spec_dir_with_examples(tmp_path))
    alice = Actor(type="operator", id="alice")

    async def go() -> None:
        async with StateDB(tmp_path / "fresh.db", registry=registry) as db:
            run_id = await submit_task(db, TaskApplication("flow", {}, "host"))
            hold = TransitionRequest(
                entity_type="schedule_run", entity_id=run_id, from_state="queued",
                to_state="on_hold", reason=StateReason(code="run.on_hold.operator"),
                actor=alice, idempotency_key=f"hold-{run_id}")
            with pytest.raises(ValueError, match="restricted to actor type"):
                await transition(db, hold.model_copy(
                    update={"actor": Actor(type="agent", id="bot")}))
            assert (await transition(db, hold)).applied
            assert await cancel_task(db, run_id, actor=alice)  # on_hold -> cancelled

    asyncio.run(go())


def test_existing_database_migrates_to_the_docs_example(tmp_path: Path) -> None:
    """An existing database opened with the example's new state migrates on open (no
    table to recreate); dropping the projection and `ledgerq rebuild` still refolds it."""
    ledgerq = shutil.which("ledgerq", path=str(Path(sys.executable).parent))
    if ledgerq is None:
        pytest.skip("the ledgerq console script is not installed")
    db_file = tmp_path / "old.db"

    async def old() -> str:
        async with StateDB(db_file) as db:  # the packaged specs: no on_hold
            return await submit_task(db, TaskApplication("flow", {}, "host"))

    run_id = asyncio.run(old())
    specs = spec_dir_with_examples(tmp_path)
    registry = load_registry(specs)
    hold = TransitionRequest(
        entity_type="schedule_run", entity_id=run_id, from_state="queued", to_state="on_hold",
        reason=StateReason(code="run.on_hold.operator"),
        actor=Actor(type="operator", id="alice"), idempotency_key=f"hold-{run_id}")

    async def try_hold() -> None:
        async with StateDB(db_file, registry=registry) as db:
            assert (await transition(db, hold)).applied

    asyncio.run(try_hold())
    with sqlite3.connect(db_file) as conn:
        conn.execute("DROP TABLE schedule_runs")
    for command in ("rebuild", "verify"):
        res = subprocess.run([ledgerq, "--specs", str(specs), command, "--db", str(db_file)],
                             capture_output=True, text=True, timeout=60, check=False)
        assert res.returncode == 0, res.stdout + res.stderr
    with sqlite3.connect(db_file) as conn:
        assert conn.execute("SELECT status FROM schedule_runs WHERE id = ?",
                            (run_id,)).fetchone() == ("on_hold",)
