"""A process that exports no spans records none, yet passes a trace on: its spans carry the
caller's trace (or start one), sampled, so a downstream service that exports joins it."""

from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider

from crescent.common import tracing

CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_without_an_exporter_spans_record_nothing_and_carry_the_callers_trace(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.setattr(trace, "set_tracer_provider", lambda provider: None)
    tracer = tracing.setup_tracing("test", "t-0").get_tracer("crescent")

    context = tracing.extract_headers({"traceparent": CALLER})
    with tracer.start_as_current_span("served", context) as span:
        span.set_attribute("crescent.request_id", "r-1")
        assert not span.is_recording()
        headers = tracing.inject_headers()
    trace_id, span_id, flags = headers["traceparent"].split("-")[1:]
    assert trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert span_id != "b7ad6b7169203331" and flags == "01"

    with tracer.start_as_current_span("root") as root:
        with tracer.start_as_current_span("child") as child:
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
    assert root.get_span_context().is_valid
    assert child.get_span_context().trace_id == root.get_span_context().trace_id
    assert child.get_span_context().trace_flags.sampled
    assert carrier["traceparent"].split("-")[1] == format(root.get_span_context().trace_id, "032x")


def test_with_an_exporter_spans_are_recorded(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setattr(trace, "set_tracer_provider", lambda provider: None)
    provider = tracing.setup_tracing("test", "t-0")
    try:
        assert isinstance(provider, TracerProvider)
        # not ended, so nothing is queued for the unreachable collector at shutdown
        assert provider.get_tracer("crescent").start_span("recorded").is_recording()
    finally:
        provider.shutdown()
