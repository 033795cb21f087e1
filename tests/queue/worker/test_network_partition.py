"""A network partition: one worker host cut off from PostgreSQL for longer than its leases.

Everything here is real: a private PostgreSQL server (tests/helpers/pgcluster.py), and
three worker hosts, each a network namespace joined to the server's by its own veth
pair, each running a worker process (tests/helpers/runtime_worker.py --markers: every
execution appends a line to a marker file the namespaces share). While the workers
drain a few hundred tasks, one host is cut off for three lease TTLs with runs of its
own in flight, then joined again. Two kinds of cut:

* ``link-down``: its link is taken down. The host's kernel sees the carrier go, drops
  what it sends at once and retries every half second, so its connections resume as
  soon as the link is back.
* ``packets-dropped``: its packets vanish on arrival, both ways, and every link stays
  up (what a failed switch or a cloud network's partition does). Nothing on either side
  is told; TCP retransmits with exponential backoff, so a connection resumes only at its
  next retransmission after the cut ends: within a second or so after a cut of seconds,
  ~7 s after a 20 s cut, ~10 s after a 45 s one (LEDGERQ_PARTITION_SECONDS). Nothing
  times out meanwhile: ledgerq sets no TCP keepalive or user timeout of its own.

What must happen, and is checked afterwards:

* the other two hosts keep working, and their reapers give the cut host's runs back to
  the queue once their leases expire (``run.queued.lease_expired``) and run them;
* the cut host's runs in flight end while it is cut off (the executor needs no
  database): their terminal writes wait, reach the server once the host is back, and
  are refused by the lease guard (the lease token and expiry its claim gave it); the
  cut worker says so in its log for every run it lost, and no fact about a running run
  is ever written by a worker other than the one whose claim the run is under;
* every task ends terminal, none lost, none with two terminal facts; a run executed
  more than once (several marker lines) has a lease-expiry requeue between the claims
  of its executions; ``verify()`` finds no drift;
* and the scenario did happen: the cut host executed runs that another host then ran
  again after their leases expired, and late writes of it were refused.

The cut starts just after one of the workers' lease checks (they fall on multiples of
the check interval on the machine's monotonic clock, which every namespace shares), and
runs are shorter than the time to the next check: each run in flight at the cut ends
before its supervisor looks at the lease again, so its outcome is a write sent into the
partition, not a check that finds the lease gone. (Runs that short are never renewed:
a renewal is due after a third of the TTL.)

A one-line summary of the figures is printed (``-s`` shows it). Needs root and
``ip netns``: skipped otherwise, unless LEDGERQ_REQUIRE_NETNS=1 (then it fails).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers import pgcluster
from ledgerq import StateDB
from ledgerq.projections import verify
from ledgerq.queue import TaskApplication, submit_many

#: It makes network namespaces, IPsec policies and a server of its own, and wants the
#: machine's cores: run alone.
pytestmark = [pytest.mark.serial, pytest.mark.slow]

HELPER = Path(__file__).resolve().parents[2] / "helpers" / "runtime_worker.py"
TASKS = 600
HOSTS = 3
LEASE_TTL = 2.0
#: The workers' lease checks (and their keepers' renewal passes).
CHECK_INTERVAL = 0.5
#: How long the host stays cut off: well past its leases' expiry.
CUT_FOR = float(os.environ.get("LEDGERQ_PARTITION_SECONDS", str(3 * LEASE_TTL)))
#: The cut starts this long after a lease check.
CUT_PHASE = 0.1
#: A run takes up to HOLD seconds (uniformly): the cut host always has runs in flight,
#: and each ends before the next lease check after the cut (and before a renewal is due).
HOLD = 0.35
CAPACITY = 4
#: The cut comes once the workers have run this long and the cut host holds leases.
WARMUP = 2.0
#: From the workers' start until every task is terminal and the cut worker heard back.
TIMEOUT = WARMUP + CUT_FOR + 40
TERMINAL = ("completed", "failed", "timed_out", "skipped", "cancelled")
LEASE_EXPIRED = "run.queued.lease_expired"
#: What a worker writes about a run under another's claim: the reaper's moves.
REAPER_CODES = (LEASE_EXPIRED, "run.failed.lease_attempts_exhausted")
#: runtime_worker.py as it is, with the worker's INFO log on (runs started and ended, a
#: lease lost, a write refused), each line stamped with the time.
WITH_LOG = ("import logging, runpy, sys; "
            "logging.basicConfig(level=logging.INFO, stream=sys.stdout, "
            "format='%(created).6f %(levelname)s %(name)s %(message)s'); "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")
#: The worker's log lines that say it let a run go: its write refused by the guard, or a
#: check (or renewal) that found the lease gone before it wrote.
REFUSED = re.compile(r"^(\S+) \S+ \S+ run (\S+): write of (\S+) conflicted \(lease no longer")
LOST = re.compile(r"^(\S+) \S+ \S+ run (\S+): lease lost \((.*)\); child stopped")


def netns_problem(how: str) -> str | None:
    """Why this test cannot cut a host off ``how`` here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth pairs, IPsec policies)"
    if shutil.which("ip") is None:
        return "no ip command (iproute2)"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                           check=False)
    if probe.returncode != 0:
        return f"ip netns unavailable: {probe.stderr.strip()}"
    if how == "packets-dropped":
        probe = subprocess.run(["ip", "xfrm", "policy", "list"], capture_output=True,
                               text=True, check=False)
        if probe.returncode != 0:
            return f"no IPsec policies in this kernel (ip xfrm): {probe.stderr.strip()}"
    return pgcluster.unavailable()


