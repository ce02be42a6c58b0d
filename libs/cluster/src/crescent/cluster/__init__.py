"""Runs a Crescent cluster on one machine: NATS and etcd from their pip packages, then the
services as child processes, each with its own log, restarted if it crashes."""
