"""Scheduling policy: plain functions over snapshots, no I/O, time passed in (STYLE 2), so the
cluster simulator runs exactly the code the conductor runs."""
