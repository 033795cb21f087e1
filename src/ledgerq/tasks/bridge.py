"""Plain synchronous code (a Django view, a Flask handler, a script) calling ledgerq's
async API through one background event loop per app.

``asyncio.run`` per call would open and close the database every time (tens of ms on
PostgreSQL); instead each app keeps one loop in a daemon thread, started on first use,
where its database handle lives, and every sync call is a coroutine handed to that loop
(``run_coroutine_threadsafe``) and waited for. Many threads may call at once: the loop
interleaves their coroutines, as it would concurrent requests.

A sync call from inside a running event loop would block that loop until the call
completes (and deadlock if the work needed it): it is refused with an error that names
the async spelling instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ledgerq.errors import LedgerqError

T = TypeVar("T")


class SyncCallInEventLoop(LedgerqError, RuntimeError):
    """A synchronous ledgerq call was made from a thread whose event loop is running."""


class LoopThread:
    """One event loop in a daemon thread, started on first use, stopped by :meth:`close`."""

    def __init__(self, name: str = "ledgerq-sync") -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, started if it is not running yet."""
        with self._lock:
            if self._loop is None:
                ready = threading.Event()
                loop = asyncio.new_event_loop()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=serve, name=self.name, daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    def in_loop_thread(self) -> bool:
        return self._thread is not None and threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, T], *, what: str,
            timeout: float | None = None) -> T:
        """Run ``coro`` on the background loop and wait for its result (or exception).

        ``what`` names the sync call for the error raised inside a running loop (e.g.
        ``"TaskRun.result()"``, whose async spelling is ``await run.result()``).
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise SyncCallInEventLoop(
                f"{what} is the synchronous API and this thread runs an event loop, which "
                "it would block: use the async form (await ...) in async code")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():  # the coroutine's own TimeoutError (the same class)
                raise
            future.cancel()
            raise TimeoutError(f"{what} did not finish within {timeout} s") from None

    def close(self) -> None:
        """Stop the loop and join its thread (pending coroutines are cancelled)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return

        async def cancel_rest() -> None:
            current = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not current]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel_rest(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


__all__ = ["LoopThread", "SyncCallInEventLoop"]
