"""Prometheus metrics of the store (served on /metrics): what it was asked to replicate, for
whom, and what it copied, so a replication order can be seen to have been carried out; and how
full its tiers are. The KV bytes its replication pulls move are counted with the store client's
(crescent.storeclient.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

REPLICATIONS = Counter(
    "crescent_store_replications",
    "Replication pulls into this store, by reason (on-demand, hot-spot) and outcome",
    ["reason", "outcome"],
)
REPLICATED_BLOCKS = Counter(
    "crescent_store_replicated_blocks",
    "Blocks copied into this store from another node's, by reason and source node",
    ["reason", "source"],
)

TIER_USED_BYTES = Gauge(
    "crescent_store_used_bytes", "Bytes of this store's blocks, by tier (dram, ssd)", ["tier"]
)
TIER_CAPACITY_BYTES = Gauge(
    "crescent_store_capacity_bytes", "Bytes this store holds at most, by tier", ["tier"]
)
