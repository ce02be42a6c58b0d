"""Least-loaded choice of prefill and decode instances: the first policy, and later a baseline.

Ties break on the instance id, so the same snapshot always gives the same answer.
"""

from __future__ import annotations

from collections.abc import Sequence

from crescent.conductor.policy.snapshot import InstanceSnapshot


def choose_prefill(candidates: Sequence[InstanceSnapshot]) -> InstanceSnapshot | None:
    """The instance whose queue drains soonest (then the shortest queue)."""
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c.queue_time_s, c.num_queued, c.instance_id))


def choose_decode(
    candidates: Sequence[InstanceSnapshot], num_tokens: int
) -> InstanceSnapshot | None:
    """Among instances with KV room for `num_tokens`, the one with the fewest requests."""
    fitting = [c for c in candidates if c.kv_free_tokens >= num_tokens]
    if not fitting:
        return None
    return min(
        fitting, key=lambda c: (c.num_running + c.num_queued, -c.kv_free_tokens, c.instance_id)
    )
