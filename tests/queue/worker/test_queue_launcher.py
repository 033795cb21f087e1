"""The launcher and default executor: argv per kind, never a shell, own process group."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ledgerq import StateDB
from ledgerq.projections import history, verify
from ledgerq.queue import (
    TaskApplication,
    build_argv,
    default_execute,
    make_default_execute,
    submit_task,
    worker_tick,
)
from ledgerq.queue.worker import launcher as launcher_mod
from ledgerq.queue.worker import outcomes as outcomes_mod
from ledgerq.queue.worker.launcher import LaunchError, run_argv

RECORD_KINDS = ("agent", "flow", "fanout", "play", "flow_yaml", "engine")
PY = sys.executable
NOW = 10_000.0


@pytest.fixture
async def qdb(db_target: str) -> AsyncIterator[StateDB]:
    async with StateDB(db_target) as handle:
        yield handle


def executable(path: Path, body: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def run_of(kind: str, args: Any) -> dict[str, Any]:
    return {"id": "run-1", "action_kind": kind, "action_args": args}


def process_state(pid: int) -> str | None:
    """The /proc state letter of a process, or None once it no longer exists."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()[0]


async def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_state(pid) in (None, "Z", "X"):
            return True
        await asyncio.sleep(0.02)
    return False


# ----------------------------------------------------------------- argv per kind


def test_command_runs_its_argv_with_the_program_resolved() -> None:
    sh = shutil.which("sh")
    assert sh is not None
    argv = build_argv(run_of("command", {"argv": ["sh", "-c", "echo hi; exit 3", "x y"]}))
    assert argv == [os.path.abspath(sh), "-c", "echo hi; exit 3", "x y"]
    assert os.path.isabs(argv[0])


