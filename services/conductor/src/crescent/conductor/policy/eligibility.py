"""Which instances may get work at all. Every policy filters through here first, so none can
pick a stale, draining or full instance whatever its scoring says."""

from __future__ import annotations

from collections.abc import Sequence

from crescent.conductor.policy.columns import InstanceColumns
from crescent.conductor.policy.snapshot import InstanceSnapshot


def eligible_prefill(snapshots: Sequence[InstanceSnapshot]) -> InstanceColumns:
    """Live prefill instances that take work. Prefill queues requests, so its KV room is not a
    filter here: "full" is the instance's own verdict (`is_accepting`)."""
    columns = InstanceColumns.of(snapshots)
    return columns.where(columns.is_usable)


def eligible_decode(snapshots: Sequence[InstanceSnapshot], num_kv_tokens: int) -> InstanceColumns:
    """Live decode instances with KV room for the whole request (prompt + max output)."""
    columns = InstanceColumns.of(snapshots)
    return columns.where(columns.is_usable & (columns.kv_free >= num_kv_tokens))
