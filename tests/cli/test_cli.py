"""The ``ledgerq`` command, driven through the installed console script in a subprocess.

Exit codes under test: 0 ok, 1 domain failure (conflict, unknown run id, drift,
invalid spec, stale docs), 2 usage/validation error. Every refused input must give
exactly one ``ledgerq: error:`` line on stderr and leave the database unchanged.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.lifecycle import default_registry, load_registry
from ledgerq.lifecycle.diagrams import mermaid
from ledgerq.lifecycle.docs import render_all
from ledgerq.queue import TaskApplication, claim_runs, submit_many
from test_registry import MANY_PROBLEMS

ROOT = Path(__file__).resolve().parents[2]
#: The docs' example outbox entity (opt-in, not packaged).
EXAMPLE_OUTBOX = ROOT / "docs" / "examples" / "dispatch.toml"
BROKEN = ROOT / "tests" / "specs_broken"


def _console_script() -> str:
    found = shutil.which("ledgerq", path=str(Path(sys.executable).parent)) or \
        shutil.which("ledgerq")
    if found is None:
        pytest.skip("the ledgerq console script is not installed (pip install -e .)",
                    allow_module_level=True)
    return found


LEDGERQ = _console_script()


def cli(*args: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 60) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("LEDGERQ_DB", "LEDGERQ_SYNCHRONOUS")}
    # Tables are read by their text: the width a pipe gets without COLUMNS (200), whatever
    # COLUMNS the test process inherited (under pytest-xdist it can be a narrow one).
    base["COLUMNS"] = "200"
    return subprocess.run([LEDGERQ, *map(str, args)], capture_output=True, text=True,
                          env={**base, **(env or {})}, cwd=cwd, timeout=timeout, check=False)


def ok(*args: str | Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    res = cli(*args, **kw)
    assert res.returncode == 0, (res.stdout, res.stderr)
    return res


def as_json(*args: str | Path, **kw: Any) -> Any:
    return json.loads(ok(*args, "--json", **kw).stdout)


def one_error_line(res: subprocess.CompletedProcess[str], code: int) -> str:
    assert res.returncode == code, (res.returncode, res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("ledgerq: error: "), lines[0]
    return lines[0]


def counts(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as conn:
        runs = conn.execute("SELECT COUNT(*) FROM schedule_runs").fetchone()[0]
        facts = conn.execute("SELECT COUNT(*) FROM status_transitions").fetchone()[0]
    return runs, facts


def row(db: Path, run_id: str) -> dict[str, Any]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        got = conn.execute("SELECT * FROM schedule_runs WHERE id = ?", (run_id,)).fetchone()
    assert got is not None
    return dict(got)


def submit(db: Path, *args: str) -> str:
    return ok("submit", "--db", db, *args).stdout.strip()


def lib_submit(db: Path, *apps: TaskApplication) -> list[str]:
    """Set-up through the library (in process: quicker than a subprocess per row)."""

    async def go() -> list[str]:
        async with StateDB(db) as handle:
            return await submit_many(handle, apps)

    return asyncio.run(go())


def app(kind: str = "command", target: str = "host", **kw: Any) -> TaskApplication:
    args = {"argv": ["true"]} if kind == "command" else {}
    return TaskApplication(action_kind=kind, args=args, execution_target=target, **kw)


@pytest.fixture
def dbfile(tmp_path: Path) -> Path:
    return tmp_path / "q.db"


@pytest.fixture
def seeded(dbfile: Path) -> Path:
    """A database holding one queued command run."""
    lib_submit(dbfile, app())
    return dbfile


def wait_terminal(db: Path, ids: list[str], timeout: float = 30.0) -> dict[str, str]:
    terminal = default_registry().entity("schedule_run").terminal
    deadline = time.monotonic() + timeout
    while True:
        status = {i: row(db, i)["status"] for i in ids}
        if all(s in terminal for s in status.values()):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.05)


# ----------------------------------------------------------------- general


def test_help_names_every_subcommand() -> None:
    res = ok("--help")
    for name in ("submit", "ls", "show", "cancel", "worker", "verify", "rebuild", "stats",
                 "demo", "specs"):
        assert name in res.stdout
    specs = ok("specs", "--help")
    for name in ("check", "graph", "docs"):
        assert name in specs.stdout
    assert ok("--version").stdout.strip() == "ledgerq 0.1.0"


def test_module_entry_point_runs_the_same_command() -> None:
    res = subprocess.run([sys.executable, "-m", "ledgerq", "--version"], capture_output=True,
                         text=True, check=False, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "ledgerq 0.1.0"


def test_unknown_subcommand_is_a_usage_error() -> None:
    assert cli("frobnicate").returncode == 2


def test_database_from_option_env_or_default(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "ledgerq.db"
    ok("submit", "command", "--db", a, "--", "true")
    ok("submit", "command", "--", "true", env={"LEDGERQ_DB": str(b)})
    ok("--db", str(b), "submit", "command", "--", "true")
    ok("submit", "command", "--", "true", cwd=tmp_path)
    assert counts(a)[0] == 1 and counts(b)[0] == 2 and counts(c)[0] == 1
    # the command's own --db wins over the environment
    assert as_json("ls", "--db", a, env={"LEDGERQ_DB": str(b)})["total"] == 1


def test_read_commands_refuse_a_missing_database(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    for command in (["ls"], ["show", "abcd"], ["cancel", "abcd"], ["verify"], ["rebuild"],
                    ["stats"]):
        line = one_error_line(cli(*command, "--db", missing), 2)
        assert "no database at" in line
    assert not missing.exists()


# ----------------------------------------------------------------- submit


def test_submit_stores_every_field(dbfile: Path, tmp_path: Path) -> None:
    dep = submit(dbfile, "command", "--", "true")
    run_id = submit(
        dbfile, "command", "--target", "process", "--argv", "sh -c 'echo \"a b\"; exit 0'",
        "--cap", "gpu-exclusive", "--cap", "warmed-cache", "--cap", "gpu-exclusive",
        "--library-ref", "lib@v1", "--library-hash", "sha256:abc",
        "--idempotency-key", "k-1", "--retry-max", "3", "--retry-delay", "0.5",
        "--retry-factor", "3", "--retry-max-delay", "60", "--retry-jitter", "0",
        "--timeout", "12.5", "--depends-on", dep)
    got = row(dbfile, run_id)
    assert json.loads(got["action_args"]) == {"argv": ["sh", "-c", 'echo "a b"; exit 0']}
    assert got["action_kind"] == "command" and got["execution_target"] == "process"
    assert json.loads(got["required_capabilities"]) == [
        "gpu-exclusive", "warmed-cache", "gpu-exclusive"]
    assert got["concurrency_key"].endswith(":gpu-exclusive")
    assert (got["library_ref"], got["library_content_hash"]) == ("lib@v1", "sha256:abc")
    assert got["idempotency_key"] == "k-1"
    assert json.loads(got["retry_policy"]) == {"max_attempts": 3, "base_delay": 0.5,
                                               "factor": 3.0, "max_delay": 60.0, "jitter": 0.0}
    assert got["timeout_seconds"] == 12.5
    assert json.loads(got["depends_on"]) == [dep]
    assert got["status"] == "waiting_dependency"
    assert counts(dbfile) == (2, 2)  # one creation fact each


def test_submit_args_from_json_pairs_and_trailing_argv(dbfile: Path) -> None:
    run_id = submit(dbfile, "playbook", "--args", '{"a": 1, "b": "x"}', "--arg", "b=2",
                    "--arg", "c:=[1, 2]", "--arg", "d=k=v")
    got = row(dbfile, run_id)
    assert got["action_kind"] == "play"  # alias normalized
    assert json.loads(got["action_args"]) == {"a": 1, "b": "2", "c": [1, 2], "d": "k=v"}
    cmd = submit(dbfile, "command", "--", "python3", "-c", "print('--x')")
    assert json.loads(row(dbfile, cmd)["action_args"]) == {
        "argv": ["python3", "-c", "print('--x')"]}
    out = as_json("submit", "flow", "--db", dbfile)
    assert set(out) == {"id", "status"} and out["status"] == "queued"


def test_submit_idempotency_key(seeded: Path) -> None:
    first = submit(seeded, "flow", "--arg", "x=1", "--idempotency-key", "once")
    before = counts(seeded)
    assert submit(seeded, "flow", "--arg", "x=1", "--idempotency-key", "once") == first
    assert counts(seeded) == before
    line = one_error_line(
        cli("submit", "flow", "--arg", "x=2", "--idempotency-key", "once", "--db", seeded), 2)
    assert "once" in line and first in line
    assert counts(seeded) == before


BAD_SUBMISSIONS = [
    (["nope"], "unknown action_kind 'nope'"),
    (["command", "--args", "{bad"], "--args is not valid JSON"),
    (["flow", "--args", "[1, 2]"], "--args must be a JSON object"),
    (["command"], "argv"),
    (["command", "--args", '{"argv": "echo hi"}'], "argv"),
    (["flow", "--target", "mars"], "unknown execution_target 'mars'"),
    (["flow", "--arg", "novalue"], "expected key=value or key:=JSON"),
    (["flow", "--arg", "x:={bad"], "not valid JSON"),
    (["flow", "--", "echo", "hi"], "only for command tasks"),
    (["command", "--argv", "echo 'unbalanced"], "--argv cannot be split"),
    (["command", "--argv", "true", "--", "false"], "not both"),
    (["command", "--args", '{"argv": ["x"]}', "--", "true"], "argv given twice"),
    (["flow", "--retry-max", "0"], "max_attempts"),
    (["flow", "--retry-delay", "1"], "--retry-delay needs --retry-max"),
    (["flow", "--retry-max", "2", "--retry-jitter", "5"], "jitter"),
    (["flow", "--timeout", "-1"], "timeout_seconds"),
    (["flow", "--depends-on", "no-such-run"], "unknown run id"),
    (["flow", "--cap", ""], "required_capabilities[0]"),
    (["flow", "--idempotency-key", ""], "idempotency_key"),
]


@pytest.mark.parametrize(("args", "message"), BAD_SUBMISSIONS,
                         ids=[" ".join(a) for a, _ in BAD_SUBMISSIONS])
def test_bad_submission_is_one_line_exit_2_and_writes_nothing(
        seeded: Path, args: list[str], message: str) -> None:
    before = counts(seeded)
    line = one_error_line(cli("submit", *args, "--db", seeded), 2)
    assert message in line
    assert counts(seeded) == before


def test_bad_submission_creates_no_database(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    one_error_line(cli("submit", "nope", "--db", fresh), 2)
    assert not fresh.exists()


# ----------------------------------------------------------------- ls / show / cancel


def test_ls_filters_pages_newest_first(dbfile: Path) -> None:
    ids = [lib_submit(dbfile, a)[0] for a in (
        app(), app("flow", "process"), app("agent"), app("command", "process"))]
    every = as_json("ls", "--db", dbfile)
    assert [r["id"] for r in every["runs"]] == ids[::-1]
    assert every["total"] == 4 and every["limit"] == 50 and every["offset"] == 0
    assert set(every["columns"]) == set(every["runs"][0])  # stable, documented keys
    assert set(every["columns"]) >= {"id", "status", "action_kind", "execution_target",
                                     "created_at", "exit_code", "leased_by"}
    assert [r["id"] for r in as_json("ls", "--kind", "command", "--db", dbfile)["runs"]] == \
        [ids[3], ids[0]]
    assert [r["id"] for r in as_json("ls", "-t", "process", "-k", "flow",
                                     "--db", dbfile)["runs"]] == [ids[1]]
    page = as_json("ls", "--limit", "2", "--offset", "1", "--db", dbfile)
    assert [r["id"] for r in page["runs"]] == [ids[2], ids[1]] and page["total"] == 4
    assert as_json("ls", "--status", "running", "--db", dbfile)["runs"] == []
    ok("cancel", ids[2], "--db", dbfile)
    assert [r["id"] for r in as_json("ls", "-s", "cancelled", "-s", "completed",
                                     "--db", dbfile)["runs"]] == [ids[2]]
    human = ok("ls", "--db", dbfile)
    for run_id in ids:
        assert run_id in human.stdout
    assert "1-4 of 4" in human.stderr


@pytest.mark.parametrize("args", [["--status", "bogus"], ["--kind", "bogus"],
                                  ["--target", "mars"]])
def test_ls_rejects_unknown_filter_values(seeded: Path, args: list[str]) -> None:
    assert "unknown" in one_error_line(cli("ls", *args, "--db", seeded), 2)


def test_show_row_and_history(seeded: Path) -> None:
    run_id = as_json("ls", "--db", seeded)["runs"][0]["id"]
    ok("cancel", run_id, "--actor", "alice", "--reason", "not needed", "--db", seeded)
    shown = as_json("show", run_id, "--db", seeded)
    assert set(shown) == {"run", "history"}
    assert shown["run"]["id"] == run_id and shown["run"]["status"] == "cancelled"
    assert shown["run"]["action_args"] == {"argv": ["true"]}  # JSON columns decoded
    assert [(f["previous_status"], f["status"], f["reason_code"]) for f in shown["history"]] == [
        (None, "queued", "run.queued.submitted"),
        ("queued", "cancelled", "run.cancelled.operator")]
    last = shown["history"][-1]
    assert (last["source"], last["actor"], last["reason_summary"]) == (
        "operator", "alice", "not needed")
    assert isinstance(last["patch"], dict) and "ended_at" in last["patch"]
    # a unique prefix is enough; the human view shows the row and every fact
    human = ok("show", run_id[:8], "--db", seeded).stdout
    assert run_id in human and "run.cancelled.operator" in human and "history (2 facts)" in human


@pytest.mark.parametrize("command", ["show", "cancel"])
def test_unknown_run_id_is_exit_1_and_writes_nothing(seeded: Path, command: str) -> None:
    before = counts(seeded)
    line = one_error_line(cli(command, "0000-no-such-run", "--db", seeded), 1)
    assert line == "ledgerq: error: no run 0000-no-such-run"
    assert counts(seeded) == before


def test_id_prefixes_unique_ambiguous_and_too_short(dbfile: Path) -> None:
    from ledgerq.lifecycle import Actor, StateReason, create

    async def make() -> None:
        async with StateDB(dbfile) as db:
            for rid in ("abcd0001", "abcd0002", "abce0003"):
                await create(db, "schedule_run", {
                    "id": rid, "status": "queued", "trigger_context": {}, "action_kind": "flow",
                    "action_args": {}, "fired_at": 1.0, "queued_at": 1.0},
                    reason=StateReason(code="run.queued.submitted"),
                    actor=Actor(type="system", id="test"))

    asyncio.run(make())
    assert as_json("show", "abce", "--db", dbfile)["run"]["id"] == "abce0003"
    line = one_error_line(cli("show", "abcd", "--db", dbfile), 2)
    assert "ambiguous" in line and "abcd0001" in line and "abcd0002" in line
    assert one_error_line(cli("cancel", "abc", "--db", dbfile), 1) == \
        "ledgerq: error: no run abc"  # under 4 characters a prefix is not tried


def test_time_ordered_ids_resolve_by_their_random_tail(dbfile: Path) -> None:
    ids = [ok("submit", "command", "--db", dbfile, "--", "true").stdout.strip()
           for _ in range(3)]
    # created together: a long common prefix (character by character, on purpose)
    shared = next((ids[0][:n] for n in range(len(ids[0]), 0, -1)
                   if all(i.startswith(ids[0][:n]) for i in ids)), "")
    assert len(shared) >= 4, ids
    assert as_json("show", ids[1][-8:], "--db", dbfile)["run"]["id"] == ids[1]
    line = one_error_line(cli("show", shared, "--db", dbfile), 2)
    assert "prefix" in line and "ambiguous" in line


def test_cancel_then_cancel_again_conflicts(seeded: Path) -> None:
    run_id = as_json("ls", "--db", seeded)["runs"][0]["id"]
    res = ok("cancel", run_id, "--db", seeded)
    assert res.stdout.strip() == f"cancelled {run_id} (was queued)"
    before = counts(seeded)
    line = one_error_line(cli("cancel", run_id, "--db", seeded), 1)
    assert "already ended (cancelled)" in line
    assert counts(seeded) == before
    again = cli("cancel", run_id, "--json", "--db", seeded)
    assert again.returncode == 1
    assert json.loads(again.stdout) == {"id": run_id, "cancelled": False,
                                        "previous_status": "cancelled", "status": "cancelled"}


# ----------------------------------------------------------------- worker


def start_worker(db: Path, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if k != "LEDGERQ_DB"}
    return subprocess.Popen(
        [LEDGERQ, "worker", "--db", str(db), "--poll-interval", "0.05", "--lock-dir",
         str(tmp_path / "locks"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base)


def test_worker_runs_tasks_and_stops_gracefully_on_sigterm(dbfile: Path, tmp_path: Path
                                                           ) -> None:
    good = submit(dbfile, "command", "--", sys.executable, "-c", "print('hi')")
    bad = submit(dbfile, "command", "--", sys.executable, "-c",
                 "import sys; sys.stderr.write('boom\\n'); sys.exit(3)")
    after = submit(dbfile, "command", "--depends-on", good, "--", "true")
    gpu = submit(dbfile, "command", "--cap", "gpu", "--", "true")
    proc = start_worker(dbfile, tmp_path, "--capacity", "2", "--worker-id", "cli-w",
                        "--cap", "gpu", "--target", "host", "--lease-ttl", "5")
    try:
        status = wait_terminal(dbfile, [good, bad, after, gpu])
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert status == {good: "completed", bad: "failed", after: "completed", gpu: "completed"}
    failed = row(dbfile, bad)
    assert failed["exit_code"] == 3 and "boom" in failed["error_detail"]
    assert row(dbfile, good)["leased_by"] == "cli-w"
    assert "ledgerq worker cli-w" in err and "stopped:" in err
    assert f"run {good} exit 0" in err
    assert as_json("verify", "--db", dbfile)["ok"] is True


def test_worker_sigint_requeues_what_outlives_the_grace(dbfile: Path, tmp_path: Path) -> None:
    slow = submit(dbfile, "command", "--", sys.executable, "-c", "import time; time.sleep(30)")
    proc = start_worker(dbfile, tmp_path, "--worker-id", "cli-int", "--shutdown-grace", "0.3")
    try:
        deadline = time.monotonic() + 20
        while row(dbfile, slow)["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)  # the child is up
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    got = row(dbfile, slow)
    assert got["status"] == "queued" and got["leased_by"] is None
    codes = [f["reason_code"] for f in as_json("show", slow, "--db", dbfile)["history"]]
    assert codes[-1] == "run.queued.worker_shutdown"


def _heartbeats(db: Path, worker_id: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM workers WHERE worker_id = ?",
                                (worker_id,)).fetchone()[0])


def _worker_banner(db: Path, tmp_path: Path, *root: str, env: dict[str, str] | None = None
                   ) -> str:
    """The worker's startup line (it reads the durability level back from its connection)."""
    base = {k: v for k, v in os.environ.items() if k not in ("LEDGERQ_DB", "LEDGERQ_SYNCHRONOUS")}
    worker_id = f"banner-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [LEDGERQ, *root, "worker", "--db", str(db), "--lock-dir", str(tmp_path / "locks"),
         "--worker-id", worker_id],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**base, **(env or {})})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        deadline = time.monotonic() + 20  # serving (signal handlers in place) once it heartbeats
        while not _heartbeats(db, worker_id):
            assert time.monotonic() < deadline, line
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0, line
    return line


