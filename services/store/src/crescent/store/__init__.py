"""The node-local KV block store daemon (DESIGN §5). So far it joins the cluster — registry,
telemetry, health, `store.<node>.ctl` stats; the DRAM/SSD pool arrives with the data-plane issue."""