def test_command_with_a_relative_path_is_made_absolute(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    executable(tmp_path / "bin" / "tool")
    monkeypatch.chdir(tmp_path)
    argv = build_argv(run_of("command", {"argv": ["./bin/tool", "--flag"]}))
    assert argv == [str(tmp_path / "bin" / "tool"), "--flag"]


@pytest.mark.parametrize("kind", RECORD_KINDS)
def test_record_kinds_go_through_the_prefix_resolved_to_an_absolute_path(
        kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    li = executable(tmp_path / "relbin" / "li")
    monkeypatch.chdir(tmp_path)
    # a relative PATH entry still yields an absolute program path
    monkeypatch.setenv("PATH", "relbin" + os.pathsep + os.environ.get("PATH", ""))
    args = {"prompt": "hi; rm -rf /", "n": 2}
    argv = build_argv(run_of(kind, args))
    assert argv[0] == str(li)
    assert os.path.isabs(argv[0])
    assert argv[1] in (kind, kind.replace("_", "-"))
    payloads = [json.loads(a) for a in argv[2:] if a.startswith("{")]
    assert payloads == [args]
    custom = executable(tmp_path / "other" / "runner")
    assert build_argv(run_of(kind, args), prefix=str(custom))[0] == str(custom)


def test_default_prefix_is_li() -> None:
    assert launcher_mod.DEFAULT_COMMAND_PREFIX == "li"


@pytest.mark.parametrize(("run", "needle"), [
    (run_of("command", {}), "argv"),
    (run_of("command", {"argv": []}), "argv"),
    (run_of("command", {"argv": "echo hi"}), "argv"),
    (run_of("command", {"argv": ["definitely-not-a-program-4e1f"]}),
     "definitely-not-a-program-4e1f"),
    (run_of("workflow", {}), "workflow"),
    (run_of("agent", ["not", "a", "dict"]), "action_args"),
])
async def test_build_errors_become_exit_1_with_a_message(run: dict[str, Any],
                                                         needle: str) -> None:
    with pytest.raises(LaunchError):
        build_argv(run)
    code, message = await default_execute(run)
    assert code == 1
    assert needle in message


async def test_unresolvable_prefix_becomes_exit_1_with_a_message(tmp_path: Path) -> None:
    for prefix in ("no-such-li-binary-9c2d", str(tmp_path / "missing" / "li")):
        execute = make_default_execute(prefix=prefix)
        code, message = await execute(run_of("agent", {"prompt": "hi"}))
        assert code == 1
        assert prefix in message
    not_executable = tmp_path / "li"
    not_executable.write_text("#!/bin/sh\n")
    code, message = await make_default_execute(prefix=str(not_executable))(run_of("flow", {}))
    assert code == 1 and str(not_executable) in message


async def test_a_program_that_cannot_start_becomes_exit_1(tmp_path: Path) -> None:
    garbage = executable(tmp_path / "garbage", "\x7fELF this is not a real binary\n")
    code, message = await default_execute(run_of("command", {"argv": [str(garbage)]}))
    assert code == 1 and message


async def test_record_kind_runs_the_prefix_program_with_the_args(tmp_path: Path) -> None:
    out = tmp_path / "argv.json"
    li = executable(tmp_path / "li", f"#!{PY}\nimport json, sys\n"
                    f"open({str(out)!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                    "sys.stderr.write('li failed on purpose')\nsys.exit(5)\n")
    code, detail = await make_default_execute(prefix=str(li))(run_of("flow_yaml", {"f": "x"}))
    assert (code, detail) == (5, "li failed on purpose")
    seen = json.loads(out.read_text())
    assert seen[0] in ("flow_yaml", "flow-yaml")
    assert {"f": "x"} in [json.loads(a) for a in seen[1:] if a.startswith("{")]


# ----------------------------------------------------------------- no shell, own group, tails


async def test_no_shell_arguments_are_passed_literally(tmp_path: Path) -> None:
    hostile = ["a; touch PWNED", "$(touch PWNED2)", "`touch PWNED3`", "*", "x > PWNED4",
               "$HOME", "'quoted'", ""]
    script = ("import json, sys; sys.stderr.write(json.dumps(sys.argv[1:])); sys.exit(7)")
    run = run_of("command", {"argv": [PY, "-c", script, *hostile], "cwd": str(tmp_path)})
    code, detail = await default_execute(run)
    assert code == 7
    assert json.loads(detail) == hostile
    assert sorted(p.name for p in tmp_path.iterdir()) == []


async def test_child_runs_in_its_own_process_group() -> None:
    script = "import json, os; print(json.dumps([os.getpid(), os.getpgid(0), os.getsid(0)]))"
    code, out, err = await run_argv([PY, "-c", script])
    assert code == 0, err
    pid, pgid, sid = json.loads(out)
    assert pgid == pid  # the child leads its own group
    assert pgid != os.getpgid(0)
    assert sid == pid  # and its own session: no controlling terminal shared with the worker


async def test_leftover_group_members_are_killed_when_the_child_exits() -> None:
    script = ("import subprocess, sys; p = subprocess.Popen(['sleep', '30'], "
              "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, "
              "stdin=subprocess.DEVNULL); print(p.pid)")
    code, out, _ = await run_argv([PY, "-c", script])
    assert code == 0
    assert await wait_gone(int(out)), "the grandchild outlived its run"


async def test_cancelling_a_run_kills_its_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = (f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); "
              "time.sleep(30)")
    task = asyncio.ensure_future(run_argv([PY, "-c", script]))
    deadline = time.monotonic() + 10
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    pid = int(pidfile.read_text())
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await wait_gone(pid)


async def test_output_is_kept_as_a_bounded_tail() -> None:
    script = ("import sys; sys.stdout.write('o' * 300000 + 'OUT-END'); "
              "sys.stderr.write('e' * 300000 + 'ERR-END'); sys.exit(1)")
    code, out, err = await run_argv([PY, "-c", script], tail_bytes=64)
    assert code == 1
    assert len(out) <= 64 and out.endswith("OUT-END")
    assert len(err) <= 64 and err.endswith("ERR-END")
    code, detail = await default_execute(run_of("command", {"argv": [PY, "-c", script]}))
    assert code == 1
    assert len(detail) <= launcher_mod.OUTPUT_TAIL_BYTES and detail.endswith("ERR-END")


async def test_exit_zero_and_nonzero_through_the_default_executor() -> None:
    assert await default_execute(run_of("command", {"argv": ["true"]})) == (0, "")
    code, detail = await default_execute(
        run_of("command", {"argv": ["sh", "-c", "echo bad thing >&2; exit 4"]}))
    assert (code, detail) == (4, "bad thing")


# ----------------------------------------------------------------- through a worker


async def test_worker_runs_command_tasks_with_the_default_executor(qdb: StateDB,
                                                                   tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    ok = await submit_task(qdb, TaskApplication(
        "command", {"argv": ["sh", "-c", 'printf "%s" "$1" > "$2"', "sh", "ran; not a shell",
                             str(marker)]}, "host"), now=NOW)
    bad = await submit_task(qdb, TaskApplication(
        "command", {"argv": [PY, "-c", "import sys; sys.stderr.write('E' * 20000 + 'tail');"
                             "sys.exit(9)"]}, "host"), now=NOW + 1)
    missing = await submit_task(qdb, TaskApplication(
        "command", {"argv": ["no-such-program-77aa"]}, "host"), now=NOW + 2)
    got = await worker_tick(qdb, worker_id="w1", now=NOW + 3)
    assert got == {"requeued": 0, "failed": 0, "claimed": 3}
    assert marker.read_text() == "ran; not a shell"
    rows = {r["id"]: r for r in await qdb.fetch_all("SELECT * FROM schedule_runs")}
    assert (rows[ok]["status"], rows[ok]["exit_code"]) == ("completed", 0)
    assert (rows[bad]["status"], rows[bad]["exit_code"]) == ("failed", 9)
    assert rows[bad]["error_detail"].endswith("tail")
    assert len(rows[bad]["error_detail"]) <= outcomes_mod.DETAIL_LIMIT
    assert (rows[missing]["status"], rows[missing]["exit_code"]) == ("failed", 1)
    assert "no-such-program-77aa" in rows[missing]["error_detail"]
    for rid in (ok, bad, missing):
        assert [f["status"] for f in await history(qdb, "schedule_run", rid)] == [
            "queued", "running", rows[rid]["status"]]
    assert (await verify(qdb)).ok
