"""OpenTelemetry setup and W3C trace context in NATS headers.

Spans go to an OTLP/HTTP collector (Jaeger in the dev cluster) when
OTEL_EXPORTER_OTLP_ENDPOINT is set. Otherwise the process records nothing, but every span it
starts still carries a trace context on through every hop, so a service downstream that does
export puts its spans in the request's one trace.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
from collections.abc import Iterator

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TRACER_NAME = "crescent"


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

    @contextlib.contextmanager
    def start_as_current_span(
        self,
        name: str,
        context: otel_context.Context | None = None,
        *args: object,
        end_on_exit: bool = True,
        **kwargs: object,
    ) -> Iterator[trace.Span]:
        span = self.start_span(name, context)
        with trace.use_span(span, end_on_exit=end_on_exit) as current:
            yield current


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


def inject_headers() -> dict[str, str] | None:
    """The current trace context as NATS headers, or None when there is no active span."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None


def extract_headers(headers: dict[str, str] | None) -> otel_context.Context:
    return propagate.extract(headers or {})
