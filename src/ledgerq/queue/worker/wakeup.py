"""In-process wake-ups: a submission wakes idle workers at once instead of at their next poll.

Keyed by database path, so any StateDB on the same file in this process counts. Other
processes are not reached; their workers find the work at their next (short) poll.
"""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from functools import lru_cache

_waiters: dict[str, set[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = defaultdict(set)


@lru_cache(maxsize=64)
def _key(path: str) -> str:
    # Cached: notify() runs on every submit, and realpath costs a few lstat calls.
    return path if path == ":memory:" else os.path.realpath(path)


def subscribe(path: str, event: asyncio.Event) -> None:
    _waiters[_key(path)].add((asyncio.get_running_loop(), event))


def unsubscribe(path: str, event: asyncio.Event) -> None:
    waiters = _waiters.get(_key(path))
    if waiters is not None:
        for item in [w for w in waiters if w[1] is event]:
            waiters.discard(item)


def notify(path: str) -> None:
    for loop, event in list(_waiters.get(_key(path), ())):
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
