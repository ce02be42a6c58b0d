"""The client side of the cluster's KV stores, for every process that reads or writes blocks
(engines, the prefill worker's planned pulls, the store daemon's own view of its peers)."""
