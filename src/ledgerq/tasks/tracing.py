"""OpenTelemetry spans for task runs, when ``opentelemetry-api`` is installed
(``pip install 'ledgerq[otel]'``); without it, nothing here costs more than a check.

A defer records the caller's trace context (W3C ``traceparent``/``tracestate``) in the
run's ``trigger_context``, inside a ``ledgerq.defer <task>`` span (PRODUCER). The worker
runs the task inside a ``ledgerq.run <task>`` span (CONSUMER) whose parent is that
context, so a request's trace shows the task it deferred, whichever host ran it. The
span carries the run's id, queue and attempt, and an exception as a span event with an
error status. Which exporter receives them is the application's OpenTelemetry setup.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

try:
    from opentelemetry import propagate, trace
except ImportError:  # the extra is not installed: no spans
    propagate = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

#: The instrumentation scope spans are created under.
SCOPE = "ledgerq"


def enabled() -> bool:
    return trace is not None


@contextlib.contextmanager
def deferring(task_name: str, queue: str) -> Iterator[dict[str, str] | None]:
    """A PRODUCER span around a defer; yields the trace context to store with the run
    (None without OpenTelemetry)."""
    if trace is None or propagate is None:
        yield None
        return
    tracer = trace.get_tracer(SCOPE)
    with tracer.start_as_current_span(f"ledgerq.defer {task_name}",
                                      kind=trace.SpanKind.PRODUCER,
                                      attributes={"ledgerq.task": task_name,
                                                  "ledgerq.queue": queue}):
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield carrier or None


@contextlib.contextmanager
def running(task_name: str, run: Mapping[str, Any]) -> Iterator[Any]:
    """A CONSUMER span around one run of a task, continuing the trace its defer stored;
    yields the span (None without OpenTelemetry)."""
    if trace is None or propagate is None:
        yield None
        return
    stored = run.get("trigger_context")
    parent = propagate.extract(stored) if isinstance(stored, Mapping) and stored else None
    tracer = trace.get_tracer(SCOPE)
    attributes: dict[str, str | int] = {
        "ledgerq.task": task_name, "ledgerq.run_id": str(run.get("id")),
        "ledgerq.queue": str(run.get("queue", "default")),
        "ledgerq.attempt": int(run.get("run_attempts") or 0) + 1}
    with tracer.start_as_current_span(f"ledgerq.run {task_name}", context=parent,
                                      kind=trace.SpanKind.CONSUMER,
                                      attributes=attributes,
                                      record_exception=True,
                                      set_status_on_exception=True) as span:
        yield span


def failed(span: Any, exc: BaseException | None, detail: str | None) -> None:
    """Mark ``span`` failed: the exception as an event, an error status."""
    if span is None or trace is None:
        return
    if exc is not None:
        span.record_exception(exc)
    span.set_status(trace.Status(trace.StatusCode.ERROR, detail or ""))


__all__ = ["deferring", "enabled", "failed", "running"]
