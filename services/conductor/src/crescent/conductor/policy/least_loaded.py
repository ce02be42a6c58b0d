"""Least-loaded choice of prefill and decode instances: the first policy, and later a baseline.

Ties break on the instance id, so the same snapshot always gives the same answer. Handed the
view's columns of more than a handful of instances, each key narrows the rows in numpy and
only rows tied on every key are compared by id in Python; the choice is the one the plain
comparison of snapshots makes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crescent.conductor.policy.columns import InstanceColumns
from crescent.conductor.policy.snapshot import InstanceSnapshot

# Up to this many instances they are compared as snapshots: numpy calls cost more than that.
COMPARE_SNAPSHOTS_UP_TO = 16


def choose_prefill(candidates: Sequence[InstanceSnapshot]) -> InstanceSnapshot | None:
    """The instance whose queue drains soonest (then the shortest queue)."""
    if not candidates:
        return None
    if isinstance(candidates, InstanceColumns) and len(candidates) > COMPARE_SNAPSHOTS_UP_TO:
        rows = _least(np.arange(len(candidates)), (candidates.queue_s, candidates.num_queued))
        return candidates[min(rows.tolist(), key=candidates.id_of)]
    return min(candidates, key=lambda c: (c.queue_time_s, c.num_queued, c.instance_id))


def choose_decode(
    candidates: Sequence[InstanceSnapshot], num_tokens: int
) -> InstanceSnapshot | None:
    """Among instances with KV room for `num_tokens`, the one with the fewest requests."""
    if isinstance(candidates, InstanceColumns) and len(candidates) > COMPARE_SNAPSHOTS_UP_TO:
        position = decode_position(candidates, num_tokens)
        return None if position is None else candidates[position]
    fitting = [c for c in candidates if c.kv_free_tokens >= num_tokens]
    if not fitting:
        return None
    return min(
        fitting, key=lambda c: (c.num_running + c.num_queued, -c.kv_free_tokens, c.instance_id)
    )


def decode_position(columns: InstanceColumns, num_tokens: int) -> int | None:
    """choose_decode's pick among the rows of `columns`, as its row (None: none fits)."""
    rows = (columns.kv_free >= num_tokens).nonzero()[0]
    if not len(rows):
        return None
    rows = _least(rows, (columns.num_running + columns.num_queued, -columns.kv_free))
    return min(rows.tolist(), key=columns.id_of)


def _least(rows: np.ndarray, keys: Sequence[np.ndarray]) -> np.ndarray:
    """The rows (positions, never empty) with the least value of each key in turn."""
    for key in keys:
        values = key[rows]
        rows = rows[values == np.minimum.reduce(values)]
        if len(rows) == 1:
            break
    return rows
