"""Prometheus metrics of the conductor (served on /metrics)."""

from __future__ import annotations

import functools

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

PREDICTION_ERROR_BUCKETS = (
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.125,
    0.15,
    0.2,
    0.25,
    0.3,
    0.4,
    0.5,
    0.6,
    0.8,
    1,
    1.5,
    2,
    3,
    5,
    10,
)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

REQUESTS = Counter(
    "crescent_requests", "Requests finished, by endpoint and outcome", ["endpoint", "outcome"]
)
INFLIGHT = Gauge("crescent_inflight_requests", "Requests being served now")
TTFT = Histogram("crescent_ttft_seconds", "Time to first token", buckets=_LATENCY_BUCKETS)
TBT = Histogram("crescent_tbt_seconds", "Time between tokens", buckets=_LATENCY_BUCKETS)
E2E = Histogram("crescent_request_seconds", "Whole request latency", buckets=_LATENCY_BUCKETS)
PROMPT_TOKENS = Counter("crescent_prompt_tokens", "Prompt tokens received")
GENERATED_TOKENS = Counter("crescent_generated_tokens", "Tokens generated")
INSTANCES = Gauge("crescent_live_instances", "Live instances by role", ["role"])
REJECTED = Counter(
    "crescent_rejected_requests", "Requests turned away by admission, by reason", ["reason"]
)
IMBALANCE = Gauge(
    "crescent_pd_imbalance_factor",
    "P/D imbalance factor f_im (>1: add decode, <1: add prefill)",
    ["model"],
)
CACHE_HIT_RATE = Gauge(
    "crescent_cache_hit_rate",
    "Share of the prompt tokens computed so far (by prefill instances, or by decode instances "
    "under conditional disaggregation) that were loaded from a cache",
)
PROMPT_TOKENS_PREFILLED = Counter(
    "crescent_prefilled_prompt_tokens",
    "Prompt tokens of finished prefills and of prompts computed on decode instances",
)
PREFIX_TOKENS = Counter(
    "crescent_prefix_tokens",
    "Prompt tokens reused from a cache: as planned (prefills), and as loaded (prefills and "
    "prompts computed on decode instances)",
    ["kind"],
)
REPLICATION_ORDERS = Counter(
    "crescent_replication_orders",
    "Replication orders, by reason (on-demand: a planned pull, carried out by the "
    "prefill's store; hot-spot: sent by this conductor) and outcome "
    "(planned, ok, failed)",
    ["reason", "outcome"],
)
REPLICATED_BLOCKS = Counter(
    "crescent_replication_order_blocks",
    "Blocks named in replication orders (on-demand: planned; hot-spot: copied)",
    ["reason"],
)
MIGRATIONS = Counter(
    "crescent_request_migrations",
    "Requests moved to another instance, by stage and cause",
    ["stage", "cause"],
)
REJOINS = Counter(
    "crescent_rejoins",
    "Requests read on from their instance after it left the cluster and came back in the same "
    "process (paused or cut off past its lease) while no other could take them, by role",
    ["role"],
)
STREAM_RESENDS = Counter(
    "crescent_stream_resends",
    "Token streams asked for their chunks again after a NATS drop, by outcome: resent (read "
    "on, on the same decode instance), or unanswered, unknown, refused (the request moved)",
    ["outcome"],
)
PREFILL_RESULT_ASKS = Counter(
    "crescent_prefill_result_asks",
    "Prefill results asked for again after a NATS drop lost the wait for the reply, by "
    "outcome: answered (no prompt computed again), failed (the job's own error), or unknown, "
    "unanswered (the request moved)",
    ["outcome"],
)
DECODE_REFUSALS = Counter(
    "crescent_decode_refusals",
    "Decode reservations refused after placement (the room went to another conductor's request, "
    "or the instance began to drain): the request is placed again without that instance",
)
PREFILL_ON_DECODE = Counter(
    "crescent_prefill_on_decode",
    "Requests whose decode instance computed the prompt itself (conditional disaggregation)",
)
PREDICTION_ERROR = Histogram(
    "crescent_prediction_abs_error_ratio",
    "|predicted − measured| / measured, per request: ttft (placement to first "
    "token against T_transfer + T_queue + T_prefill) and tbt (the mean gap between "
    "the tokens after the first chunk, timed by decode's own step times with pauses "
    "left out, against the TBT predicted at placement); prediction: published (the "
    "instance's published cost model alone) "
    "or corrected (as placed: that model corrected online); ttft_queue, ttft_compute, "
    "ttft_overhead: one term of the corrected TTFT (wait before the compute, the compute, "
    "messaging), its |predicted − measured| over the measured TTFT",
    ["kind", "prediction"],
    buckets=PREDICTION_ERROR_BUCKETS,
)
DESIRED_INSTANCES = Gauge(
    "crescent_desired_instances",
    "Instances of each role the P/D ratio controller wants for a model (scale by this)",
    ["model", "role"],
)
SLO_ATTAINMENT = Gauge(
    "crescent_slo_attainment",
    "Share of the last controller window's first tokens within the TTFT SLO (ttft) and "
    "token gaps within the TBT SLO (tbt); rejections count as misses",
    ["model", "slo"],
)


@functools.cache
def labelled(metric: MetricWrapperBase, *values: str) -> MetricWrapperBase:
    """`metric.labels(*values)`, kept: labels() takes a lock and builds its key on every call,
    and the request path asks for the same few series on every request."""
    return metric.labels(*values)
