"""What a worker is: one value the worker functions and the Worker service both pass on.

The claim, the heartbeat and the supervision of runs each read part of it; built
once (and checked once) per tick or per Worker, it cannot drift between them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ledgerq.durations import check_span
from ledgerq.errors import InvalidInput
from ledgerq.queue.moves import DEFAULT_QUEUE
from ledgerq.queue.submission.application import queue_name_problem
from ledgerq.queue.worker.executors import Executors
from ledgerq.queue.worker.launcher import MAX_OUTPUT_TAIL_BYTES, OUTPUT_TAIL_BYTES, ExecuteFn
from ledgerq.queue.worker.leases import LeaseReads
from ledgerq.queue.worker.starvation import ClaimPause

if TYPE_CHECKING:
    from ledgerq.queue.worker.keeper import LeaseKeeper

DEFAULT_LEASE_TTL_SECONDS = 300.0
#: A worker whose heartbeat is older than this is presumed dead.
DEFAULT_HEARTBEAT_TTL_SECONDS = 90.0

#: The hook that decides, per claimed run, whether it may execute: True, or a refusal
#: (False, or the reason as text). Authorization stays outside the queue.
Authorize = Callable[[dict[str, Any]], "bool | str | Awaitable[bool | str]"]
#: Claims attempted per pass (the ADR-0071 queue's value).
DEFAULT_CLAIM_LIMIT = 20
#: How often an executing run checks that it still owns its lease (cancel / reap notice).
LEASE_CHECK_SECONDS = 0.5


def served_queues(queues: Iterable[str] | None) -> tuple[str, ...]:
    """The queues a worker serves, checked and without repeats (order kept).

    A bare string is refused rather than read as its characters' queues.
    """
    if queues is None:
        return (DEFAULT_QUEUE,)
    if isinstance(queues, str):
        raise InvalidInput(f"queues must be a list of queue names, not the string "
                           f"{queues!r}")
    names = tuple(dict.fromkeys(queues))
    if not names:
        raise InvalidInput("queues must name at least one queue")
    for i, name in enumerate(names):
        problem = queue_name_problem(name)
        if problem is not None:
            raise InvalidInput(f"queues[{i}] {problem}")
    return names


def check_interval_for(lease_ttl: float) -> float:
    """The lease-check interval a lease of ``lease_ttl`` seconds gets when none is given.

    A renewal falls due after a third of the TTL and is noticed within one check, so a
    check interval above a third of the lease could let it lapse on a healthy worker;
    the usual interval is kept for every lease long enough for it.
    """
    return min(LEASE_CHECK_SECONDS, lease_ttl / 3)


@dataclass(frozen=True)
class WorkerConfig:
    """Who the worker is, what it serves, and how it holds and checks its leases.

    Build it with :meth:`build`, which checks the values; the fields are already the
    normalized ones (tuples, a Path, a derived check interval).
    """

    worker_id: str
    lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS
    heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS
    #: Most rows one claim pass takes.
    claim_limit: int = DEFAULT_CLAIM_LIMIT
    advertised_capabilities: tuple[str, ...] = ()
    #: What the heartbeat advertises; a claim serves ``host`` when this is empty.
    execution_targets: tuple[str, ...] = ("host",)
    executors: Executors = field(default_factory=Executors)
    authorize: Authorize | None = None
    #: Where each concurrency key's OS lock file is held; None: no OS locks.
    lock_dir: Path | None = None
    check_interval: float = LEASE_CHECK_SECONDS
    #: Bytes of each of stdout and stderr a run records with the fact that ends it.
    output_tail: int = OUTPUT_TAIL_BYTES
    #: The named queues it claims from (each run waits in one).
    queues: tuple[str, ...] = (DEFAULT_QUEUE,)

    @classmethod
    def build(cls, *, worker_id: str, lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS,
              heartbeat_ttl: float = DEFAULT_HEARTBEAT_TTL_SECONDS,
              claim_limit: int = DEFAULT_CLAIM_LIMIT,
              advertised_capabilities: Iterable[str] | None = None,
              execution_targets: Iterable[str] | None = None,
              execute: ExecuteFn | None = None,
              adapters: Mapping[str, ExecuteFn] | None = None,
              authorize: Authorize | None = None,
              lock_dir: str | Path | None = None,
              check_interval: float | None = None,
              output_tail: int = OUTPUT_TAIL_BYTES,
              queues: Iterable[str] | None = None) -> WorkerConfig:
        """The config for these arguments, as the public signatures take them.

        ``execution_targets`` None means ``host``; ``check_interval`` None follows the
        lease (:func:`check_interval_for`); ``queues`` None means the default queue.
        """
        # NaN compares false with everything: a plain "<= 0" test let it through, and a
        # NaN or infinite lease then made every claim's expiry unusable.
        check_span(lease_ttl, "lease_ttl", positive=True)
        check_span(heartbeat_ttl, "heartbeat_ttl", positive=True)
        if check_interval is not None:
            check_span(check_interval, "check_interval", positive=True)
        if isinstance(claim_limit, bool) or not isinstance(claim_limit, int) \
                or claim_limit < 0:
            raise InvalidInput(f"claim_limit must be an int >= 0, not {claim_limit!r}")
        if check_interval is None:
            # A caller who asks for a short lease gets one: the checks follow the lease.
            check_interval = check_interval_for(lease_ttl)
        elif lease_ttl < 3 * check_interval:
            # Renewal is due after a third of the TTL and noticed within one check:
            # a shorter lease could lapse on a healthy worker.
            raise ValueError(f"lease_ttl ({lease_ttl}s) must be at least 3 x check_interval "
                             f"({check_interval}s); leave check_interval out to derive it "
                             "from the lease")
        if not 0 <= output_tail <= MAX_OUTPUT_TAIL_BYTES:
            raise ValueError(f"output_tail must be between 0 and {MAX_OUTPUT_TAIL_BYTES:,} "
                             f"bytes, not {output_tail}")
        return cls(
            worker_id=worker_id, lease_ttl=lease_ttl, heartbeat_ttl=heartbeat_ttl,
            queues=served_queues(queues),
            claim_limit=claim_limit,
            advertised_capabilities=tuple(advertised_capabilities or ()),
            execution_targets=("host",) if execution_targets is None
            else tuple(execution_targets),
            executors=Executors(execute=execute, adapters=dict(adapters or {})),
            authorize=authorize, lock_dir=Path(lock_dir) if lock_dir is not None else None,
            check_interval=check_interval, output_tail=output_tail)


@dataclass
class RunContext:
    """How one claimed run is supervised while it executes."""

    worker_id: str
    lease_ttl: float = DEFAULT_LEASE_TTL_SECONDS
    clock: Callable[[], float] = time.time
    executors: Executors = field(default_factory=Executors)
    authorize: Authorize | None = None
    lock_dir: Path | None = None
    check_interval: float = LEASE_CHECK_SECONDS
    stopping: asyncio.Event | None = None
    #: Shared by the runs of one worker (or one pass): their checks become one read.
    lease_reads: LeaseReads = field(default_factory=LeaseReads)
    #: Bytes of each output stream a run records (see launcher.OutputCapture).
    output_tail: int = OUTPUT_TAIL_BYTES
    #: Claims paused while runs are given back for want of a resource (starvation.py).
    claim_pause: ClaimPause = field(default_factory=ClaimPause)
    #: Renews the leases from a thread of its own (a worker's; None: the supervising
    #: loop renews them, as a single pass or a drain does).
    keeper: LeaseKeeper | None = None

    @classmethod
    def from_config(cls, config: WorkerConfig, *, clock: Callable[[], float] = time.time,
                    stopping: asyncio.Event | None = None) -> RunContext:
        return cls(worker_id=config.worker_id, lease_ttl=config.lease_ttl, clock=clock,
                   executors=config.executors, authorize=config.authorize,
                   lock_dir=config.lock_dir, check_interval=config.check_interval,
                   stopping=stopping, output_tail=config.output_tail)
