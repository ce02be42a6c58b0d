"""Prometheus metrics of the store (served on /metrics): what it was asked to replicate, for
whom, and what it copied, so a replication order can be seen to have been carried out."""

from __future__ import annotations

from prometheus_client import Counter

REPLICATIONS = Counter("crescent_store_replications",
                       "Replication pulls into this store, by reason (on-demand, hot-spot) and outcome",
                       ["reason", "outcome"])
REPLICATED_BLOCKS = Counter("crescent_store_replicated_blocks",
                            "Blocks copied into this store from another node's, by reason and source node",
                            ["reason", "source"])
