"""The lease keeper: a worker's leases renewed from a thread of its own.

A run's lease is what keeps the reaper from giving its row to another worker. Renewed
from the worker's event loop, it depends on that loop turning: an ``async def`` task
that blocks it (a ``time.sleep``, a synchronous HTTP call, a long computation) would
stop every renewal, the reaper would requeue its run, and another worker would run it
again while the first still does. The keeper renews from a thread with an event loop
and a database handle of its own (:meth:`~ledgerq.lifecycle.store.Database.twin`), so
a lease lasts as long as its run does, whatever the loop is doing.

It also watches the loop: when the loop has not turned for a second or more, it looks
at what the loop's thread is running, and says so by name once the loop turns again
("the event loop was blocked for 12.3 s by tasks.crunch (tasks.py:8)"), so the task that
should have been a sync function (run on the worker's threads) is found.

The worker's loop still checks each row (a cancel, a reap) and writes each outcome;
an outcome's write first waits out a renewal of its run in flight
(:meth:`LeaseKeeper.release`), since both are guarded on the lease.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from ledgerq.queue import moves
from ledgerq.queue.runs import perform, worker_actor

if TYPE_CHECKING:
    from ledgerq.lifecycle.registry import EntityPolicy
    from ledgerq.lifecycle.store import Database
    from ledgerq.queue.worker.store import WorkerTx

log = logging.getLogger("ledgerq.worker")

#: The lease column a renewal moves forward (the rest of the lease stays as claimed).
EXPIRY = "lease_expires_at"
#: A lease is renewed once this fraction of its TTL has passed.
RENEW_FRACTION = 1 / 3
#: How long the loop may go without turning before the keeper looks at what blocks it.
BLOCKED_AFTER = 1.0
#: Where ledgerq's code and the standard library's are: what a blocking task is not.
_LEDGERQ = str(Path(__file__).resolve().parents[2]) + "/"
_STDLIB = tuple(str(Path(sysconfig.get_paths()[k]).resolve()) + "/"
                for k in ("stdlib", "platstdlib"))


@dataclass
class _Held:
    """A run whose lease the keeper renews."""

    #: The supervisor's own lease dict (its writes' guard): the keeper moves its expiry.
    lease: dict[str, Any]
    #: Set when the renewal in flight ends (None: none in flight).
    renewing: threading.Event | None = None
    #: Why the lease was lost (a renewal found it taken), or None.
    lost: str | None = None


class LeaseKeeper:
    """Renews the leases of one worker's runs, from its own thread (see the module)."""

    def __init__(self, twin: Database[WorkerTx], policy: EntityPolicy, *, worker_id: str,
                 lease_ttl: float, interval: float, clock: Callable[[], float] = time.time
                 ) -> None:
        self.twin = twin
        self.policy = policy
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl
        self.interval = min(interval, BLOCKED_AFTER / 2)
        self.clock = clock
        self._held: dict[str, _Held] = {}
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        #: When the loop was asked to turn and has not yet (monotonic), and what was
        #: found blocking it.
        self._asked: float | None = None
        self._blocker: str | None = None
        #: Renewals written (observability, tests).
        self.renewals = 0

    # ------------------------------------------------------------ the worker's side

    def start(self) -> None:
        """Start the thread (from the worker's loop, whose thread it watches)."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"ledgerq-lease-keeper-{self.worker_id}")
        self._thread.start()

    async def stop(self) -> None:
        """Stop the thread and close its handle; the runs still held are let go."""
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        with self._mutex:
            self._held.clear()

    def hold(self, run_id: str, lease: dict[str, Any]) -> None:
        """Keep ``lease`` (the dict the run's outcome will be guarded on) renewed."""
        with self._mutex:
            self._held[run_id] = _Held(lease)

    def lost(self, run_id: str) -> str | None:
        """Why the run's lease is gone, if a renewal found it so."""
        held = self._held.get(run_id)
        return None if held is None else held.lost

    def forget(self, run_id: str) -> None:
        """Renew it no more (its run ended; idempotent)."""
        with self._mutex:
            self._held.pop(run_id, None)

    async def release(self, run_ids: Iterable[str]) -> None:
        """Renew these runs no more, once any renewal of theirs in flight has ended:
        their leases then stay as an outcome's guard will find them."""
        waits = []
        with self._mutex:
            for run_id in run_ids:
                held = self._held.pop(run_id, None)
                if held is not None and held.renewing is not None:
                    waits.append(held.renewing)
        for done in waits:
            await asyncio.to_thread(done.wait)

    # ------------------------------------------------------------ the keeper's thread

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        # The handle is opened with the first lease to keep: an idle worker holds no
        # second connection.
        try:
            while not self._stop.wait(self.interval):
                self._watch()
                if not self._held:
                    continue
                try:
                    if not self.twin.is_open:
                        if self.twin.file is not None and not Path(self.twin.file).exists():
                            continue  # gone: the worker stops (opening would create one)
                        await self.twin.open()
                    await self._renew_due()
                except Exception as exc:  # a busy database: the next pass tries again
                    log.warning("worker %s: lease renewal failed (%s); retrying",
                                self.worker_id, exc)
        finally:
            if self.twin.is_open:
                await self.twin.close()

    async def _renew_due(self) -> None:
        now = self.clock()
        due_at = self.lease_ttl * (1 - RENEW_FRACTION)
        with self._mutex:
            due = [(run_id, held, dict(held.lease)) for run_id, held in self._held.items()
                   if held.lost is None and now >= held.lease[EXPIRY] - due_at]
            for _, held, _ in due:
                held.renewing = threading.Event()
        expiry = now + self.lease_ttl
        actor = worker_actor(self.worker_id)
        for run_id, held, guard in due:
            def renew(tx: WorkerTx, run_id: str = run_id, guard: dict[str, Any] = guard
                      ) -> bool:
                return perform(tx, self.policy, run_id, moves.RENEWED, actor=actor,
                               guard=guard, patch={EXPIRY: expiry}, now=now).applied

            applied: bool | None = None
            try:
                applied = await self.twin.write(renew)
            except Exception as exc:
                log.warning("run %s: lease renewal failed (%s); retrying", run_id, exc)
            finally:
                with self._mutex:
                    if applied:
                        held.lease[EXPIRY] = expiry
                        self.renewals += 1
                    elif applied is False:
                        held.lost = "renewal conflicted"
                    done, held.renewing = held.renewing, None
                if done is not None:
                    done.set()

    def _watch(self) -> None:
        """Ask the loop to turn; when it has not since the last ask, a second or more ago,
        find what its thread is running."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if self._asked is None:
            self._asked = time.monotonic()
            try:
                loop.call_soon_threadsafe(self._turned, self._asked)
            except RuntimeError:  # the loop closed meanwhile
                self._asked = None
            return
        if self._blocker is None and time.monotonic() - self._asked >= BLOCKED_AFTER:
            frame = sys._current_frames().get(self._loop_thread)
            self._blocker = blocking_code(frame) if frame is not None else "unknown code"

    def _turned(self, asked: float) -> None:
        """On the loop: it turned. Say what blocked it, if something did."""
        blocked = time.monotonic() - asked
        blocker, self._blocker, self._asked = self._blocker, None, None
        if blocker is not None:
            log.warning("worker %s: the event loop was blocked for %.1fs by %s; an async "
                        "task must not block (make it a sync function: it then runs on the "
                        "worker's threads). Its leases were renewed meanwhile.",
                        self.worker_id, blocked, blocker)


def blocking_code(frame: FrameType) -> str:
    """What blocks the loop, as ``module.function (file:line)``: the function ledgerq
    called (the task) on ``frame``'s stack, or, outside any task, the innermost frame."""
    found = frame
    walker: FrameType | None = frame
    while walker is not None:  # innermost first, out to the first frame of ledgerq's
        path = _path(walker)
        if path.startswith(_LEDGERQ):
            break
        if not path.startswith(_STDLIB):
            found = walker  # the task's own code, or a library it called
        walker = walker.f_back
    code = found.f_code
    module = found.f_globals.get("__name__", "?")
    name = getattr(code, "co_qualname", code.co_name)
    return f"{module}.{name} ({Path(code.co_filename).name}:{found.f_lineno})"


def _path(frame: FrameType) -> str:
    name = frame.f_code.co_filename
    return name if name.startswith("<") else str(Path(name).resolve())


__all__ = ["EXPIRY", "RENEW_FRACTION", "LeaseKeeper", "blocking_code"]