def test_worker_durability_from_option_or_env(tmp_path: Path) -> None:
    db = tmp_path / "sync.db"
    async def create() -> None:
        async with StateDB(db):
            pass
    asyncio.run(create())
    assert ", synchronous NORMAL, " in _worker_banner(db, tmp_path)
    assert ", synchronous FULL, " in _worker_banner(db, tmp_path, "--synchronous", "full")
    assert ", synchronous FULL, " in _worker_banner(db, tmp_path,
                                                   env={"LEDGERQ_SYNCHRONOUS": "FULL"})
    assert ", synchronous NORMAL, " in _worker_banner(
        db, tmp_path, "--synchronous", "NORMAL", env={"LEDGERQ_SYNCHRONOUS": "FULL"})


def test_bad_durability_level_is_a_usage_error_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "never.db"
    for args in (["--synchronous", "sometimes", "worker"],
                 ["--synchronous", "paranoid", "submit", "command", "--", "true"]):
        line = one_error_line(cli(*args, "--db", db), 2)
        assert "--synchronous" in line and "FULL" in line and "NORMAL" in line, line
    assert not db.exists()


def test_worker_rejects_bad_options(dbfile: Path) -> None:
    assert "unknown execution target" in one_error_line(
        cli("worker", "--target", "mars", "--db", dbfile), 2)
    assert cli("worker", "--capacity", "0", "--db", dbfile).returncode == 2
    assert not dbfile.exists()


