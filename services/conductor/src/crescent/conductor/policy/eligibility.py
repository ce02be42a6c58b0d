"""Which instances may get work at all. Every policy filters through here first, so none can
pick a stale, draining or full instance whatever its scoring says."""

from __future__ import annotations

from collections.abc import Sequence

from crescent.conductor.policy.snapshot import InstanceSnapshot


def is_usable(snapshot: InstanceSnapshot) -> bool:
    return not snapshot.is_stale and snapshot.is_accepting


def eligible_prefill(snapshots: Sequence[InstanceSnapshot]) -> list[InstanceSnapshot]:
    """Live prefill instances that take work. Prefill queues requests, so its KV room is not a
    filter here: "full" is the instance's own verdict (`is_accepting`)."""
    return [s for s in snapshots if not s.is_stale and s.is_accepting]


def eligible_decode(
    snapshots: Sequence[InstanceSnapshot], num_kv_tokens: int
) -> list[InstanceSnapshot]:
    """Live decode instances with KV room for the whole request (prompt + max output)."""
    return [
        s
        for s in snapshots
        if not s.is_stale
        and s.is_accepting
        and s.kv_capacity_tokens - s.kv_used_tokens >= num_kv_tokens
    ]
