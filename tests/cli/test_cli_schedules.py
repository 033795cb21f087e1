"""``ledgerq schedule ...`` end to end in subprocesses, on both backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ledgerq", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})


def test_add_ls_show_pause_resume_rm(db_target: str) -> None:
    added = cli("--db", db_target, "schedule", "add", "nightly", "--cron", "0 2 * * 1-5",
                "--tz", "Europe/Berlin", "--overlap", "skip", "--", "true")
    assert added.returncode == 0, added.stderr
    sid = added.stdout.strip()
    listed = json.loads(cli("--db", db_target, "schedule", "ls", "--json").stdout)
    [row] = listed["schedules"]
    assert row["id"] == sid and row["status"] == "active" and row["cron"] == "0 2 * * 1-5"
    assert row["next_fire_at"] is not None and row["last_fire"] is None
    assert row["application"]["args"] == {"argv": ["true"]}
    human = cli("--db", db_target, "schedule", "ls")
    assert "nightly" in human.stdout and "cron 0 2 * * 1-5 Europe/Berlin" in human.stdout
    assert cli("--db", db_target, "schedule", "pause", "nightly").returncode == 0
    again = cli("--db", db_target, "schedule", "pause", "nightly")
    assert again.returncode == 1 and "cannot pause" in again.stderr
    assert cli("--db", db_target, "schedule", "resume", sid).returncode == 0
    shown = json.loads(cli("--db", db_target, "schedule", "show", "nightly", "--json").stdout)
    assert shown["schedule"]["status"] == "active"
    assert cli("--db", db_target, "schedule", "rm", "nightly").returncode == 0
    assert json.loads(cli("--db", db_target, "schedule", "ls", "--json").stdout) == {
        "schedules": []}
    every = json.loads(cli("--db", db_target, "schedule", "ls", "--all", "--json").stdout)
    assert [s["status"] for s in every["schedules"]] == ["retired"]
    missing = cli("--db", db_target, "schedule", "show", "nope")
    assert missing.returncode == 1 and "no schedule 'nope'" in missing.stderr


def test_refusals_exit_2_and_write_nothing(db_target: str) -> None:
    for args, message in (
            (["--cron", "61 * * * *"], "cron expression '61 * * * *' is invalid: Bad minute"),
            (["--cron", "0 2 * * *", "--tz", "Mars/Olympus"], "unknown timezone 'Mars/Olympus'"),
            (["--every", "soon"], "every 'soon' is not an interval"),
            ([], "exactly one of cron")):
        done = cli("--db", db_target, "schedule", "add", "x", *args, "--", "true")
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr
    listed = cli("--db", db_target, "schedule", "ls", "--all", "--json")
    assert json.loads(listed.stdout) == {"schedules": []}