# ----------------------------------------------------------------- verify / rebuild / stats


def test_verify_rebuild_and_drift(seeded: Path) -> None:
    run_id = as_json("ls", "--db", seeded)["runs"][0]["id"]
    report = as_json("verify", "--db", seeded)
    assert report == {"ok": True, "rows": 1, "facts": 1, "drift": []}
    assert "no drift" in ok("verify", "--db", seeded).stdout
    with sqlite3.connect(seeded) as conn:  # tamper with the projection behind the log's back
        conn.execute("UPDATE schedule_runs SET exit_code = 99 WHERE id = ?", (run_id,))
    res = cli("verify", "--db", seeded)
    assert res.returncode == 1
    assert f"drift: schedule_run {run_id}: column differs exit_code" in res.stdout
    bad = cli("verify", "--json", "--db", seeded)
    assert bad.returncode == 1
    drift = json.loads(bad.stdout)
    assert drift["ok"] is False
    assert [(d["entity_id"], d["column"], d["expected"], d["actual"])
            for d in drift["drift"]] == [(run_id, "exit_code", None, 99)]
    assert set(drift["drift"][0]) == {"entity_type", "entity_id", "problem", "column",
                                      "expected", "actual", "message"}
    before = counts(seeded)
    rebuilt = ok("rebuild", "--db", seeded)
    assert "rebuilt 1 rows from 1 facts" in rebuilt.stdout and "clean" in rebuilt.stdout
    assert counts(seeded) == before
    assert row(seeded, run_id)["exit_code"] is None
    assert as_json("rebuild", "--db", seeded) == {
        "rows": 1, "facts": 1,
        "tables": {"schedule_definitions": 0, "schedule_runs": 1},
        "verify_ok": True}


