"""The conductor's priced instances of one role of one model, kept as columns between decisions.

ClusterView.snapshot runs for both roles on every request. This keeps each instance's snapshot
and its row of the columns a decision reads (policy/columns.py), and redoes only what can have
moved since the last decision: the rows whose telemetry, assignments or price changed
(`dirty`), and all of them once some row's own telemetry is out of the liveness window (from
then on its liveness depends on what the others were heard saying, ClusterView.is_live). Queues
drain with the clock: every row's queue is one vectorised pass per decision over what its last
telemetry reported (scaled by its correction at the last refresh), the time since, and this
conductor's own assignments, instead of a new snapshot per busy instance.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from crescent.conductor.policy.columns import NO_MODEL, InstanceColumns, NodeList, model_terms
from crescent.conductor.policy.decision import CostPredictors
from crescent.conductor.policy.snapshot import InstanceSnapshot

if TYPE_CHECKING:  # the view's state type; cluster_view imports this module
    from crescent.conductor.cluster_view import InstanceState

Key = tuple[str, str]  # (role, instance id)
_min = np.minimum.reduce  # ndarray.min() adds a Python-level wrapper per call
# The columns a row's `fixed` tuple fills, in its order (the lists too are copied on write).
_FIXED_COLUMNS = (
    "is_usable",
    "kv_free",
    "num_running",
    "num_queued",
    "num_context",
    "num_queued_context",
    "model",
    "root",
    "nodes",
)
_NO_ROW = (None,) * len(_FIXED_COLUMNS)


@dataclass
class Refreshed:
    """One instance's snapshot at `now`, and until when its liveness needs no second look."""

    snapshot: InstanceSnapshot
    sure_until: float  # live by its own telemetry until then (-inf: judged from the others')


class RoleColumns:
    """One group's rows, in registry order: the view's states, their snapshots, and the columns
    (numpy arrays updated in place; copies are handed out, and handed out again while no row
    changed)."""

    def __init__(self, members: Mapping[Key, InstanceState]) -> None:
        size = len(members)
        self.states = list(members.values())
        self.position = {key: i for i, key in enumerate(members)}
        self.rows: list[InstanceSnapshot] = []
        self.ids = [instance_id for _, instance_id in members]
        self.nodes = NodeList(state.info.node for state in self.states)
        self.dirty: set[Key] = set()
        self.sure = np.empty(size)  # per row: live by its own telemetry until then (Refreshed)
        # Queue of a row at `now`: max(0, queue_base - max(0, now - received_at)) + assigned,
        # ClusterView._queue_s with the ratio applied at the row's last refresh (queue_base is
        # -inf before any telemetry).
        self.queue_base = np.empty(size)
        self.received_at = np.empty(size)
        # Rows whose queue can be above 0: with none (decode instances report no queue), every
        # queue is 0 at any time and the pass is skipped (zeros, never written, handed out).
        self._queued: set[int] = set()
        self._no_queue = np.zeros(size)
        self.assigned = np.empty(size)
        self.is_usable = np.empty(size, dtype=bool)
        self.kv_free = np.empty(size, dtype=np.int64)
        self.num_running = np.empty(size, dtype=np.int64)
        self.num_queued = np.empty(size, dtype=np.int64)
        self.num_context = np.empty(size, dtype=np.int64)
        self.num_queued_context = np.empty(size, dtype=np.int64)
        self.model = np.empty((size, 4))
        self.root = np.empty(size, dtype=np.int64)
        self.roots: list[CostPredictors] = []
        self._root_position: dict[int, int] = {}
        # Per row, what its columns other than the queue's hold; rows that come back unchanged
        # (most telemetry of a busy prefill moves only its queue) write nothing. The arrays are
        # handed out as they are, and one is copied before a write only if it was handed out
        # since its last copy: an assignment moves one column (KV room), so one is copied.
        self._fixed: list[tuple | None] = [None] * size
        self._lent: set[str] = set()
        self._sure_until: float | None = None  # the smallest of `sure` while known

    @classmethod
    def build(
        cls, members: Mapping[Key, InstanceState], refresh: Callable[[Key], Refreshed]
    ) -> RoleColumns:
        group = cls(members)
        for position, key in enumerate(members):
            entry = refresh(key)
            group.rows.append(entry.snapshot)
            group._set_row(position, entry)
        return group

    @property
    def sure_until(self) -> float:
        """Until then no row's liveness needs a second look (then all are judged again)."""
        if self._sure_until is None:
            self._sure_until = float(_min(self.sure)) if len(self.sure) else float("inf")
        return self._sure_until

    def refresh_dirty(self, refresh: Callable[[Key], Refreshed]) -> None:
        for key in self.dirty:
            position = self.position[key]
            entry = refresh(key)
            self.rows[position] = entry.snapshot
            self._set_row(position, entry)
        self.dirty.clear()

    def columns(self, now: float) -> InstanceColumns:
        """The instances at `now`: every queue drained to `now` in one pass."""
        if self._queued:
            age = np.maximum(now - self.received_at, 0.0)
            queue_s = np.maximum(self.queue_base - age, 0.0) + self.assigned
        else:
            queue_s = self._no_queue
        self._lent.update(_FIXED_COLUMNS)
        return InstanceColumns(
            list(self.rows),
            queue_s,
            self.is_usable,
            self.kv_free,
            self.num_running,
            self.num_queued,
            self.num_context,
            self.num_queued_context,
            self.model,
            self.root,
            list(self.roots),
            self.ids,
            self.nodes,
        )

    def _set_row(self, position: int, entry: Refreshed) -> None:
        kept = self._sure_until
        if kept is not None:  # found again only if the row that held it moved
            self._sure_until = None if self.sure[position] <= kept else min(kept, entry.sure_until)
        self.sure[position] = entry.sure_until
        state, snapshot = self.states[position], entry.snapshot
        queue_base = state.queue_base_s if state.load is not None else -np.inf
        assigned = state.queue_s_assigned_since_load
        self.queue_base[position] = queue_base
        self.received_at[position] = state.load_received_at
        self.assigned[position] = assigned
        if queue_base > 0 or assigned != 0:  # max(<= 0 - age, 0) + 0 is 0 at any time
            self._queued.add(position)
        else:
            self._queued.discard(position)
        fixed = (
            not snapshot.is_stale and snapshot.is_accepting,
            snapshot.kv_capacity_tokens - snapshot.kv_used_tokens,
            snapshot.num_running,
            snapshot.num_queued,
            snapshot.num_context_tokens,
            snapshot.queued_context_tokens,
            model_terms(snapshot.costs),
            self._root_of(snapshot.costs),
            snapshot.node,
        )
        old = self._fixed[position]
        if fixed == old:
            return
        self._fixed[position] = fixed
        for name, value, old_value in zip(_FIXED_COLUMNS, fixed, old or _NO_ROW):
            if value != old_value:
                self._own(name)[position] = value

    def _own(self, name: str) -> Any:
        """The column `name`, copied first if it was handed out since it was last copied."""
        column = getattr(self, name)
        if name in self._lent:
            self._lent.discard(name)
            column = NodeList(column) if isinstance(column, NodeList) else column.copy()
            setattr(self, name, column)
        return column

    def _root_of(self, costs: CostPredictors | None) -> int:
        if costs is None:
            return NO_MODEL
        root = costs.root
        position = self._root_position.get(id(root))
        if position is None:  # the list keeps the object alive, so its id is not reused
            position = self._root_position[id(root)] = len(self.roots)
            self.roots.append(root)
        return position
