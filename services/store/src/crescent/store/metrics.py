"""Prometheus metrics of the store (served on /metrics): what it was asked to replicate, for
whom, and what it copied, so a replication order can be seen to have been carried out; how full
its tiers are; and the KV bytes moved through the store client (in the engines' processes) and
by the store's own pulls, whose rate is the cluster's KV transfer throughput."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

REPLICATIONS = Counter("crescent_store_replications",
                       "Replication pulls into this store, by reason (on-demand, hot-spot) and outcome",
                       ["reason", "outcome"])
REPLICATED_BLOCKS = Counter("crescent_store_replicated_blocks",
                            "Blocks copied into this store from another node's, by reason and source node",
                            ["reason", "source"])

TIER_USED_BYTES = Gauge("crescent_store_used_bytes", "Bytes of this store's blocks, by tier (dram, ssd)", ["tier"])
TIER_CAPACITY_BYTES = Gauge("crescent_store_capacity_bytes", "Bytes this store holds at most, by tier", ["tier"])
KV_TRANSFER_BYTES = Counter("crescent_kv_transfer_bytes",
                            "KV bytes moved to (write) or from (read) a store, by route: mapped (a store on "
                            "this host, copied in place) or data-plane (a store elsewhere, or a store's "
                            "replication pull)", ["op", "route"])
