"""docs/specs.md's worked example, run as written: its spec text adds ``paused`` to a
live database, a real ``ledgerq worker`` process runs a task, an operator pauses it
(the worker stops the child: its lease is gone) and resumes it, and a worker claims it
again and completes it. Without ``clears = ["lease"]`` the resumed run kept its lease
and was never claimed, while ``stats`` said nothing was stuck."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

from evolution_support import PAUSED_CODES, SpecDir

DOCS = Path(__file__).resolve().parents[2] / "docs" / "specs.md"


def example_spec() -> str:
    """The first TOML block of the worked example, as the page shows it."""
    text = DOCS.read_text("utf-8")
    section = text[text.index("### Worked example: add `paused`"):]
    found = re.search(r"```toml\n(.*?)```", section, re.S)
    assert found, "the worked example lost its spec text"
    return found.group(1)


def ledgerq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerq", *args], capture_output=True,
                          text=True, timeout=120)


def row(db: str, specs: Path, rid: str) -> dict[str, object]:
    done = ledgerq("--specs", str(specs), "show", rid, "--db", db, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["run"]  # type: ignore[no-any-return]


def wait_for(db: str, specs: Path, rid: str, status: str, seconds: float = 60) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    while True:
        got = row(db, specs, rid)
        if got["status"] == status:
            return got
        assert time.monotonic() < deadline, f"run {rid} is {got['status']}, not {status}"
        time.sleep(0.2)


def test_a_paused_run_resumes_and_a_real_worker_completes_it(db_target: str,
                                                             tmp_path: Path) -> None:
    specs = SpecDir(tmp_path / "specs").append(example_spec()).codes(PAUSED_CODES).path
    assert ledgerq("specs", "check", str(specs)).returncode == 0
    mark = tmp_path / "first-run"
    script = f"if [ -e {mark} ]; then exit 0; fi; touch {mark}; sleep 120"
    submitted = ledgerq("--specs", str(specs), "submit", "--db", db_target, "command", "--",
                        "sh", "-c", script)
    assert submitted.returncode == 0, submitted.stderr
    rid = submitted.stdout.strip()
    worker = subprocess.Popen(
        [sys.executable, "-m", "ledgerq", "--specs", str(specs), "worker", "--db", db_target,
         "--poll-interval", "0.2", "--lease-ttl", "3", "--lock-dir", str(tmp_path / "locks")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(db_target, specs, rid, "running")
        while not mark.exists():
            time.sleep(0.05)
        paused = ledgerq("--specs", str(specs), "move", "schedule_run", rid, "paused",
                         "--db", db_target)
        assert paused.returncode == 0, paused.stderr
        held = wait_for(db_target, specs, rid, "paused")
        assert (held["leased_by"], held["lease_token"], held["lease_expires_at"]) == \
            (None, None, None)
        resumed = ledgerq("--specs", str(specs), "move", "schedule_run", rid, "queued",
                          "--reason", "run.queued.resumed", "--db", db_target)
        assert resumed.returncode == 0, resumed.stderr
        done = wait_for(db_target, specs, rid, "completed")
        assert done["exit_code"] == 0
    finally:
        worker.terminate()
        worker.communicate(timeout=30)
    history = json.loads(ledgerq("--specs", str(specs), "show", rid, "--db", db_target,
                                 "--json").stdout)["history"]
    moves = [(f["previous_status"], f["status"]) for f in history]
    assert [m for m in moves if m[0] != m[1]] == [  # lease renewals aside
        (None, "queued"), ("queued", "running"), ("running", "paused"), ("paused", "queued"),
        ("queued", "running"), ("running", "completed")]
    assert "no drift" in ledgerq("--specs", str(specs), "verify", "--db", db_target).stdout
