"""In-process wake-ups: a submission wakes idle workers at once instead of at their next
poll, and a run's end wakes whoever awaits its result.

Keyed by database path (and channel: :data:`WORK` or :data:`ENDED`), so any StateDB on
the same file in this process counts. Other processes are not reached; their workers
find the work at their next (short) poll.
"""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from functools import lru_cache

#: Channels: work to claim (a submit, a promotion), and runs that ended.
WORK = "work"
ENDED = "ended"

_waiters: dict[tuple[str, str], set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = \
    defaultdict(set)


@lru_cache(maxsize=64)
def _key(path: str) -> str:
    # Cached: notify() runs on every submit, and realpath costs a few lstat calls.
    return path if path == ":memory:" else os.path.realpath(path)


def subscribe(path: str, event: asyncio.Event, channel: str = WORK) -> None:
    _waiters[channel, _key(path)].add((asyncio.get_running_loop(), event))


def unsubscribe(path: str, event: asyncio.Event, channel: str = WORK) -> None:
    waiters = _waiters.get((channel, _key(path)))
    if waiters is not None:
        for item in [w for w in waiters if w[1] is event]:
            waiters.discard(item)


def notify(path: str, channel: str = WORK) -> None:
    waiters = _waiters.get((channel, _key(path)))
    if not waiters:
        return
    for loop, event in list(waiters):
        if loop.is_closed():
            continue
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            loop.call_soon_threadsafe(event.set)
