"""Benchmarks, trace replay and reports. Each benchmark writes
{"bench": NAME, "cases": [{"case": NAME, METRIC: NUMBER, ...}]}."""
