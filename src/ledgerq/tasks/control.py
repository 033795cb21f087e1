"""What a task raises to say how its run should go on: :class:`Retry` or :class:`Fail`.

Any other exception is a failure its retry policy may try again (filtered by the task's
``retry_on`` / ``no_retry_on``); these two decide it themselves.
"""

from __future__ import annotations

from ledgerq.durations import check_span


class Retry(Exception):
    """Try the run again, after ``delay`` seconds (None: the retry policy's backoff).

    It counts as an attempt: a run whose policy has none left fails with this message.
    A task without a retry policy cannot retry; its run fails, saying so.
    """

    def __init__(self, message: str = "retry requested", *, delay: float | None = None
                 ) -> None:
        if delay is not None:
            check_span(delay, "Retry(delay=)")
        super().__init__(message)
        self.delay = delay


class Fail(Exception):
    """Fail the run now, without retrying, whatever its retry policy says."""


__all__ = ["Fail", "Retry"]
