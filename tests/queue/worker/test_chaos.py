"""Chaos: four worker processes on one database file, one SIGKILLed about every 0.5 s.

Each worker (tests/helpers/runtime_worker.py --markers) runs every task by appending a
line to a shared marker file (O_APPEND, fsync) before reporting success. A killed
worker is restarted at once under a new id; its leases are short, so the survivors'
reapers return its runs to the queue within the test. Afterwards:

* every task is terminal, and no run has two terminal facts;
* a run executed more than once (several marker lines) has, between its runs, a
  lease-expiry (or shutdown) requeue in its history; every marker belongs to a claim
  of the worker that wrote it, and the worker that completed a run executed it;
* runs with the same concurrency key never executed at the same time, across processes;
* ``verify()`` finds no drift.

It runs on a SQLite file, on PostgreSQL, and on PostgreSQL through PgBouncer in
transaction mode (the workers' LISTEN on the server itself).

Size: LEDGERQ_CHAOS_TASKS (default 2000; half through PgBouncer, which adds no path of
its own past the first thousand); LEDGERQ_CHAOS_TIMEOUT seconds (default 90)
bounds the run. CI runs the default size in well under two minutes.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from helpers import pgbouncer
from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, submit_many

pytestmark = pytest.mark.chaos

HELPER = Path(__file__).resolve().parents[2] / "helpers" / "runtime_worker.py"
TASKS = int(os.environ.get("LEDGERQ_CHAOS_TASKS", "2000"))
TIMEOUT = float(os.environ.get("LEDGERQ_CHAOS_TIMEOUT", "90"))
WORKERS = 4
LEASE_TTL = 1.5
KILL_EVERY = 0.5
#: Each run takes up to HOLD seconds, so a killed worker leaves runs in flight.
HOLD = 0.1
#: One task in KEYED_EVERY carries a serialization key (one of KEY_HOSTS hosts).
KEYED_EVERY = 25
KEY_HOSTS = 4
TERMINAL = ("completed", "failed", "timed_out", "skipped", "cancelled")
REQUEUES = ("run.queued.lease_expired", "run.queued.worker_shutdown")


@pytest.fixture(params=["sqlite", "postgresql", "pgbouncer"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Fleet:
    def __init__(self, db: str, lock_dir: Path, markers: Path, log_dir: Path) -> None:
        self.db, self.lock_dir, self.markers, self.log_dir = db, lock_dir, markers, log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ids: list[str] = []
        self.live_ids: list[str] = []
        self.kills = 0

    def spawn(self) -> tuple[subprocess.Popen[bytes], str]:
        wid = f"host:{secrets.token_hex(4)}"
        log = open(self.log_dir / f"{wid.replace(':', '_')}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, str(HELPER), "--db", str(self.db), "--worker-id", wid,
             "--lock-dir", str(self.lock_dir), "--markers", str(self.markers),
             "--hold", str(HOLD), "--keyed-hold", "0.01", "--capacity", "8",
             "--poll-interval", "0.05", "--lease-ttl", str(LEASE_TTL), "--check-interval", "0.25",
             "--shutdown-grace", "2", "--advertise", "gpu-exclusive",
             *(f"--{k.replace('_', '-')}={v}" for k, v in pgbouncer.options(self.db).items())],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.ids.append(wid)
        return proc, wid

    def start(self) -> None:
        spawned = [self.spawn() for _ in range(WORKERS)]
        self.procs = [p for p, _ in spawned]
        self.live_ids = [w for _, w in spawned]

    def kill_one(self, rng: random.Random) -> None:
        i = rng.randrange(len(self.procs))
        victim = self.procs[i]
        if victim.poll() is None:
            victim.kill()
            self.kills += 1
        victim.wait(10)
        self.procs[i], self.live_ids[i] = self.spawn()

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    def crashed(self) -> str:
        """The logs of workers that exited although nobody killed them."""
        out = []
        for p, wid in zip(self.procs, self.live_ids, strict=True):
            if p.poll() is not None:
                log = self.log_dir / f"{wid.replace(':', '_')}.log"
                out.append(f"{wid} exited {p.returncode}:\n{log.read_text()[-3000:]}")
        return "\n".join(out)


def read_markers(path: Path) -> list[tuple[str, str, float, float, str]]:
    """The marker lines. A worker killed inside its marker's write can leave the start of
    a line (its run then never reported success), which the next worker's whole line
    follows: a run id is the last 36 characters of its field."""
    out = []
    for line in path.read_text().splitlines():
        rid, wid, start, end, key = line.split()
        out.append((rid[-36:], wid, float(start), float(end), key))
    return out


async def test_workers_killed_at_random_lose_and_duplicate_nothing(
        tmp_path: Path, db_target: str, backend: str) -> None:
    tasks = TASKS // 2 if backend == "pgbouncer" else TASKS
    db_path = db_target
    markers = tmp_path / "markers"
    markers.touch()
    logs = tmp_path / "logs"
    logs.mkdir()
    rng = random.Random(int(os.environ.get("LEDGERQ_CHAOS_SEED", str(time.time_ns()))))
    fleet = Fleet(db_path, tmp_path / "locks", markers, logs)
    t0 = time.monotonic()
    async with StateDB(db_path, **pgbouncer.options(db_path)) as db:
        apps = []
        for i in range(tasks):
            caps = ["gpu-exclusive"] if i % KEYED_EVERY == 0 else []
            apps.append((i % KEY_HOSTS, TaskApplication("agent", {"n": i}, "host",
                                                        required_capabilities=caps)))
        ids: list[str] = []
        for host in range(KEY_HOSTS):  # the host scopes the concurrency key
            ids += await submit_many(db, [a for h, a in apps if h == host], host=f"h{host}")
        assert len(ids) == tasks

        fleet.start()
        try:
            done = False
            next_kill = time.monotonic() + KILL_EVERY
            while time.monotonic() - t0 < TIMEOUT:
                await asyncio.sleep(0.1)
                crashed = fleet.crashed()
                assert not crashed, f"a worker exited on its own:\n{crashed}"
                if time.monotonic() >= next_kill:
                    await asyncio.to_thread(fleet.kill_one, rng)
                    next_kill = time.monotonic() + rng.uniform(0.6, 1.4) * KILL_EVERY
                left = await db.fetch_one(
                    "SELECT COUNT(*) AS n FROM schedule_runs WHERE status NOT IN "
                    f"({', '.join('?' * len(TERMINAL))})", TERMINAL)
                assert left is not None
                if left["n"] == 0:
                    done = True
                    break
        finally:
            await asyncio.to_thread(fleet.stop)
        elapsed = time.monotonic() - t0
        counts = {r["status"]: r["n"] for r in await db.fetch_all(
            "SELECT status, COUNT(*) AS n FROM schedule_runs GROUP BY status")}
        assert done, f"not all tasks terminal after {elapsed:.0f}s: {counts}"

        # ---- every task terminal, none twice
        assert set(counts) <= set(TERMINAL), counts
        assert sum(counts.values()) == tasks
        doubles = await db.fetch_all(
            "SELECT entity_id, COUNT(*) AS n FROM status_transitions WHERE status IN "
            f"({', '.join('?' * len(TERMINAL))}) GROUP BY entity_id HAVING COUNT(*) > 1", TERMINAL)
        assert doubles == []

        # ---- histories against markers
        history: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for f in await db.fetch_all(
                "SELECT entity_id, previous_status, status, reason_code, actor "
                "FROM status_transitions ORDER BY entity_id, entity_version"):
            history[f["entity_id"]].append(f)
        assert set(history) == set(ids)
        runs = read_markers(markers)
        by_run: dict[str, list[tuple[str, str, float, float, str]]] = defaultdict(list)
        for m in runs:
            by_run[m[0]].append(m)
        assert set(by_run) <= set(ids)
        requeued_total = 0
        for rid in ids:
            hist = history[rid]
            claims = Counter(f["actor"] for f in hist
                             if f["previous_status"] == "queued" and f["status"] == "running")
            requeues = [f for f in hist if f["previous_status"] is not None
                        and f["status"] == "queued"]
            assert all(f["reason_code"] in REQUEUES for f in requeues), hist
            requeued_total += len(requeues)
            mine = by_run.get(rid, [])
            if len(mine) > 1:
                assert len(requeues) >= len(mine) - 1, (rid, mine, hist)
            # every execution belongs to a claim by the worker that executed it
            executed = Counter(m[1] for m in mine)
            assert all(executed[w] <= claims[w] for w in executed), (rid, mine, hist)
            last = hist[-1]
            if last["status"] == "completed":
                assert executed[last["actor"]] >= 1, (rid, mine, hist)
            else:
                assert last["reason_code"] == "run.failed.lease_attempts_exhausted", hist

        # ---- equal keys never ran at the same time
        keyed: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for _, _, start, end, key in runs:
            if key != "-":
                keyed[key].append((start, end))
        assert set(keyed) == {f"h{h}:gpu-exclusive" for h in range(KEY_HOSTS)}
        for key, spans in keyed.items():
            spans.sort()
            for a, b in itertools.pairwise(spans):
                assert a[1] <= b[0], f"{key}: {a} overlaps {b}"

        report = await verify(db)
        assert report.ok, [str(d) for d in report.drift[:20]]

    print(f"\nchaos: {tasks} tasks in {elapsed:.1f}s, {fleet.kills} kills, "
          f"{len(fleet.ids)} worker processes, {requeued_total} requeues, "
          f"{len(runs) - len(by_run)} repeated executions, outcomes {counts}")
    assert fleet.kills >= min(5, int(elapsed / KILL_EVERY) // 2)