def test_stats_counts_oldest_age_and_running_per_worker(dbfile: Path) -> None:
    ids = lib_submit(dbfile, app("flow"), app("flow"), app("flow"))
    ok("cancel", ids[0], "--db", dbfile)

    async def claim() -> None:
        async with StateDB(dbfile) as db:
            got = await claim_runs(db, worker_id="stats-w", limit=1)
            assert len(got.claimed) == 1

    asyncio.run(claim())
    s = as_json("stats", "--db", dbfile)
    assert set(s) == {"now", "counts", "total", "oldest_queued_at",
                      "oldest_queued_age_seconds", "running_by_worker", "workers",
                      "stuck", "stuck_runs", "unserved_kinds"}
    assert (s["stuck"], s["stuck_runs"]) == (0, [])
    assert list(s["counts"]) == sorted(default_registry().entity("schedule_run").states)
    assert s["counts"]["queued"] == 1 and s["counts"]["running"] == 1
    assert s["counts"]["cancelled"] == 1 and s["total"] == 3
    assert s["running_by_worker"] == {"stats-w": 1}
    assert s["oldest_queued_age_seconds"] >= 0
    human = ok("stats", "--db", dbfile).stdout
    assert "oldest queued:" in human and "stats-w" in human and "total" in human


# ----------------------------------------------------------------- specs