def require_netns(how: str) -> None:
    problem = netns_problem(how)
    if problem is None:
        return
    if os.environ.get("LEDGERQ_REQUIRE_NETNS") == "1":
        pytest.fail(f"network namespaces are required (LEDGERQ_REQUIRE_NETNS=1): {problem}")
    pytest.skip(f"network partition test: {problem}")


def ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def ip_quietly(*args: str) -> None:
    """``ip`` for teardown: what is already gone is no failure."""
    subprocess.run(["ip", *args], capture_output=True, check=False)


@dataclass
class Host:
    """A worker host: a network namespace, joined to the root one by a veth pair."""

    ns: str
    #: The veth end in the root namespace, and the namespace's own.
    outer: str
    inner: str
    subnet: str

    @property
    def gateway(self) -> str:
        """The root side's address: where this host reaches the server."""
        return f"{self.subnet}.1"

    @property
    def address(self) -> str:
        return f"{self.subnet}.2"

    def cut(self, how: str) -> None:
        if how == "link-down":
            ip("link", "set", self.outer, "down")
        else:
            ip(*self.policy(self.address, self.gateway, "add"))
            ip("-n", self.ns, *self.policy(self.gateway, self.address, "add"))

    def mend(self, how: str) -> None:
        if how == "link-down":
            ip("link", "set", self.outer, "up")
        else:
            ip(*self.policy(self.address, self.gateway, "delete"))
            ip("-n", self.ns, *self.policy(self.gateway, self.address, "delete"))

    @staticmethod
    def policy(src: str, dst: str, verb: str) -> tuple[str, ...]:
        """An IPsec policy that drops what ``src`` sends ``dst`` when it arrives, silently
        (a routing rule would not do: an established connection's packets skip the
        routing of arrivals, and a sender refused a route is told so)."""
        action = ("action", "block") if verb == "add" else ()
        return ("xfrm", "policy", verb, "src", f"{src}/32", "dst", f"{dst}/32", "dir", "in",
                *action)


