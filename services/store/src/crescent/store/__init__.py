"""The node-local KV block store daemon (DESIGN §5): a DRAM pool in shared memory, an SSD tier,
block metadata in etcd, served on `store.<node>.ctl` and the data plane. Its client lives in
crescent.storeclient."""