def test_specs_check_packaged_and_json() -> None:
    assert ok("specs", "check").stdout.startswith("ok: 2 file(s), 2 entities")
    report = as_json("specs", "check")
    assert report["ok"] is True and report["problems"] == []
    assert report["entities"] == ["schedule", "schedule_run"]
    assert set(report) == {"ok", "dir", "files", "entities", "problems"}


def test_specs_check_lists_every_problem_with_file_and_path(tmp_path: Path) -> None:
    shutil.copy(ROOT / "specs" / "schedule_run.toml", tmp_path)
    for name in ("unreachable_state.toml", "wrong_type.toml", "malformed_toml.toml",
                 "edge_to_undeclared_state.toml"):
        shutil.copy(BROKEN / name, tmp_path)
    (tmp_path / "zz_broken.toml").write_text(
        'entity = "gadget"\ntable = "gadgets"\ninitial = ["new"]\nterminal = ["done"]\n'
        'edges = [{from = "new", to = ["done"]}, {from = "done", to = ["new"]}]\n'
        '[states.new]\ndescription = "n"\n[states.done]\ndescription = "d"\n'
        '[reason_codes]\n"gadget.done.ok" = "ok"\n')
    res = cli("specs", "check", tmp_path)
    assert res.returncode == 1
    lines = res.stdout.strip().splitlines()
    # One per broken rule, and the three widget files also claim one entity and table
    # (found now that a file's own problems no longer keep it out of the checks across
    # files).
    assert len(lines) == 9, lines
    assert sum("duplicate entity 'widget'" in line for line in lines) == 2
    assert sum("duplicate table 'widgets'" in line for line in lines) == 2
    for line in lines:
        file, path, message = line.split(": ", 2)
        assert Path(file).parent == tmp_path and path.startswith("$") and message
    assert any(f"{tmp_path / 'zz_broken.toml'}: $.edges[1].from: terminal state 'done'" in line
               for line in lines)
    assert any("wrong_type.toml: $.initial: Expected `array`, got `str`" in line
               for line in lines)
    report = json.loads(cli("specs", "check", tmp_path, "--json").stdout)
    assert report["ok"] is False and report["entities"] == []
    assert [(Path(p["file"]).name, p["path"]) for p in report["problems"]] == [
        (Path(line.split(": ")[0]).name, line.split(": ")[1]) for line in lines]
    assert cli("specs", "check", tmp_path / "does-not-exist").returncode == 2


