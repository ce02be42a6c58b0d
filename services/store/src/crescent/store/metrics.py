"""Prometheus metrics of the store (served on /metrics): what it was asked to replicate, for
whom, and what it copied, so a replication order can be seen to have been carried out; how
full its tiers are; how far its block metadata in etcd trails its commits; and how long
lookups waited for blocks still being written. The KV bytes its replication pulls move are
counted with the store client's (crescent.storeclient.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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

METADATA_PENDING_KEYS = Gauge(
    "crescent_store_metadata_pending_keys",
    "Block metadata changes (etcd keys) committed here and not yet written to etcd",
)
METADATA_LAG = Histogram(
    "crescent_store_metadata_lag_seconds",
    "Per written batch of block metadata: time from its oldest change to its write in etcd",
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
METADATA_LAST_LAG = Gauge(
    "crescent_store_metadata_last_lag_seconds",
    "Lag (oldest change to write in etcd) of the last batch of block metadata written",
)

LOOKUP_WAIT = Histogram(
    "crescent_store_lookup_wait_seconds",
    "Per lookup allowed to wait for blocks still being written (a decode's, asked right after "
    "its prefill's first token): seconds it waited for them; 0 when none was being written",
    buckets=(0.0, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
