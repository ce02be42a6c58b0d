"""OpenTelemetry setup and W3C trace context in NATS headers.

Spans go to an OTLP/HTTP collector (Jaeger in the dev cluster) when
OTEL_EXPORTER_OTLP_ENDPOINT is set; otherwise tracing still runs, so context propagates
through every hop, but nothing is exported.
"""

from __future__ import annotations

import functools
import os

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

TRACER_NAME = "crescent"


def setup_tracing(service: str, instance_id: str) -> TracerProvider:
    """Install the global tracer provider for this process and return it (shut it down on exit)."""
    resource = Resource.create(
        {"service.name": f"crescent-{service}", "service.instance.id": instance_id}
    )
    provider = TracerProvider(resource=resource)
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    return provider


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