def test_specs_check_reports_every_problem_of_a_directory_in_one_run() -> None:
    """tests/specs_broken/many_problems: four files, several problems each, some of which
    once hid the others (a decoding error stopped the file, a rule stopped the graph
    checks, a broken file stayed out of the checks across files)."""
    res = cli("specs", "check", BROKEN / "many_problems")
    assert res.returncode == 1
    lines = res.stdout.strip().splitlines()
    assert [tuple(line.split(": ", 2)[:2]) for line in lines] == [
        (str(BROKEN / "many_problems" / name), path) for name, path, _ in MANY_PROBLEMS]
    for line, (_, _, fragment) in zip(lines, MANY_PROBLEMS, strict=True):
        assert fragment in line, line
    assert res.stderr == (f"ledgerq: error: {len(MANY_PROBLEMS)} problem(s) in "
                          f"{BROKEN / 'many_problems'}\n")
    report = json.loads(cli("specs", "check", BROKEN / "many_problems", "--json").stdout)
    assert report["ok"] is False
    assert [(Path(p["file"]).name, p["path"]) for p in report["problems"]] == [
        (name, path) for name, path, _ in MANY_PROBLEMS]


def test_specs_check_one_file_and_duplicates() -> None:
    assert ok("specs", "check", EXAMPLE_OUTBOX).stdout.startswith("ok: 1 file")
    res = cli("specs", "check", BROKEN / "duplicate_table")
    assert res.returncode == 1
    assert "$.table: duplicate table 'widgets'" in res.stdout


