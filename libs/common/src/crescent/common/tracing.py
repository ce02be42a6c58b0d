"""OpenTelemetry setup and W3C trace context in NATS headers.

Spans go to an OTLP/HTTP collector (Jaeger in the dev cluster) when
OTEL_EXPORTER_OTLP_ENDPOINT is set. Otherwise the process records nothing, but every span it
starts still carries a trace context on through every hop, so a service downstream that does
export puts its spans in the request's one trace.

Every request crosses several services, each reading and writing the trace context of each
message and starting a few spans, so both are done here without OpenTelemetry's generic
machinery where the result is the same: with the default propagators (W3C trace context and
baggage), a context of a trace id and a span id alone is written and read as its `traceparent`
header directly, and a non-recording span is made current by one context attach. Anything else
(a tracestate, baggage, other propagators in OTEL_PROPAGATORS) goes through OpenTelemetry's.
"""

from __future__ import annotations

import functools
import os
import random

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TRACER_NAME = "crescent"
TRACEPARENT = "traceparent"
_DEFAULT_PROPAGATORS = {"tracecontext,baggage", "tracecontext", "baggage,tracecontext"}
_LOWER_HEX = frozenset("0123456789abcdef")


def _is_exporting() -> bool:
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def setup_tracing(service: str, instance_id: str) -> trace.TracerProvider:
    """Install the global tracer provider for this process and return it (shut it down on exit):
    the SDK's, exporting, where a collector is configured; else one that only propagates."""
    if not _is_exporting():
        provider: trace.TracerProvider = PropagatingTracerProvider()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        resource = Resource.create(
            {"service.name": f"crescent-{service}", "service.instance.id": instance_id}
        )
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


class PropagatingTracer(trace.Tracer):
    """Spans that record nothing but carry a sampled context: the parent's trace (or a new
    one) under a new span id. The SDK's spans, built, sampled and ended for no exporter, took
    ~7 % of the conductor's py-spy samples one request at a time (bench control-plane)."""

    def start_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        *args: object,
        **kwargs: object,
    ) -> trace.Span:
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            trace_id, flags = parent.trace_id, parent.trace_flags
        else:
            trace_id, flags = random.getrandbits(128), trace.TraceFlags(trace.TraceFlags.SAMPLED)
        span_context = trace.SpanContext(
            trace_id, random.getrandbits(64) or 1, is_remote=False, trace_flags=flags
        )
        return trace.NonRecordingSpan(span_context)

    def start_as_current_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        *args: object,
        **kwargs: object,
    ) -> CurrentSpan:
        return CurrentSpan(self.start_span(name, context))


class CurrentSpan:
    """`span` current while the block runs. A span that records nothing has nothing to end
    or record an error in, so this is trace.use_span less its generator and those steps."""

    __slots__ = ("_token", "span")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self._token: object = None

    def __enter__(self) -> trace.Span:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, *exc_info: object) -> None:
        otel_context.detach(self._token)


class PropagatingTracerProvider(trace.TracerProvider):
    def __init__(self) -> None:
        self._tracer = PropagatingTracer()

    def get_tracer(self, *args: object, **kwargs: object) -> trace.Tracer:
        return self._tracer

    def shutdown(self) -> None:
        """Nothing buffered, nothing to flush."""


@functools.cache
def tracer() -> trace.Tracer:
    """One tracer per process: get_tracer builds a new one on every call, and the request path
    asks for it several times per request. Before setup_tracing it is OpenTelemetry's proxy,
    which follows the provider once one is set."""
    return trace.get_tracer(TRACER_NAME)


@functools.cache
def _is_default_propagation() -> bool:
    """Whether the process propagates what OpenTelemetry does by default: OTEL_PROPAGATORS,
    which OpenTelemetry reads once at import, unset or naming W3C trace context (and baggage)."""
    configured = os.environ.get("OTEL_PROPAGATORS", "tracecontext,baggage")
    return configured.replace(" ", "").lower() in _DEFAULT_PROPAGATORS


def inject_headers() -> dict[str, str] | None:
    """The current trace context as NATS headers, or None when there is no active span."""
    span_context = trace.get_current_span().get_span_context()
    if (
        span_context.is_valid
        and not span_context.trace_state
        and _is_default_propagation()
        and not baggage.get_all()
    ):
        return {
            TRACEPARENT: f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-"
            f"{span_context.trace_flags:02x}"
        }
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def extract_headers(headers: dict[str, str] | None) -> otel_context.Context:
    """The context the headers carry: a remote span's, or an empty one."""
    if not headers:
        return otel_context.Context()
    if len(headers) == 1 and _is_default_propagation():
        span_context = _parse_traceparent(headers.get(TRACEPARENT))
        if span_context is not None:
            return trace.set_span_in_context(
                trace.NonRecordingSpan(span_context), otel_context.Context()
            )
    return propagate.extract(headers)


def _parse_traceparent(header: str | None) -> trace.SpanContext | None:
    """A version-00 `traceparent` as inject_headers writes it; None for anything else (which
    OpenTelemetry's propagator then reads as the standard says)."""
    if header is None or len(header) != 55 or not header.startswith("00-"):
        return None
    if header[35] != "-" or header[52] != "-":
        return None
    trace_hex, span_hex, flags_hex = header[3:35], header[36:52], header[53:]
    if not _LOWER_HEX.issuperset(trace_hex + span_hex + flags_hex):  # int() takes more
        return None
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not (trace_id and span_id):
        return None
    flags = trace.TraceFlags(int(flags_hex, 16))
    return trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)