@contextmanager
def network(count: int) -> Iterator[list[Host]]:
    """``count`` hosts, named after this process; all removed on leaving, with any
    policy a cut left."""
    tag = os.getpid()
    base = 1 + (tag % 80) * count
    hosts = [Host(f"lq{tag}h{i}", f"lq{tag}r{i}", f"lq{tag}n{i}", f"10.231.{base + i}")
             for i in range(count)]
    made: list[Host] = []
    try:
        for h in hosts:
            made.append(h)
            ip("netns", "add", h.ns)
            ip("link", "add", h.outer, "type", "veth", "peer", "name", h.inner,
               "netns", h.ns)
            ip("addr", "add", f"{h.gateway}/24", "dev", h.outer)
            ip("link", "set", h.outer, "up")
            ip("-n", h.ns, "addr", "add", f"{h.address}/24", "dev", h.inner)
            ip("-n", h.ns, "link", "set", h.inner, "up")
            ip("-n", h.ns, "link", "set", "lo", "up")
            # A link that is down has no route: the server's packets to its host are then
            # dropped here, not sent out by the default route.
            ip("route", "add", "blackhole", f"{h.subnet}.0/24", "metric", "4242")
        yield hosts
    finally:
        for h in made:
            ip_quietly(*h.policy(h.address, h.gateway, "delete"))
            ip_quietly("route", "del", "blackhole", f"{h.subnet}.0/24", "metric", "4242")
            ip_quietly("link", "del", h.outer)
            ip_quietly("netns", "del", h.ns)


@dataclass
class Worker:
    wid: str
    host: Host
    log: Path
    proc: subprocess.Popen[bytes]


def spawn(wid: str, host: Host, url: str, tmp: Path) -> Worker:
    """A worker process in ``host``'s namespace, its log in ``tmp``."""
    log = tmp / f"{wid}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.ns, sys.executable, "-c", WITH_LOG, str(HELPER),
             "--db", url, "--worker-id", wid, "--lock-dir", str(tmp / "locks"),
             "--markers", str(tmp / "markers"), "--hold", str(HOLD),
             "--capacity", str(CAPACITY), "--poll-interval", "0.05",
             "--lease-ttl", str(LEASE_TTL), "--check-interval", str(CHECK_INTERVAL),
             "--shutdown-grace", "2"],
            stdout=out, stderr=subprocess.STDOUT)
    return Worker(wid, host, log, proc)


def stop(workers: list[Worker]) -> None:
    for w in workers:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 15
    for w in workers:
        try:
            w.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait(10)


def exited(workers: list[Worker]) -> str:
    """The logs of workers that exited (none should before they are stopped)."""
    return "\n".join(f"{w.wid} exited {w.proc.returncode}:\n{w.log.read_text()[-3000:]}"
                     for w in workers if w.proc.poll() is not None)


def let_go(log: Path) -> dict[str, tuple[float, bool]]:
    """The runs a worker's log says it let go: run id -> (when, whether it was a write
    the guard refused, rather than a check that found the lease gone)."""
    out: dict[str, tuple[float, bool]] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = REFUSED.match(line) or LOST.match(line)
        if m:
            out.setdefault(m.group(2), (float(m.group(1)), m.re is REFUSED))
    return out


def read_markers(path: Path) -> list[tuple[str, str, float, float]]:
    out = []
    for line in path.read_text().splitlines():
        rid, wid, start, end, _key = line.split()
        out.append((rid, wid, float(start), float(end)))
    return out


async def unfinished(db: StateDB) -> int:
    left = await db.fetch_one(
        "SELECT COUNT(*) AS n FROM schedule_runs WHERE status NOT IN "
        f"({', '.join('?' * len(TERMINAL))})", TERMINAL)
    assert left is not None
    return int(left["n"])


async def ended_twice(db: StateDB) -> list[str]:
    """Runs with more than one terminal fact (there must be none)."""
    rows = await db.fetch_all(
        "SELECT entity_id FROM status_transitions WHERE status IN "
        f"({', '.join('?' * len(TERMINAL))}) GROUP BY entity_id HAVING COUNT(*) > 1",
        TERMINAL)
    return [r["entity_id"] for r in rows]


async def histories(db: StateDB) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in await db.fetch_all(
            "SELECT entity_id, previous_status, status, reason_code, actor, created_at "
            "FROM status_transitions ORDER BY entity_id, entity_version"):
        out[f["entity_id"]].append(f)
    return out


