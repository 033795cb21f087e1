"""The `ledgerq` command against PostgreSQL: a URL is as good a --db as a file.

The command's own behaviour (messages, exit codes, escaping, read-only opens) is tested
on SQLite files in tests/cli/test_cli.py; here each command an operator runs against a
shared database is run once, as a real subprocess, on a fresh PostgreSQL schema, and
one worker process serves what was submitted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

LEDGERQ = str(Path(sys.executable).with_name("ledgerq"))


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LEDGERQ, *args], capture_output=True, text=True, timeout=60,
                          check=False, env={**os.environ, **(env or {})})


def ok(*args: str, **kw: Any) -> str:
    res = cli(*args, **kw)
    assert res.returncode == 0, (args, res.stdout, res.stderr)
    return res.stdout


def test_the_command_runs_on_a_postgresql_url(pg_target: str, tmp_path: Path) -> None:
    url = pg_target
    marker = tmp_path / "ran"
    first = ok("submit", "command", "--db", url, "--", "sh", "-c", f"echo done >> {marker}")
    run_id = first.strip()
    # $LEDGERQ_DB works as well as --db.
    second = ok("submit", "command", "--json", "--", "true",
                env={"LEDGERQ_DB": url})
    assert json.loads(second)["status"] == "queued"
    listed = json.loads(ok("ls", "--db", url, "--json"))
    assert {r["id"] for r in listed["runs"]} >= {run_id}
    cancelled = json.loads(second)["id"]
    assert json.loads(ok("cancel", cancelled, "--db", url, "--json"))["cancelled"] is True

    worker = subprocess.Popen(
        [LEDGERQ, "worker", "--db", url, "--capacity", "2", "--poll-interval", "0.05",
         "--lock-dir", str(tmp_path / "locks")], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            shown = json.loads(ok("show", run_id[-6:], "--db", url, "--json"))
            if shown["run"]["status"] == "completed":
                break
            time.sleep(0.1)
        assert shown["run"]["status"] == "completed", shown
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert "synchronous_commit on" in err  # the banner reports the server's durability
    assert marker.read_text() == "done\n"
    assert [f["status"] for f in shown["history"]] == ["queued", "running", "completed"]

    stats = json.loads(ok("stats", "--db", url, "--json"))
    assert stats["counts"]["completed"] == 1 and stats["counts"]["cancelled"] == 1
    assert json.loads(ok("verify", "--db", url, "--json"))["ok"] is True
    ok("rebuild", "--db", url)  # exit 0: every row recreated from the log, then verified
    assert json.loads(ok("verify", "--db", url, "--json"))["ok"] is True


def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    res = cli("ls", "--db", "postgresql://nobody@127.0.0.1:1/none")
    assert res.returncode == 2, res  # a database that cannot be opened: a usage error
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("ledgerq: error: "), res.stderr
    assert "Traceback" not in res.stderr
