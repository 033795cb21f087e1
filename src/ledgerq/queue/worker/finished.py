"""What an executor may say about how its run ended, beyond the ADR-0071 ``(exit_code, detail)``.

A subprocess has an exit code and a stderr tail; a Python task has a return value, an
exception with a traceback, and an opinion on whether trying again could help. An
executor returns :class:`Finished` to say so; the plain pair still works and means what
it always did.
"""

from __future__ import annotations

from typing import Any, NamedTuple


class Finished(NamedTuple):
    """How a run's executor ended it, as the worker records it.

    A plain tuple (one per run, like :class:`~ledgerq.queue.worker.outcomes.Outcome`).
    """

    #: 0: the run completed; anything else: it failed.
    exit_code: int
    #: Why it failed, one line (``error_detail``); None on success.
    detail: str | None = None
    #: The return value as JSON (the run's ``result`` column); None: no value.
    result: Any = None
    #: A failure as ``{"type", "message", "traceback"}`` (the run's ``error`` column).
    error: dict[str, Any] | None = None
    #: Whether the run's retry policy may try a failure again: False for a failure no
    #: attempt can fix (``Fail``, arguments that no longer decode).
    retryable: bool = True
    #: Seconds until the retry, when the task asked for one (``Retry(delay=)``); None:
    #: the retry policy's backoff.
    retry_delay: float | None = None
    #: The exception itself, for the app's hooks in this process; never stored.
    exception: BaseException | None = None


__all__ = ["Finished"]
