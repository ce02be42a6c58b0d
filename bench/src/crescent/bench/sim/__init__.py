"""The cluster simulator: a discrete-event model of a Crescent cluster scheduled by the
conductor's own Scheduler, ClusterView and policy (see docs/evaluation.md)."""
