"""Forty worker processes and two submitters on one PostgreSQL server with its default
100 connections: 4,000 tasks drained, no connection refused, and every process within its
connection budget (a worker at most 3 with its LISTEN one, a submitter at most 2),
sampled from ``pg_stat_activity`` by each process's ``application_name``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from ledgerq import StateDB

#: The server restarts of other serial tests would cut these processes' connections, and
#: forty processes would crowd the parallel part: run alone.
pytestmark = [pytest.mark.serial, pytest.mark.slow]

WORKERS = 40
SUBMITTERS = 2
TASKS = 4_000

APP = '''
import asyncio
import os

from ledgerq import App

app = App(os.environ["LEDGERQ_DB"])


@app.task(name="noop.run")
async def run(i: int) -> None:
    await asyncio.sleep(0.05)  # a worker's four runs end together: its writes overlap
'''

SUBMIT = '''
import asyncio
import sys

from ledgerq import StateDB
from ledgerq.queue import TaskApplication, submit_many


async def main(url: str, first: int, count: int) -> None:
    async with StateDB(url, pool_size=1) as db:
        for start in range(first, first + count, 500):
            await submit_many(db, [TaskApplication(action_kind="noop.run", args={"i": i})
                                   for i in range(start, min(start + 500, first + count))])


asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
'''


def named(url: str, name: str) -> str:
    return url + ("&" if "?" in url else "?") + f"application_name={name}"


class Peaks(threading.Thread):
    """Connections to the test's database per application_name, sampled every 50 ms."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.stop = url, threading.Event()
        self.peak: dict[str, int] = {}
        self.total = 0

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(0.05):
                rows = conn.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "GROUP BY 1").fetchall()
                for name, count in rows:
                    self.peak[name] = max(self.peak.get(name, 0), count)
                self.total = max(self.total, sum(c for _, c in rows))


async def test_forty_workers_and_submitters_fit_in_a_default_server(pg_target: str,
                                                                    tmp_path: Path) -> None:
    with psycopg.connect(pg_target) as conn:
        assert conn.execute("SHOW max_connections").fetchone() == ("100",)
    async with StateDB(pg_target):  # the schema, made once
        pass
    (tmp_path / "noop_tasks.py").write_text(APP, encoding="utf-8")
    (tmp_path / "submit.py").write_text(SUBMIT, encoding="utf-8")
    env = {**os.environ, "LEDGERQ_DB": pg_target,
           "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    peaks = Peaks(pg_target)
    peaks.start()
    workers = [subprocess.Popen(
        [sys.executable, "-m", "ledgerq", "worker", "--app", "noop_tasks:app",
         "--db", named(pg_target, f"w{i}"), "--capacity", "4", "--quiet",
         "--worker-id", f"w{i}", "--poll-interval", "0.5", "--no-scheduler",
         "--lock-dir", str(tmp_path / "locks")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for i in range(WORKERS)]
    submitters: list[subprocess.Popen[str]] = []
    try:
        deadline = time.monotonic() + 240
        with psycopg.connect(pg_target, autocommit=True) as conn:
            while conn.execute("SELECT count(*) FROM task_kinds").fetchone() != (1,):
                assert time.monotonic() < deadline, "no worker recorded the app's task"
                time.sleep(0.2)
            share = TASKS // SUBMITTERS
            submitters = [subprocess.Popen(
                [sys.executable, "submit.py", named(pg_target, f"s{j}"), str(j * share),
                 str(share)], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
                for j in range(SUBMITTERS)]
            for s in submitters:
                _, err = s.communicate(timeout=240)
                assert s.returncode == 0, err
            while (done := conn.execute(
                    "SELECT count(*) FROM schedule_runs WHERE status = 'completed'"
            ).fetchone()[0]) < TASKS:
                assert time.monotonic() < deadline, f"{done} of {TASKS} drained"
                time.sleep(0.2)
            statuses = dict(conn.execute(
                "SELECT status, count(*) FROM schedule_runs GROUP BY 1").fetchall())
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        errors = [w.communicate(timeout=60)[1] for w in workers]
        peaks.stop.set()
        peaks.join(timeout=10)
    assert statuses == {"completed": TASKS}
    refused = [e for e in errors if "too many clients" in e or "connection slots" in e]
    assert refused == []
    worker_peaks = {n: c for n, c in peaks.peak.items() if n.startswith("w")}
    assert len(worker_peaks) == WORKERS
    assert max(worker_peaks.values()) <= 3, worker_peaks
    assert max(c for n, c in peaks.peak.items() if n.startswith("s")) <= 2, peaks.peak
    assert peaks.total <= 100
    print(f"peaks: workers {max(worker_peaks.values())}, submitters "
          f"{max(c for n, c in peaks.peak.items() if n.startswith('s'))}, total "
          f"{peaks.total}")
