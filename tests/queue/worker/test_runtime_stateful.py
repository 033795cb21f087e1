"""A hypothesis state machine over the worker API, with a controlled clock.

Three workers submit, claim, renew, finish, cancel, reap and promote against a real
SQLite file, every call with an explicit ``now``. The machine keeps a model of every
row and of the leases each worker *believes* it holds; a belief goes stale when its
lease is reaped, cancelled, ended or replaced, and stale beliefs keep being used. The
invariants after every step:

* the database matches the model (status, lease, attempts, retry due time);
* a running row has exactly one live lease (one belief matches it); no row has two;
* a write guarded on a stale belief never applies, and writes nothing;
* a terminal row never moves again, and no run has two terminal facts;
* at most one run per concurrency key is running;
* a claim takes exactly the head of the claim order: of the queued rows in the
  worker's queues, highest priority first, then oldest, one per concurrency key and
  none whose key is running (so never a row of another queue, nor a delayed one);
* ``verify()`` finds no drift.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import ledgerq.queue.submission.submit as submit_module
from helpers import pg
from ledgerq import StateDB
from ledgerq.lifecycle import Actor, StateReason, TransitionRequest, transition
from ledgerq.lifecycle.engine import new_id
from ledgerq.projections import verify
from ledgerq.queue import (
    MAX_LEASE_ATTEMPTS,
    RetryPolicy,
    TaskApplication,
    cancel_task,
    claim_runs,
    promote_due,
    reap_expired_leases,
    submit_task,
)
from ledgerq.queue.worker.functions import Executors, RunContext, execute_claimed

WORKERS = ("host:0000000a", "host:0000000b", "host:0000000c")
GPU = "gpu-exclusive"
TERMINAL = frozenset({"completed", "failed", "timed_out", "skipped", "cancelled"})
OPERATOR = Actor(type="operator", id="op")
#: Few values, so ties (equal priority, one queue) are common and the order is tested.
PRIORITIES = st.sampled_from([0, 0, 0, 1, 5, -1])
QUEUES = st.sampled_from(["default", "default", "q2"])
#: A real file, on a RAM-backed filesystem where there is one: the machine opens hundreds.
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@dataclass
class Run:
    """What the model expects of one row."""

    status: str
    key: str | None
    deps: list[str]
    retry: RetryPolicy | None
    leased_by: str | None = None
    expires: float | None = None
    lease_attempts: int = 0
    run_attempts: int = 0
    retry_due: float | None = None
    not_before: float | None = None
    priority: int = 0
    queue: str = "default"


@dataclass
class Belief:
    """A lease a worker thinks it holds: the row it claimed, and the expiry it last wrote."""

    worker: str
    run_id: str
    row: dict[str, Any]
    expires: float
    history: list[float] = field(default_factory=list)


class WorkerAPIMachine(RuleBasedStateMachine):
    runs = Bundle("runs")
    backend = "sqlite"

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.tmp = tempfile.mkdtemp(prefix="ledgerq-stateful-", dir=SCRATCH)
        target, self.schema = pg.fresh_target(self.backend, self.tmp)
        self.db = StateDB(target)
        self.run(self.db.open())
        # Run ids in submission order: claims break queued_at ties by id, and random ids
        # would make hypothesis's draws (which lease to use next) differ between replays.
        counter = itertools.count(1)
        submit_module.new_run_id = lambda: str(uuid.UUID(int=next(counter)))
        self.clock = 1_000_000.0
        self.model: dict[str, Run] = {}
        self.beliefs: list[Belief] = []
        self.terminal_version: dict[str, int] = {}

    def run(self, coro: Any) -> Any:
        return self.runner.run(coro)

    def teardown(self) -> None:
        try:
            self.run(self.db.close())
        finally:
            self.runner.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
            submit_module.new_run_id = new_id
            pg.drop_target(self.schema)

    # ------------------------------------------------------------ model helpers

    def live(self, b: Belief) -> bool:
        m = self.model[b.run_id]
        return m.status == "running" and m.leased_by == b.worker and m.expires == b.expires

    def pick(self, data: st.DataObject) -> Belief:
        """A belief, live ones more often (stale ones pile up as the run goes on)."""
        live = [b for b in self.beliefs if self.live(b)]
        if live and data.draw(st.integers(0, 3), label="prefer a live lease") > 0:
            return data.draw(st.sampled_from(live), label="live lease")
        return data.draw(st.sampled_from(self.beliefs), label="any lease")

    def resolve(self) -> None:
        """Dependents settle as soon as their dependencies do (cascading)."""
        changed = True
        while changed:
            changed = False
            for m in self.model.values():
                if m.status != "waiting_dependency":
                    continue
                states = [self.model[d].status for d in m.deps]
                if any(s in TERMINAL and s != "completed" for s in states):
                    m.status = "cancelled"
                    changed = True
                    event("dependent cancelled")
                elif all(s == "completed" for s in states):
                    m.status = "queued"
                    changed = True
                    event("dependent released")

    def fact_total(self) -> int:
        got = self.run(self.db.fetch_one("SELECT COUNT(*) AS n FROM status_transitions"))
        return int(got["n"])

    def db_row(self, run_id: str) -> dict[str, Any]:
        got: dict[str, Any] | None = self.run(
            self.db.fetch_one("SELECT * FROM schedule_runs WHERE id = ?", (run_id,)))
        assert got is not None
        return got

    # ------------------------------------------------------------ rules

    def _submit(self, key: str | None, retry: int, deps: list[str],
                delay: float | None = None, priority: int = 0, queue: str = "default") -> str:
        policy = RetryPolicy(retry, base_delay=5.0, factor=2.0, jitter=0) if retry else None
        not_before = None if delay is None else self.clock + delay
        app = TaskApplication("agent", {}, "host", required_capabilities=[GPU] if key else [],
                              retry=policy, depends_on=deps, not_before=not_before,
                              priority=priority, queue=queue)
        rid = self.run(submit_task(self.db, app, now=self.clock, host=key or "h0"))
        delayed = not_before is not None and not_before > self.clock
        self.model[rid] = Run(status="waiting_dependency" if deps else
                              "delayed" if delayed else "queued",
                              key=f"{key}:{GPU}" if key else None, deps=list(deps),
                              retry=policy, not_before=not_before if delayed else None,
                              priority=priority, queue=queue)
        self.resolve()
        return str(rid)

    @initialize(target=runs, key=st.sampled_from([None, "h1"]))
    def first_run(self, key: str | None) -> str:
        return self._submit(key, 0, [])

    @rule(target=runs, key=st.sampled_from([None, None, "h1", "h2"]),
          retry=st.sampled_from([0, 0, 2, 3]), priority=PRIORITIES, queue=QUEUES)
    def submit(self, key: str | None, retry: int, priority: int, queue: str) -> str:
        return self._submit(key, retry, [], priority=priority, queue=queue)

    @rule(target=runs, key=st.sampled_from([None, "h1"]),
          delay=st.sampled_from([-1.0, 0.0, 3.0, 7.0, 15.0]), priority=PRIORITIES)
    def submit_delayed(self, key: str | None, delay: float, priority: int) -> str:
        """A start time: never claimed before it (whatever its priority), queued by
        promotion at it."""
        return self._submit(key, 0, [], delay, priority=priority)

    @rule(target=runs, deps=st.lists(runs, min_size=1, max_size=3, unique=True),
          key=st.sampled_from([None, "h1"]))
    def submit_dependent(self, deps: list[str], key: str | None) -> str:
        return self._submit(key, 0, deps)

    @rule(worker=st.sampled_from(WORKERS), limit=st.integers(1, 4),
          ttl=st.sampled_from([5.0, 10.0, 30.0]),
          queues=st.sampled_from([("default",), ("q2",), ("default", "q2"), ("q2", "q3")]))
    def claim(self, worker: str, limit: int, ttl: float, queues: tuple[str, ...]) -> None:
        # The claim order: among queued rows of the worker's queues, priority descending,
        # then (queued_at, id); one row per concurrency key, none whose key is running.
        queued_at = {r["id"]: r["queued_at"] for r in self.run(self.db.fetch_all(
            "SELECT id, queued_at FROM schedule_runs WHERE status = 'queued'"))}
        eligible = sorted((rid for rid, m in self.model.items()
                           if m.status == "queued" and m.queue in queues),
                          key=lambda rid: (-self.model[rid].priority, queued_at[rid], rid))
        busy = {m.key for m in self.model.values() if m.status == "running" and m.key}
        expected: list[str] = []
        blocked = set(busy)
        for rid in eligible:
            if len(expected) == limit:
                break
            key = self.model[rid].key
            if key is not None:
                if key in blocked:
                    continue
                blocked.add(key)
            expected.append(rid)
        got = self.run(claim_runs(self.db, worker_id=worker, now=self.clock, lease_ttl=ttl,
                                  limit=limit, advertised_capabilities=[GPU], queues=queues))
        assert sorted(r["id"] for r in got.claimed) == sorted(expected), (got, expected)
        if any(self.model[rid].priority for rid in expected):
            event("claimed by priority")
        if len(queues) > 1 and len({self.model[rid].queue for rid in expected}) > 1:
            event("claimed across queues")
        keys = [r["concurrency_key"] for r in got.claimed if r["concurrency_key"]]
        assert len(keys) == len(set(keys)) and not set(keys) & busy
        for r in got.claimed:
            m = self.model[r["id"]]
            assert m.status == "queued" and m.queue in queues
            m.status, m.leased_by, m.expires = "running", worker, self.clock + ttl
            m.lease_attempts += 1
            assert r["lease_expires_at"] == m.expires and r["leased_by"] == worker
            self.beliefs.append(Belief(worker, r["id"], r, m.expires))

    @precondition(lambda self: self.beliefs)
    @rule(data=st.data(), ttl=st.sampled_from([5.0, 10.0, 30.0]))
    def renew(self, data: st.DataObject, ttl: float) -> None:
        b = self.pick(data)
        was_live = self.live(b)
        before = self.fact_total()
        new_expiry = self.clock + ttl
        res = self.run(transition(self.db, TransitionRequest(
            entity_type="schedule_run", entity_id=b.run_id, from_state="running",
            to_state="running", reason=StateReason(code="run.running.lease_renewed"),
            actor=Actor(type="system", id=b.worker), idempotency_key=""),
            guard={"leased_by": b.worker, "lease_expires_at": b.expires},
            patch={"lease_expires_at": new_expiry}, now=self.clock))
        event(f"renew {'live' if was_live else 'stale'}")
        assert res.applied == was_live, (b, self.model[b.run_id], res)
        if was_live:
            assert self.fact_total() == before + 1
            b.history.append(b.expires)
            b.expires = new_expiry
            self.model[b.run_id].expires = new_expiry
        else:
            assert res.conflict and self.fact_total() == before

    @precondition(lambda self: self.beliefs)
    @rule(data=st.data(), outcome=st.sampled_from(["ok", "fail", "raise", "deny", "shutdown"]))
    def finish(self, data: st.DataObject, outcome: str) -> None:
        b = self.pick(data)
        m = self.model[b.run_id]
        was_live = self.live(b)
        before_facts = self.fact_total()
        before_row = self.db_row(b.run_id)
        called: list[str] = []

        async def execute(run: dict[str, Any]) -> tuple[int, str]:
            called.append(run["id"])
            if outcome == "raise":
                raise RuntimeError("boom")
            if outcome == "shutdown":
                await asyncio.sleep(60)
            return (0, "") if outcome == "ok" else (2, "exit 2")

        stopping = asyncio.Event()
        if outcome == "shutdown":
            stopping.set()
        ctx = RunContext(worker_id=b.worker, lease_ttl=10.0, clock=lambda: self.clock,
                         executors=Executors(execute=execute),
                         authorize=(lambda r: "no") if outcome == "deny" else None,
                         check_interval=0.001, stopping=stopping)
        got = self.run(execute_claimed(self.db, {**b.row, "lease_expires_at": b.expires}, ctx))
        assert called == ([] if outcome == "deny" else [b.run_id])
        event(f"finish {'live' if was_live else 'stale'}: {got}")
        if not was_live:
            # A cancel of this very lease counts as what it is (the model has no tokens).
            assert got == "lost" or (got == "cancelled" and m.status == "cancelled"), (got, b, m)
            assert self.fact_total() == before_facts
            assert self.db_row(b.run_id) == before_row
            return
        runs_done = m.run_attempts + 1
        if outcome == "ok":
            expected = "completed"
        elif outcome in ("fail", "raise") and m.retry and runs_done < m.retry.max_attempts:
            expected = "retry_wait"
        elif outcome == "shutdown":
            expected = "queued"
        else:
            expected = "failed"
        assert got == expected, (got, expected, outcome, m)
        m.status = expected
        if expected in ("queued", "retry_wait"):
            # The worker gave this lease back itself, so it drops the belief. (A lease is
            # named by (worker id, expiry): were the same worker to claim the row again at
            # the same instant with the same TTL, a kept belief would name the new lease.)
            self.beliefs.remove(b)
        if expected == "queued":
            m.leased_by = m.expires = None
            m.lease_attempts = max(0, m.lease_attempts - 1)
        elif expected == "retry_wait":
            assert m.retry is not None
            m.leased_by = m.expires = None
            m.run_attempts = runs_done
            m.retry_due = self.clock + m.retry.delay(runs_done)
        else:
            m.run_attempts = runs_done
            self.resolve()

    @rule(run_id=runs)
    def cancel(self, run_id: str) -> None:
        m = self.model[run_id]
        before = self.fact_total()
        got = self.run(cancel_task(self.db, run_id, actor=OPERATOR, now=self.clock))
        assert got == (m.status not in TERMINAL)
        if got:
            m.status = "cancelled"
            self.resolve()
        else:
            assert self.fact_total() == before

    @rule(delta=st.sampled_from([0.0, 1.0, 4.0, 6.0, 11.0, 31.0]))
    def reap(self, delta: float) -> None:
        self.clock += delta
        expected = {"requeued": 0, "failed": 0}
        for m in self.model.values():
            if m.status == "running" and m.expires is not None and m.expires < self.clock:
                if m.lease_attempts < MAX_LEASE_ATTEMPTS:
                    m.status, m.leased_by, m.expires = "queued", None, None
                    expected["requeued"] += 1
                else:
                    m.status = "failed"
                    expected["failed"] += 1
        got = self.run(reap_expired_leases(self.db, now=self.clock))
        assert got == expected
        event(f"reap {expected}")
        self.resolve()

    @rule(delta=st.sampled_from([0.0, 2.0, 5.0, 10.0, 20.0]))
    def promote(self, delta: float) -> None:
        self.clock += delta
        retried = started = 0
        for m in self.model.values():
            if m.status == "retry_wait" and m.retry_due is not None and m.retry_due <= self.clock:
                m.status, m.retry_due, m.lease_attempts = "queued", None, 0
                retried += 1
            elif m.status == "delayed" and m.not_before is not None and \
                    m.not_before <= self.clock:
                m.status = "queued"
                started += 1
        got = self.run(promote_due(self.db, now=self.clock))
        assert got == {"retried": retried, "released": 0, "cancelled": 0, "started": started}
        if started:
            event("delayed runs started")

    # ------------------------------------------------------------ invariants

    @invariant()
    def database_matches_the_model(self) -> None:
        rows = {r["id"]: r for r in self.run(self.db.fetch_all("SELECT * FROM schedule_runs"))}
        assert set(rows) == set(self.model)
        for rid, m in self.model.items():
            r = rows[rid]
            assert (r["status"], r["leased_by"], r["lease_expires_at"], r["lease_attempts"],
                    r["run_attempts"], r["retry_due_at"], r["priority"], r["queue"]) == (
                m.status, m.leased_by, m.expires, m.lease_attempts, m.run_attempts,
                m.retry_due, m.priority, m.queue), (rid, r, m)
            if m.status == "running":
                assert r["leased_by"] is not None and r["lease_expires_at"] is not None
            elif m.status in ("queued", "retry_wait", "waiting_dependency", "delayed"):
                assert r["leased_by"] is None and r["lease_expires_at"] is None
            if r["not_before"] is not None and m.status not in ("delayed", "cancelled"):
                # A run with a start time was claimable only once promotion queued it,
                # which needs the clock at or past that time.
                assert self.clock >= r["not_before"], (rid, r, self.clock)
            if m.status in TERMINAL:
                version = self.terminal_version.setdefault(rid, r["version"])
                assert r["version"] == version, f"terminal run {rid} moved"

    @invariant()
    def one_live_lease_per_row(self) -> None:
        live: dict[str, int] = {}
        for b in self.beliefs:
            if self.live(b):
                live[b.run_id] = live.get(b.run_id, 0) + 1
        for rid, m in self.model.items():
            assert live.get(rid, 0) == (1 if m.status == "running" else 0), rid
        keys = [m.key for m in self.model.values() if m.status == "running" and m.key]
        assert len(keys) == len(set(keys))

    @invariant()
    def log_is_sound(self) -> None:
        doubles = self.run(self.db.fetch_all(
            "SELECT entity_id FROM status_transitions WHERE status IN "
            "('completed', 'failed', 'timed_out', 'skipped', 'cancelled') "
            "GROUP BY entity_id HAVING COUNT(*) > 1"))
        assert doubles == []
        report = self.run(verify(self.db))
        assert report.ok, [str(d) for d in report.drift]


# 100 examples of the conftest profile's steps (about 10 s); the "long" profile keeps its
# own count, and LEDGERQ_STATEFUL_EXAMPLES overrides either.
_profile = settings.default
assert _profile is not None
_examples = int(os.environ.get("LEDGERQ_STATEFUL_EXAMPLES", "0")) or (
    _profile.max_examples if _profile.max_examples > 150 else 100)
WorkerAPIMachine.TestCase.settings = settings(_profile, max_examples=_examples, deadline=None)
TestWorkerAPI = WorkerAPIMachine.TestCase


class PostgresWorkerAPIMachine(WorkerAPIMachine):
    """The same machine on PostgreSQL (a fresh schema per example; fewer examples, since
    each costs a schema's DDL: LEDGERQ_STATEFUL_PG_EXAMPLES overrides)."""

    backend = "postgresql"


PostgresWorkerAPIMachine.TestCase.settings = settings(
    _profile, max_examples=int(os.environ.get("LEDGERQ_STATEFUL_PG_EXAMPLES", "25")),
    deadline=None)
TestWorkerAPIPostgres = PostgresWorkerAPIMachine.TestCase
