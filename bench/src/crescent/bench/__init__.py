"""Benchmarks, trace replay against live endpoints (replay/), the cluster simulator that runs
the conductor's own scheduling code (sim/) and the paper's experiments. Each benchmark writes
{"bench": NAME, "cases": [{"case": NAME, METRIC: NUMBER, ...}]}."""