def test_specs_graph_mermaid_and_json() -> None:
    policy = default_registry().entity("schedule_run")
    assert ok("specs", "graph", "schedule_run").stdout == mermaid(policy)
    graph = as_json("--specs", EXAMPLE_OUTBOX, "specs", "graph", "dispatch")
    assert set(graph) == {"entity", "table", "states", "initial", "terminal", "edges", "mermaid"}
    assert graph["table"] == "dispatch_outbox"
    assert {"from": "dead_letter", "to": "pending"} in graph["edges"]
    assert graph["mermaid"] == mermaid(load_registry(EXAMPLE_OUTBOX).entity("dispatch"))
    assert "unknown entity type 'nope'" in one_error_line(cli("specs", "graph", "nope"), 2)


def test_specs_graph_and_docs_from_another_spec_dir(tmp_path: Path) -> None:
    shutil.copy(BROKEN / "unreachable_state.toml", tmp_path)
    line = one_error_line(cli("specs", "graph", "widget", "--specs", tmp_path), 1)
    assert "specs check" in line


def test_specs_docs_writes_and_checks_pages(tmp_path: Path) -> None:
    out = tmp_path / "lifecycles"
    assert cli("specs", "docs", "--out", out, "--check").returncode == 1
    res = ok("specs", "docs", "--out", out)
    pages = render_all(default_registry())
    assert sorted(p.name for p in out.iterdir()) == sorted(pages)
    for name, text in pages.items():
        assert (out / name).read_text() == text
        assert f"wrote {out / name}" in res.stdout
    assert "unchanged" in ok("specs", "docs", "--out", out).stdout
    assert ok("specs", "docs", "--out", out, "--check").returncode == 0
    (out / "schedule.md").write_text("edited by hand\n")
    stale = cli("specs", "docs", "--out", out, "--check")
    assert stale.returncode == 1 and f"stale: {out / 'schedule.md'}" in stale.stdout
    assert (out / "schedule.md").read_text() == "edited by hand\n"  # --check writes nothing


