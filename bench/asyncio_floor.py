"""The asyncio floor: the schema floor's statements, driven the least way an asyncio API can.

The 64-submitter target is a case of concurrent callers: 64 coroutines submitting while a
worker in the same loop runs every claimed task concurrently. Any asyncio library
serving it must at least suspend each caller until its group commit lands (one future
per group, a wake-up per caller), run each claimed task as a task of its own (the
executor is a coroutine), and suspend each until its terminal write commits. This does
exactly that and nothing more: the floor's own statements (bench/floor.py: a group's
submits written together, its claims and terminal writes row by row), one group commit
per turn of the loop in the loop's thread, an event for wake-ups, no
validation, no leases renewed, no supervision, no reader thread. What it loses against
the schema floor (a loop of statements with no concurrency at all) is the cost of the
asyncio shape itself, which no implementation of this API avoids.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from floor import (
    APP,
    Execute,
    claim_page,
    claim_rows,
    connect,
    end_row,
    submit_row,
    submit_rows,
)
from ledgerq.codec import dumps
from ledgerq.lifecycle import Registry
from ledgerq.lifecycle.engine import check_values
from ledgerq.queue.moves import LEASE
from ledgerq.queue.submission.application import digest, validate_encoded
from ledgerq.store.sqlite.schema import schema_ddl


class Checks:
    """The checks ledgerq's contract makes on every lifecycle, and nothing around them: a
    submit's application validated and fingerprinted (``validate_encoded``, ``digest``),
    and each claim's and terminal write's guard and patch values checked against their
    columns (``check_values``). With them the asyncio floor bounds target 2 for any
    implementation of ledgerq's contract on the floor's statements. A claim's values are
    checked once the floor's ``claim_rows`` has made them: the cost, not the place."""

    def __init__(self, registry: Registry) -> None:
        self.policy = registry.entity("schedule_run")
        self.lease = self.policy.column_group(LEASE)

    def submit(self) -> tuple[str, str]:
        valid, text = validate_encoded(APP)
        return text, digest(valid, text)

    def claimed(self, row: dict[str, Any]) -> None:
        """A claim's guard and patch, as ledgerq's claim gives them (queue/worker/claim.py's
        ``_lease_terms``)."""
        check_values(self.policy, "guard", {"lease_attempts": row["lease_attempts"] - 1,
                                            "leased_by": None})
        check_values(self.policy, "patch", {
            **{c: row[c] for c in self.lease}, "lease_attempts": row["lease_attempts"]})

    def ending(self, row: dict[str, Any]) -> None:
        """A terminal write's guard (the lease) and patch after exit 0."""
        check_values(self.policy, "guard", {c: row[c] for c in self.lease})
        check_values(self.policy, "patch", {
            "ended_at": time.time(), "exit_code": 0, "error_detail": None,
            "run_attempts": 1, "stdout_tail": None, "stderr_tail": None})


class GroupCommit:
    """Callers add a unit (or a submit) and await the turn's group; the group commits
    once, in the loop's thread, after every caller ready in that turn has joined it. The
    group's submits are written together, as ledgerq writes the submits of one turn
    (ledgerq.queue.submission.joined; bench/floor.py's ``submit_rows``), before its other units."""

    def __init__(self, conn: sqlite3.Connection, args: str, fingerprint: str) -> None:
        self.conn = conn
        self.x: Execute = conn.execute
        self.args, self.fingerprint = args, fingerprint
        self.units: list[Callable[[Execute], Any]] = []
        self.submits = 0
        self.future: asyncio.Future[tuple[list[Any], list[str]]] | None = None

    def _group(self) -> asyncio.Future[tuple[list[Any], list[str]]]:
        if self.future is None:
            loop = asyncio.get_running_loop()
            self.future = loop.create_future()
            loop.call_soon(self._commit)
        return self.future

    async def run(self, unit: Callable[[Execute], Any]) -> Any:
        group = self._group()
        index = len(self.units)
        self.units.append(unit)
        return (await group)[0][index]

    async def submit(self, checked: tuple[str, str] | None = None) -> str:
        """One submit, written with the others of its turn; its id. ``checked``: its
        application's args and fingerprint as :class:`Checks` made them (what is written)."""
        if checked is not None:
            assert checked == (self.args, self.fingerprint), checked
        group = self._group()
        index = self.submits
        self.submits += 1
        return (await group)[1][index]

    def _commit(self) -> None:
        units, submits, future = self.units, self.submits, self.future
        self.units, self.submits, self.future = [], 0, None
        assert future is not None
        self.x("BEGIN IMMEDIATE")
        # (a lone submit is written alone, as ledgerq writes a joint of one)
        ids = [submit_row(self.x, self.args, self.fingerprint)] if submits == 1 else \
            submit_rows(self.conn, self.args, self.fingerprint, submits) if submits else []
        values = [unit(self.x) for unit in units]
        self.x("COMMIT")
        future.set_result((values, ids))


async def _scenario(conn: sqlite3.Connection, page: str, submitters: int, per: int,
                    capacity: int, checks: Checks | None) -> None:
    commits = GroupCommit(conn, dumps(APP.args), digest(APP))
    queued = asyncio.Event()
    total = submitters * per
    finished = 0
    running = 0
    freed = asyncio.Event()

    async def submitter() -> None:
        for _ in range(per):
            await commits.submit(None if checks is None else checks.submit())
            queued.set()

    async def noop(run: dict[str, Any]) -> tuple[int, str]:
        return 0, ""

    async def execute(row: dict[str, Any]) -> None:
        nonlocal finished, running
        code, _ = await noop(row)
        assert code == 0
        if checks is not None:
            checks.ending(row)
        await commits.run(lambda x: end_row(x, row))
        finished += 1
        running -= 1
        freed.set()

    async def worker() -> None:
        nonlocal running
        tasks: set[asyncio.Task[None]] = set()
        while finished < total:
            free = capacity - running
            if free == 0:
                freed.clear()
                await freed.wait()
                continue
            queued.clear()
            rows = await commits.run(lambda x, free=free: claim_rows(x, page, free))
            for row in rows:
                if checks is not None:
                    checks.claimed(row)
                running += 1
                task = asyncio.create_task(execute(row))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if not rows:
                if finished + running >= total:
                    freed.clear()
                    await freed.wait()
                else:
                    await queued.wait()

    await asyncio.gather(worker(), *(submitter() for _ in range(submitters)))


async def asyncio_floor(path: str, registry: Registry, sync: str, submitters: int, per: int,
                  capacity: int = 64, checked: bool = False) -> dict[str, float]:
    """``submitters`` coroutines submitting ``per`` tasks each while a worker of
    ``capacity`` runs them, all on the floor's statements; lifecycles/s and CPU per
    lifecycle. ``checked``: with the checks of ledgerq's contract (:class:`Checks`). Run
    in the caller's loop (the benchmarks' own)."""
    conn = connect(path, sync)
    conn.executescript(schema_ddl(registry))
    page = claim_page(registry)
    c0, t0 = time.process_time(), time.perf_counter()
    await _scenario(conn, page, submitters, per, capacity,
                    Checks(registry) if checked else None)
    t1, c1 = time.perf_counter(), time.process_time()
    n = submitters * per
    (facts,) = conn.execute("SELECT count(*) FROM status_transitions").fetchone()
    (left,) = conn.execute(
        "SELECT count(*) FROM schedule_runs WHERE status <> 'completed'").fetchone()
    conn.close()
    assert facts == 3 * n and left == 0, (facts, left)
    return {"lifecycle": n / (t1 - t0), "cpu_us": (c1 - c0) / n * 1e6}
