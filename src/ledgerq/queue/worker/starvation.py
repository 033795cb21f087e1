"""A worker out of a resource: its runs given back, its claims paused, its capacity sized.

A run that cannot start because its *worker* ran out of something (file descriptors,
memory, processes: EMFILE, ENFILE, ENOMEM, EAGAIN) did not fail: another worker, or
this one a moment later, can run it. Failing it would spend its retries on the worker's
trouble (400 runs at ``capacity=10000`` under a 512-file limit: 156 failed for good). So
such a run goes back to ``queued`` without counting a run attempt, and the worker stops
claiming for a while, doubling the pause while it keeps happening. A run given back
:data:`GIVE_BACKS` times in a row fails, naming the error: a task that exhausts the
worker by itself must not circle forever.

And a capacity no file limit can hold is refused when the worker is made, instead of
found out run by run.
"""

from __future__ import annotations

import errno
import resource
import time
from dataclasses import dataclass

#: What a worker runs out of, as the OS says it.
STARVED_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EAGAIN})
#: Claims of one run, in a row, that may end in a give-back before it fails (the
#: reaper's strike rule counts the same column).
GIVE_BACKS = 3
#: File descriptors a running child holds in the worker (its output pipes, the
#: transport and the process's own) and those the worker keeps for itself.
FDS_PER_CHILD = 4
FD_RESERVE = 64
#: The first pause of claims after a give-back, and the longest.
FIRST_PAUSE = 1.0
LONGEST_PAUSE = 30.0


def is_starved(exc: BaseException) -> bool:
    """Whether ``exc`` says the worker, not the task, ran out of a resource."""
    return isinstance(exc, MemoryError) or (
        isinstance(exc, OSError) and exc.errno in STARVED_ERRNOS)


def check_file_limit(capacity: int) -> None:
    """Make sure ``capacity`` children fit this process's open-file limit: raise the soft
    limit toward the hard one if needed, else ValueError naming both numbers."""
    need = capacity * FDS_PER_CHILD + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard == resource.RLIM_INFINITY or need <= hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
            return
        except (ValueError, OSError):
            pass
    fits = max(1, (min(soft, hard) - FD_RESERVE) // FDS_PER_CHILD)
    raise ValueError(f"capacity {capacity} needs about {need:,} open files ({FDS_PER_CHILD} "
                     f"per running child + {FD_RESERVE}); this process may open {soft:,} "
                     f"(ulimit -n; hard limit {hard:,}): lower capacity to {fits:,} or "
                     "raise the limit")


@dataclass
class ClaimPause:
    """Claims paused after a give-back: ``FIRST_PAUSE``, doubling up to ``LONGEST_PAUSE``
    while give-backs go on; a run that ends normally resets it."""

    until: float = 0.0
    pause: float = 0.0

    def starved(self) -> None:
        self.pause = min(LONGEST_PAUSE, self.pause * 2 if self.pause else FIRST_PAUSE)
        self.until = time.monotonic() + self.pause

    def fed(self) -> None:
        self.pause = 0.0

    def paused(self) -> bool:
        return time.monotonic() < self.until
