"""OpenTelemetry: a run's span continues the trace of the code that deferred it, with
the SDK's in-memory exporter."""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ledgerq import App

EXPORTER = InMemorySpanExporter()


@pytest.fixture(scope="module", autouse=True)
def provider() -> None:
    # The global provider can be set once per process: set here for this module.
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(tracer_provider)


async def test_a_runs_span_continues_the_deferring_trace(tmp_path: Path) -> None:
    EXPORTER.clear()
    app = App(str(tmp_path / "otel.db"))

    @app.task(name="traced.ok")
    async def ok(n: int) -> int:
        return n

    @app.task(name="traced.bad")
    def bad() -> None:
        raise ValueError("traced failure")

    tracer = trace.get_tracer("test")
    async with app:
        with tracer.start_as_current_span("request") as request:
            await ok.defer_async(n=1)
            await bad.defer_async()
        await app.drain()
    spans = {s.name: s for s in EXPORTER.get_finished_spans()}
    trace_id = request.get_span_context().trace_id
    run_ok, run_bad = spans["ledgerq.run traced.ok"], spans["ledgerq.run traced.bad"]
    defer_ok = spans["ledgerq.defer traced.ok"]
    assert defer_ok.kind is SpanKind.PRODUCER and run_ok.kind is SpanKind.CONSUMER
    assert {s.context.trace_id for s in (defer_ok, run_ok, run_bad)} == {trace_id}
    assert run_ok.parent is not None and run_ok.parent.span_id == defer_ok.context.span_id
    assert run_ok.attributes["ledgerq.task"] == "traced.ok"
    assert run_ok.attributes["ledgerq.attempt"] == 1
    assert run_bad.status.status_code is StatusCode.ERROR
    assert any(e.name == "exception" for e in run_bad.events)