# ----------------------------------------------------------------- demo


@pytest.mark.slow
def test_demo_end_to_end(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    started = time.monotonic()
    res = cli("demo", "--db", db, timeout=120)
    elapsed = time.monotonic() - started
    assert res.returncode == 0, res.stdout + res.stderr
    assert elapsed < 60
    assert "demo ok" in res.stdout and "SIGKILL worker-a" in res.stdout
    assert "verify(): clean" in res.stdout
    statuses = as_json("stats", "--db", db)["counts"]
    assert statuses["completed"] == 6 and statuses["failed"] == 1
    assert statuses["cancelled"] == 2 and statuses["timed_out"] == 1
    assert sum(statuses.values()) == 10
    with sqlite3.connect(db) as conn:
        recovered = conn.execute(
            "SELECT entity_id FROM status_transitions WHERE reason_code = ?",
            ("run.queued.lease_expired",)).fetchall()
    assert len(recovered) >= 1
    history = as_json("show", recovered[0][0], "--db", db)["history"]
    assert history[-1]["reason_code"] == "run.completed.ok"
    assert {f["actor"] for f in history if f["reason_code"] == "run.started.ok"} == {
        "worker-a", "worker-b"}
    assert as_json("verify", "--db", db)["ok"] is True
    # a second demo refuses to reuse the database
    assert "already exists" in one_error_line(cli("demo", "--db", db), 2)


def test_global_specs_option_and_env(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    shutil.copytree(ROOT / "specs", specs)
    (specs / "gadget.toml").write_text(
        'entity = "gadget"\ntable = "gadgets"\ninitial = ["new"]\nterminal = ["done"]\n'
        'edges = [{from = "new", to = ["done"]}]\n'
        '[states.new]\ndescription = "n"\n[states.done]\ndescription = "d"\n'
        '[reason_codes]\n"gadget.done.ok" = "ok"\n')
    assert as_json("--specs", str(specs), "specs", "check")["entities"] == [
        "gadget", "schedule", "schedule_run"]
    assert ok("specs", "graph", "gadget", env={"LEDGERQ_SPECS": str(specs)}).stdout == (
        "stateDiagram-v2\n    [*] --> new\n    new --> done\n    done --> [*]\n")
    db = tmp_path / "g.db"
    ok("--specs", str(specs), "submit", "--db", str(db), "flow")
    with sqlite3.connect(db) as conn:  # the database was opened with the gadget spec
        assert conn.execute("SELECT COUNT(*) FROM gadgets").fetchone() == (0,)
    assert cli("--specs", str(tmp_path / "nope"), "ls").returncode == 2
