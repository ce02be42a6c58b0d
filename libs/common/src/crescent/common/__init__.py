"""Code every Crescent service shares: configuration, wire messages, the NATS bus, the etcd
keyspace, block hashing, tracing, logs and the service lifecycle."""
