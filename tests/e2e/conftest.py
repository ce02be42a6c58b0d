"""A real dev cluster (all services as processes) shared by the e2e tests of a module, with an
OTLP/HTTP receiver standing in for Jaeger so the tests can read every exported span."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port


class OtlpReceiver:
    """Collects spans that services export over OTLP/HTTP (protobuf)."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                receiver._add(request)
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            for resource_spans in request.resource_spans:
                service = next(
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                )
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        self.spans.append(
                            {
                                "name": span.name,
                                "service": service,
                                "trace_id": span.trace_id.hex(),
                                "span_id": span.span_id.hex(),
                                "parent_id": span.parent_span_id.hex(),
                                "start": span.start_time_unix_nano,
                                "end": span.end_time_unix_nano,
                                "attributes": {a.key: a.value for a in span.attributes},
                            }
                        )

    def trace_of(self, request_id: str) -> list[dict]:
        with self._lock:
            roots = [
                s
                for s in self.spans
                if s["name"] == "conductor.request"
                and s["attributes"].get("crescent.request_id") is not None
                and s["attributes"]["crescent.request_id"].string_value == request_id
            ]
            if not roots:
                return []
            return [s for s in self.spans if s["trace_id"] == roots[0]["trace_id"]]


@pytest.fixture(scope="module")
def otlp():
    receiver = OtlpReceiver()
    receiver.thread.start()
    yield receiver
    receiver.server.shutdown()


@pytest.fixture(scope="module")
def dev_cluster(tmp_path_factory, otlp):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("cluster"),
        api_port=free_port(),
        env=env,
        engine_args=["--emulated-time-scale", "0.05"],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()
