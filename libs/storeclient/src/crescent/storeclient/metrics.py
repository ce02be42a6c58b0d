"""The KV bytes moved to or from a store, counted by every process that moves them (an engine
through its store client, a store daemon by its replication pulls): their rate is the
cluster's KV transfer throughput. One counter, defined once, because a Prometheus registry
refuses a second metric of the same name in one process."""

from __future__ import annotations

from prometheus_client import Counter

KV_TRANSFER_BYTES = Counter(
    "crescent_kv_transfer_bytes",
    "KV bytes moved to (write) or from (read) a store, by route: mapped (a store on "
    "this host, copied in place) or data-plane (a store elsewhere, or a store's "
    "replication pull)",
    ["op", "route"],
)
