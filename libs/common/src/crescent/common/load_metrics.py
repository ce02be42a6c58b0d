"""Each instance's own load on its /metrics: the numbers its telemetry carries to the conductors
(queue, running batch, KV in use), so an operator sees per-instance queue and KV use in
Prometheus without reading NATS."""

from __future__ import annotations

from prometheus_client import Gauge

from crescent.common.messages import InstanceLoad

_LABELS = ["role", "instance_id"]

QUEUED = Gauge(
    "crescent_instance_queued_requests", "Requests waiting in this instance's queue", _LABELS
)
RUNNING = Gauge(
    "crescent_instance_running_requests", "Requests this instance is running now", _LABELS
)
QUEUE_SECONDS = Gauge(
    "crescent_instance_queue_seconds",
    "Predicted time to work off this instance's queue (what T_queue is priced from)",
    _LABELS,
)
KV_USED = Gauge(
    "crescent_instance_kv_used_tokens", "Tokens of KV cache in use on this instance", _LABELS
)
KV_CAPACITY = Gauge(
    "crescent_instance_kv_capacity_tokens",
    "Tokens of KV cache this instance holds at most",
    _LABELS,
)


def record_load(load: InstanceLoad) -> None:
    """Set this instance's gauges to what its latest telemetry message says."""
    labels = (load.role, load.instance_id)
    QUEUED.labels(*labels).set(load.num_queued)
    RUNNING.labels(*labels).set(load.num_running)
    QUEUE_SECONDS.labels(*labels).set(load.queue_time_s)
    KV_USED.labels(*labels).set(load.kv_used_tokens)
    KV_CAPACITY.labels(*labels).set(load.kv_capacity_tokens)
