"""The lease keeper: a worker's leases renewed from a thread of its own.

A run's lease is what keeps the reaper from giving its row to another worker. Renewed
from the worker's event loop, it depends on that loop turning: an ``async def`` task
that blocks it (a ``time.sleep``, a synchronous HTTP call, a long computation) would
stop every renewal, the reaper would requeue its run, and another worker would run it
again while the first still does. The keeper renews from a thread with an event loop
and a database handle it may use from there (:meth:`~ledgerq.lifecycle.store.Database.twin`:
on PostgreSQL the worker's own, whose units run on pool threads, so it costs no
connection; on SQLite a second handle), so a lease lasts as long as its run does,
whatever the loop is doing.

(Which task blocked the loop, and for how long, the task face says as each step of it
ends: ``ledgerq.tasks.execution.Watched``.)

The worker's loop still checks each row (a cancel, a reap) and writes each outcome;
an outcome's write first waits out a renewal of its run in flight
(:meth:`LeaseKeeper.release`), since both are guarded on the lease.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
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
                 lease_ttl: float, interval: float, owned: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.twin = twin
        #: Whether the keeper opens and closes ``twin`` (a handle of its own), or uses the
        #: worker's, which a thread may (PostgreSQL's: see ``Database.twin``).
        self.owned = owned
        self.policy = policy
        self.worker_id = worker_id
        self.lease_ttl = lease_ttl
        self.interval = interval
        self.clock = clock
        self._held: dict[str, _Held] = {}
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Renewals written (observability, tests).
        self.renewals = 0
        #: The failure last logged (a database that stays down is said once, not twice
        #: a second).
        self._failing: str | None = None

    # ------------------------------------------------------------ the worker's side

    def start(self) -> None:
        """Start the thread."""
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
                if not self._held:
                    continue
                try:
                    if self.owned and not self.twin.is_open:
                        if self.twin.file is not None and not Path(self.twin.file).exists():
                            continue  # gone: the worker stops (opening would create one)
                        await self.twin.open()
                    if await self._renew_due():
                        self._failing = None
                except Exception as exc:  # a busy database: the next pass tries again
                    self._failed(f"worker {self.worker_id}: lease renewal failed ({exc}); "
                                 "retrying")
        finally:
            if self.owned and self.twin.is_open:
                await self.twin.close()

    def _failed(self, message: str) -> None:
        if message != self._failing:
            log.warning("%s", message)
            self._failing = message

    async def _renew_due(self) -> bool:
        """Renew the leases due; whether every renewal was written or refused (none
        failed)."""
        now = self.clock()
        due_at = self.lease_ttl * (1 - RENEW_FRACTION)
        with self._mutex:
            due = [(run_id, held, dict(held.lease)) for run_id, held in self._held.items()
                   if held.lost is None and now >= held.lease[EXPIRY] - due_at]
            for _, held, _ in due:
                held.renewing = threading.Event()
        expiry = now + self.lease_ttl
        actor = worker_actor(self.worker_id)
        clean = True
        for run_id, held, guard in due:
            def renew(tx: WorkerTx, run_id: str = run_id, guard: dict[str, Any] = guard
                      ) -> bool:
                return perform(tx, self.policy, run_id, moves.RENEWED, actor=actor,
                               guard=guard, patch={EXPIRY: expiry}, now=now).applied

            applied: bool | None = None
            try:
                applied = await self.twin.write(renew)
            except Exception as exc:
                clean = False
                self._failed(f"run {run_id}: lease renewal failed ({exc}); retrying")
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
        return clean


__all__ = ["EXPIRY", "RENEW_FRACTION", "LeaseKeeper"]