def is_claim(fact: dict[str, Any]) -> bool:
    return bool(fact["previous_status"] == "queued" and fact["status"] == "running")


def taken_from(history: dict[str, list[dict[str, Any]]], wid: str) -> set[str]:
    """Runs a claim of ``wid`` held until the reaper gave them back to the queue."""
    out = set()
    for rid, hist in history.items():
        holder = None
        for f in hist:
            if is_claim(f):
                holder = f["actor"]
            elif f["reason_code"] == LEASE_EXPIRED and holder == wid:
                out.add(rid)
    return out


async def cut_after_a_check(host: Host, how: str) -> None:
    """Cut ``host`` off :data:`CUT_PHASE` after the workers' next lease check."""
    phase = time.monotonic() % CHECK_INTERVAL
    await asyncio.sleep((CUT_PHASE - phase) % CHECK_INTERVAL)
    host.cut(how)


@pytest.mark.parametrize("how", ["link-down", "packets-dropped"])
async def test_a_host_cut_off_loses_its_runs_and_its_late_writes_are_refused(
        tmp_path: Path, how: str) -> None:
    require_netns(how)
    (tmp_path / "markers").touch()
    t0 = time.monotonic()
    with network(HOSTS) as hosts, pgcluster.clusters("ledgerq-partition-") as pgs:
        server = pgs.initdb(listen=",".join(["127.0.0.1", *(h.gateway for h in hosts)]),
                            hba=[f"host all all {h.subnet}.0/24 trust" for h in hosts])
        server.start()
        async with StateDB(server.url()) as db:
            ids = await submit_many(db, [TaskApplication("agent", {"n": i}, "host")
                                         for i in range(TASKS)])
            assert len(ids) == TASKS
            workers: list[Worker] = []
            started = time.monotonic()
            try:
                for i, h in enumerate(hosts):
                    url = f"postgresql://postgres@{h.gateway}:{server.port}/postgres"
                    workers.append(spawn(f"host{i}-{os.getpid()}", h, url, tmp_path))
                cut = workers[0]
                # ---- cut the host off once it holds leases
                while True:
                    await asyncio.sleep(0.05)
                    assert not exited(workers), exited(workers)
                    held = await db.fetch_all(
                        "SELECT id FROM schedule_runs WHERE status = 'running' "
                        "AND leased_by = ?", (cut.wid,))
                    if time.monotonic() - started >= WARMUP and len(held) >= 2:
                        break
                    assert time.monotonic() - started < TIMEOUT, "the cut host never ran"
                await cut_after_a_check(cut.host, how)
                left_at_cut = await unfinished(db)
                await asyncio.sleep(CUT_FOR)
                cut.host.mend(how)
                mended_at = time.time()
                left_at_mend = await unfinished(db)
                # ---- drain, and wait for the cut worker to hear back about its runs
                while True:
                    await asyncio.sleep(0.1)
                    assert not exited(workers), exited(workers)
                    lost = taken_from(await histories(db), cut.wid)
                    heard = let_go(cut.log)
                    if await unfinished(db) == 0 and lost <= set(heard):
                        break
                    assert time.monotonic() - started < TIMEOUT, (
                        f"not over after {TIMEOUT:g}s: {await unfinished(db)} runs not "
                        f"terminal; runs the cut worker lost and never let go: "
                        f"{sorted(lost - set(heard))}\n{cut.log.read_text()[-3000:]}")
            finally:
                await asyncio.to_thread(stop, workers)
            elapsed = time.monotonic() - started

            # ---- every task terminal, none twice
            counts = {r["status"]: r["n"] for r in await db.fetch_all(
                "SELECT status, COUNT(*) AS n FROM schedule_runs GROUP BY status")}
            assert set(counts) <= set(TERMINAL), counts
            assert sum(counts.values()) == TASKS
            assert await ended_twice(db) == []

            # ---- histories against markers
            history = await histories(db)
            assert set(history) == set(ids)
            markers = read_markers(tmp_path / "markers")
            by_run: dict[str, list[tuple[str, str, float, float]]] = defaultdict(list)
            for m in markers:
                by_run[m[0]].append(m)
            assert set(by_run) <= set(ids)
            wids = {w.wid for w in workers}
            foreign: list[tuple[str, dict[str, Any]]] = []
            run_again: set[str] = set()
            for rid in ids:
                hist = history[rid]
                # The k-th execution of a worker belongs to its k-th claim of the run.
                claims: dict[str, list[int]] = defaultdict(list)
                for i, f in enumerate(hist):
                    if is_claim(f):
                        claims[f["actor"]].append(i)
                seen: Counter[str] = Counter()
                executions: list[tuple[int, str]] = []
                for _, wid, _, _ in sorted(by_run.get(rid, []), key=lambda m: m[2]):
                    assert seen[wid] < len(claims[wid]), (rid, by_run[rid], hist)
                    executions.append((claims[wid][seen[wid]], wid))
                    seen[wid] += 1
                executions.sort()
                # Between the claims of two executions, the first's lease expired.
                for (a, _), (b, _) in itertools.pairwise(executions):
                    assert LEASE_EXPIRED in [f["reason_code"] for f in hist[a + 1:b]], \
                        (rid, by_run[rid], hist)
                if any(x == cut.wid and y != cut.wid
                       for (_, x), (_, y) in itertools.pairwise(executions)):
                    run_again.add(rid)
                # The fence: a worker's write about a running run (a renewal, an outcome;
                # the reaper's aside) is by the worker whose claim the run is under.
                holder = None
                for f in hist:
                    if is_claim(f):
                        holder = f["actor"]
                    elif f["previous_status"] == "running" and f["actor"] in wids \
                            and f["reason_code"] not in REAPER_CODES and f["actor"] != holder:
                        foreign.append((rid, f))
            assert foreign == []
            report = await verify(db)
            assert report.ok, [str(d) for d in report.drift[:20]]

    lost = taken_from(history, cut.wid)
    heard = let_go(cut.log)
    refused = [rid for rid, (_, write) in heard.items() if write]
    back = min((when for when, _ in heard.values()), default=mended_at) - mended_at
    print(f"\nnetwork partition ({how}): {TASKS} tasks, 1 of {HOSTS} worker hosts cut off "
          f"for {CUT_FOR:g}s (lease TTL {LEASE_TTL:g}s; {left_at_cut} tasks left at the "
          f"cut, {left_at_mend} when it ended), {len(lost)} runs taken over from it, "
          f"{len(markers) - len(by_run)} duplicate executions ({len(run_again)} of its runs "
          f"run again elsewhere), {len(refused)} late terminal writes refused, its worker "
          f"heard back {back:.2f}s after the cut ended; {elapsed:.1f}s "
          f"(test {time.monotonic() - t0:.1f}s)")
    assert lost, "the cut host lost no run to the reaper: the partition did not happen"
    assert run_again, "no run the cut host executed was run again by another host"
    assert refused, f"no late write of the cut host was refused:\n{cut.log.read_text()[-3000:]}"
    assert lost <= set(heard)


