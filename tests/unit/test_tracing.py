"""A process that exports no spans records none, yet passes a trace on: its spans carry the
caller's trace (or start one), sampled, so a downstream service that exports joins it."""

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

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


W3C = TraceContextTextMapPropagator()
# what a traceparent can be: the standard's form, and near misses of it (uppercase, a digit
# more or less, another version, zeros, padding, a suffix)
_LOWER = "0123456789abcdef"
_MIXED = _LOWER + "ABCDEF"


def _hex(size: int) -> st.SearchStrategy[str]:
    exact = st.text(_LOWER, min_size=size, max_size=size)
    return st.one_of(exact, exact, st.text(_MIXED, min_size=size - 1, max_size=size + 1))


_TRACEPARENTS = st.one_of(
    st.builds(
        lambda version, trace_id, span_id, flags: f"{version}-{trace_id}-{span_id}-{flags}",
        st.sampled_from(["00", "00", "01", "ff", "0g"]),
        _hex(32),
        _hex(16),
        _hex(2),
    ),
    st.just("00-" + "0" * 32 + "-b7ad6b7169203331-01"),
    st.just("00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01"),
    st.just(" " + CALLER),
    st.just(CALLER + "-extra"),
    st.text(max_size=60),
)


def _span_context_of(context) -> trace.SpanContext:
    return trace.get_current_span(context).get_span_context()


@given(_TRACEPARENTS)
def test_a_traceparent_reads_as_opentelemetrys_propagator_reads_it(header):
    assert _span_context_of(tracing.extract_headers({"traceparent": header})) == (
        _span_context_of(W3C.extract({"traceparent": header}))
    )


@given(
    st.integers(1, 2**128 - 1),
    st.integers(1, 2**64 - 1),
    st.integers(0, 255),
)
def test_a_span_writes_the_traceparent_opentelemetrys_propagator_writes(trace_id, span_id, flags):
    span = trace.NonRecordingSpan(
        trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=trace.TraceFlags(flags))
    )
    with tracing.CurrentSpan(span):
        expected: dict[str, str] = {}
        W3C.inject(expected)
        assert tracing.inject_headers() == expected
    assert tracing.extract_headers(expected) is not None
    assert _span_context_of(tracing.extract_headers(expected)).trace_id == trace_id


def test_baggage_and_tracestate_still_go_through_opentelemetry():
    headers = {"traceparent": CALLER, "tracestate": "vendor=1", "baggage": "user=7"}
    context = tracing.extract_headers(headers)
    assert _span_context_of(context).trace_state.to_header() == "vendor=1"
    token = otel_context.attach(context)
    try:
        assert tracing.inject_headers() == headers
    finally:
        otel_context.detach(token)


def test_no_headers_mean_an_empty_context():
    assert tracing.extract_headers(None) == otel_context.Context()
    assert tracing.extract_headers({}) == otel_context.Context()
    assert not _span_context_of(tracing.extract_headers({"traceparent": "junk"})).is_valid