MIDWRITE = Path(__file__).resolve().parents[2] / "helpers" / "midwrite_worker.py"
#: The tasks the other workers drain while the host is cut off mid-write.
DRAINED = 400
#: The cut host's lock timeout: how long the server lets its session sit idle inside the
#: cut-off transaction (the other workers keep the default, 30 s).
MIDWRITE_TIMEOUT_MS = 3000
#: Longer than the cut host's lock timeout and its lease, shorter than the others' lock
#: timeout: a fleet that waited for the held row would not drain within it.
MIDWRITE_CUT = 15.0


async def test_a_host_cut_off_mid_write_does_not_stall_the_others(tmp_path: Path) -> None:
    """Cut off between a run's UPDATE and its COMMIT, a worker leaves the server an open
    transaction holding that run's row lock. The other workers neither wait for it (their
    reapers leave the locked row for a later pass) nor does the lock outlast the cut
    host's lock timeout (the server ends its session idle in a transaction): they drain
    everything while the host is still cut off, the held run included, taken over after
    its lease expired; the cut host's write fails, its outcome never committed."""
    how = "packets-dropped"
    require_netns(how)
    (tmp_path / "markers").touch()
    flag = tmp_path / "flag"
    with network(1) as (host,), pgcluster.clusters("ledgerq-midwrite-") as pgs:
        server = pgs.initdb(listen=f"127.0.0.1,{host.gateway}",
                            hba=[f"host all all {host.subnet}.0/24 trust"])
        server.start()
        async with StateDB(server.url()) as db:
            [held] = await submit_many(db, [TaskApplication("agent", {"held": True}, "host")])
            with open(tmp_path / "midwrite.log", "wb") as out:
                cut = subprocess.Popen(
                    ["ip", "netns", "exec", host.ns, sys.executable, str(MIDWRITE), "--db",
                     f"postgresql://postgres@{host.gateway}:{server.port}/postgres",
                     "--worker-id", "cut-off", "--flag", str(flag), "--lease-ttl",
                     str(LEASE_TTL), "--busy-timeout-ms", str(MIDWRITE_TIMEOUT_MS)],
                    stdout=out, stderr=subprocess.STDOUT)
            others: list[subprocess.Popen[bytes]] = []
            try:
                while not flag.exists():
                    assert cut.poll() is None, (tmp_path / "midwrite.log").read_text()
                    await asyncio.sleep(0.01)
                host.cut(how)
                cut_at = time.monotonic()
                await submit_many(db, [TaskApplication("agent", {"n": i}, "host")
                                       for i in range(DRAINED)])
                for i in range(2):
                    with open(tmp_path / f"ok{i}.log", "wb") as out:
                        others.append(subprocess.Popen(
                            [sys.executable, "-c", WITH_LOG, str(HELPER), "--db", server.url(),
                             "--worker-id", f"ok{i}", "--lock-dir", str(tmp_path / "locks"),
                             "--markers", str(tmp_path / "markers"), "--hold", "0.05",
                             "--capacity", str(CAPACITY), "--lease-ttl", str(LEASE_TTL),
                             "--check-interval", str(CHECK_INTERVAL)],
                            stdout=out, stderr=subprocess.STDOUT))
                while await unfinished(db) and time.monotonic() - cut_at < MIDWRITE_CUT:
                    await asyncio.sleep(0.1)
                drained_in = time.monotonic() - cut_at
                left = await unfinished(db)
                host.mend(how)
                assert left == 0, (
                    f"{left} runs not terminal {MIDWRITE_CUT:g}s into the cut: the fleet "
                    "waited for the cut host's lock")
                await asyncio.to_thread(cut.wait, 60)
            finally:

                for p in others:
                    p.terminate()
                for p in [*others, cut]:
                    try:
                        p.wait(15)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait(10)
            said = (tmp_path / "midwrite.log").read_text()
            assert "write raised" in said, said
            history = (await histories(db))[held]
            assert [(f["status"], f["actor"]) for f in history] == [
                ("queued", "ledgerq.submit"), ("running", "cut-off"), ("queued", "ledgerq"),
                ("running", history[3]["actor"]), ("completed", history[3]["actor"])], history
            taken_over = history[2]["created_at"] - history[1]["created_at"]
            assert await ended_twice(db) == []
            report = await verify(db)
            assert report.ok, [str(d) for d in report.drift[:20]]
    print(f"\nnetwork partition (mid-write, {how}): the cut host's run taken over "
          f"{taken_over:.1f}s after its claim (lease TTL {LEASE_TTL:g}s, its session ended "
          f"after {MIDWRITE_TIMEOUT_MS / 1000:g}s idle); the other 2 workers drained "
          f"{DRAINED + 1} runs {drained_in:.1f}s into a {MIDWRITE_CUT:g}s cut; "
          f"the cut host's write: {said.strip().splitlines()[-1][:120]}")
