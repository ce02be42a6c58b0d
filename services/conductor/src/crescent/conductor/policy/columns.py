"""Instances as columns: what a decision reads of hundreds of instances, one numpy array a field.

A decision at 512 prefill + 512 decode instances that visits each instance's snapshot in Python
spends most of its time on the visits (~1 µs each, several passes). Kept as columns, the
filters, the queue times that drain with the clock and the bounds of Algorithm 1 are a few
vectorised passes, and Python touches only the rows a policy picks. The conductor's view keeps
these columns up to date between decisions (view_cache); a policy handed plain snapshots (the
simulator's tests, the reference tests) builds them with `InstanceColumns.of`, so both run the
same code.

InstanceColumns is also a Sequence of InstanceSnapshot: the baselines, which visit every
instance anyway, read it as a list. A row's snapshot carries the queue time of its column
(the view does not rebuild a snapshot when only its queue has drained).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from itertools import repeat
from typing import overload

import msgspec
import numpy as np

from crescent.common.block_index import NodeSlots, PrefixMatch
from crescent.conductor.policy.bandwidth import BandwidthTable
from crescent.conductor.policy.decision import CostPredictors
from crescent.conductor.policy.snapshot import InstanceSnapshot

NO_MODEL = -1  # `root` of a row whose snapshot carries no cost model: the policy's default

_replace = msgspec.structs.replace
# ufuncs called directly: ndarray.all() and .any() add a Python-level wrapper per call
_all, _any = np.logical_and.reduce, np.logical_or.reduce
# Up to this many sources of a pull, each row's rate is that of its fastest link from them.
FEW_SOURCES = 4
_NO_MODEL_TERMS = (1.0, 0.0, 1.0, float("nan"))  # one object: equal to itself despite the NaN


class NodeList(list[str]):
    """The rows' nodes, with their bits in the block index's masks (NodeSlots) as last looked
    up: the view hands out the same list while no row's node changes, so a decision reads every
    row's prefix length from a match with two numpy calls instead of a dict lookup a row. Not
    written to once handed out (the view copies it first)."""

    __slots__ = ("_rows_of", "_slots", "_slots_of")

    def __init__(self, nodes: Iterable[str] = ()) -> None:
        super().__init__(nodes)
        self._slots_of: NodeSlots | None = None
        self._slots = np.empty(0, np.int64)
        self._rows_of: dict[str, list[int]] | None = None

    def rows_of(self) -> dict[str, list[int]]:
        """Node → the rows on it (kept: the list is not written to once handed out)."""
        if self._rows_of is None:
            self._rows_of = {}
            for row, node in enumerate(self):
                self._rows_of.setdefault(node, []).append(row)
        return self._rows_of

    def slots_in(self, node_slots: NodeSlots) -> np.ndarray:
        """Each node's bit in `node_slots`; `num_slots` for a node the index does not know."""
        if self._slots_of is not node_slots:
            self._slots = np.array(
                list(map(node_slots.slot_of.get, self, repeat(node_slots.num_slots))), np.int64
            )
            self._slots_of = node_slots
        return self._slots


def model_terms(costs: CostPredictors | None) -> tuple[float, float, float, float]:
    """(prefill ratio, prefill overhead, decode ratio, KV bytes per token) of a row's model;
    NaN bytes for none (the policy's default fills it in)."""
    if costs is None:
        return _NO_MODEL_TERMS
    return (
        costs.prefill_ratio,
        costs.prefill_overhead_s,
        costs.decode_ratio,
        costs.kv_bytes_per_token,
    )


class InstanceColumns(Sequence[InstanceSnapshot]):
    """Instances of one role, row i in every column. Immutable once built: the view hands out
    copies of the arrays it updates. A subset (`where`) shares its parent's lists of snapshots,
    ids and nodes, and reads them through `index` (its rows' places in them)."""

    def __init__(
        self,
        rows: list[InstanceSnapshot],
        queue_s: np.ndarray,
        is_usable: np.ndarray,
        kv_free: np.ndarray,
        num_running: np.ndarray,
        num_queued: np.ndarray,
        num_context: np.ndarray,
        num_queued_context: np.ndarray,
        model: np.ndarray,
        root: np.ndarray,
        roots: Sequence[CostPredictors],
        ids: list[str] | None = None,
        nodes: NodeList | None = None,
        index: np.ndarray | None = None,
    ) -> None:
        self._rows = rows  # their queue_time_s may be older than `queue_s`
        self._ids = [s.instance_id for s in rows] if ids is None else ids
        self._nodes = NodeList(s.node for s in rows) if nodes is None else nodes
        self._index = index  # None: row i is rows[i]
        self.queue_s = queue_s
        self.is_usable = is_usable  # not stale and accepting
        self.kv_free = kv_free
        self.num_running = num_running
        self.num_queued = num_queued
        self.num_context = num_context  # decode: the TBT model's context (KV in use if unreported)
        self.num_queued_context = num_queued_context  # decode: the context num_queued brings
        self.model = model  # shape (n, 4): model_terms per row (its columns: properties below)
        self.root = root  # index into `roots` of the row's shared base model; NO_MODEL: none
        self.roots = roots

    # The model terms' columns: views of `model`, made when read (most decisions read one role's
    # two or three of them, and a view costs as much as a small numpy call).
    @property
    def prefill_ratio(self) -> np.ndarray:
        return self.model[:, 0]

    @property
    def prefill_overhead_s(self) -> np.ndarray:
        return self.model[:, 1]

    @property
    def decode_ratio(self) -> np.ndarray:
        return self.model[:, 2]

    @property
    def kv_bytes(self) -> np.ndarray:
        return self.model[:, 3]

    @classmethod
    def of(cls, snapshots: Sequence[InstanceSnapshot]) -> InstanceColumns:
        """`snapshots` as columns (themselves if they already are)."""
        if isinstance(snapshots, InstanceColumns):
            return snapshots
        rows = list(snapshots)
        roots: dict[int, CostPredictors] = {}
        for s in rows:
            if s.costs is not None:
                roots.setdefault(id(s.costs.root), s.costs.root)
        position = {key: i for i, key in enumerate(roots)}
        return cls(
            rows,
            np.array([s.queue_time_s for s in rows], dtype=np.float64),
            np.array([s.is_usable for s in rows], dtype=bool),
            np.array([s.kv_free_tokens for s in rows], dtype=np.int64),
            np.array([s.num_running for s in rows], dtype=np.int64),
            np.array([s.num_queued for s in rows], dtype=np.int64),
            np.array([s.num_context_tokens for s in rows], dtype=np.int64),
            np.array([s.queued_context_tokens for s in rows], dtype=np.int64),
            np.array([model_terms(s.costs) for s in rows], dtype=np.float64).reshape(-1, 4),
            np.array(
                [NO_MODEL if s.costs is None else position[id(s.costs.root)] for s in rows],
                dtype=np.int64,
            ),
            list(roots.values()),
        )

    @property
    def rows(self) -> list[InstanceSnapshot]:
        """The rows' snapshots as last built (their queue times may be older than `queue_s`)."""
        return self._take(self._rows)

    @property
    def ids(self) -> list[str]:
        return self._take(self._ids)

    @property
    def nodes(self) -> list[str]:
        return self._take(self._nodes)

    def _take(self, values: list) -> list:
        if self._index is None:
            return values
        return list(map(values.__getitem__, self._index.tolist()))

    def _place(self, i: int) -> int:
        return i if self._index is None else int(self._index[i])

    def __len__(self) -> int:
        return len(self.queue_s)

    @overload
    def __getitem__(self, i: int) -> InstanceSnapshot: ...
    @overload
    def __getitem__(self, i: slice) -> list[InstanceSnapshot]: ...
    def __getitem__(self, i: int | slice) -> InstanceSnapshot | list[InstanceSnapshot]:
        if isinstance(i, slice):
            return list(self)[i]
        return _with_queue(self._rows[self._place(i)], float(self.queue_s[i]))

    def __iter__(self) -> Iterator[InstanceSnapshot]:
        return map(_with_queue, self.rows, self.queue_s.tolist())

    def costs_of(self, i: int) -> CostPredictors | None:
        return self._rows[self._place(i)].costs

    def costs_for(self, instance_id: str) -> CostPredictors | None:
        """The cost model of the row of `instance_id` (ValueError if absent)."""
        return self._rows[self._ids.index(instance_id)].costs

    def id_of(self, i: int) -> str:
        return self._ids[self._place(i)]

    def node_of(self, instance_id: str) -> str:
        """The node of the row of `instance_id` (ValueError if absent)."""
        return self._nodes[self._ids.index(instance_id)]

    def where(self, mask: np.ndarray) -> InstanceColumns:
        """The rows where `mask` holds, in order (themselves when it holds everywhere)."""
        if _all(mask):
            return self
        keep = mask.nonzero()[0]
        return InstanceColumns(
            self._rows,
            self.queue_s[keep],
            self.is_usable[keep],
            self.kv_free[keep],
            self.num_running[keep],
            self.num_queued[keep],
            self.num_context[keep],
            self.num_queued_context[keep],
            self.model[keep],
            self.root[keep],
            self.roots,
            self._ids,
            self._nodes,
            keep if self._index is None else self._index[keep],
        )

    def without(self, instance_ids: Collection[str]) -> InstanceColumns:
        """The rows whose instance is not in `instance_ids`."""
        return self.where(np.fromiter((i not in instance_ids for i in self.ids), bool, len(self)))

    def prefix_lengths(self, match: PrefixMatch) -> np.ndarray:
        """Each row's node's prefix length in `match`, read at each row's bit from a table by
        bit (a node ends one run at most). Most runs end for one node, whose bit is found in
        Python and written with the others' in one call; a run of many nodes is unpacked."""
        if match.slots is None:  # the empty match
            return np.zeros(len(self), np.int64)
        num_slots = match.slots.num_slots
        by_slot = np.zeros(num_slots + 1, np.int64)  # the last: nodes the index lacks
        lone_slots, lone_lengths = [], []
        for mask, length in match.runs:
            if mask & (mask - 1):
                packed = np.frombuffer(mask.to_bytes((num_slots + 7) // 8, "little"), np.uint8)
                bits = np.unpackbits(packed, count=num_slots, bitorder="little")
                by_slot[:num_slots][bits.view(bool)] = length
            elif mask:
                lone_slots.append(mask.bit_length() - 1)
                lone_lengths.append(length)
        by_slot[lone_slots] = lone_lengths
        slots = self._nodes.slots_in(match.slots)
        return by_slot[slots if self._index is None else slots[self._index]]

    def link_rates(self, bandwidth: BandwidthTable, sources: Collection[str]) -> np.ndarray:
        """Per row, the rate of the fastest link into its node from `sources`, as
        BandwidthTable.fastest_source gives it; with more than FEW_SOURCES sources, the
        fastest link anywhere (no less than that rate). The measured links out of a source are
        few: the rows are filled with the default and those links written over it."""
        if len(sources) > FEW_SOURCES:
            return np.full(len(self), bandwidth.max_rate())
        default = bandwidth.default_bytes_per_s
        num_rows = len(self._nodes)
        rates = np.full(num_rows, -np.inf)
        for source in sources:
            measured = bandwidth.measured_from(source)
            if len(measured) < num_rows:
                from_source = np.full(num_rows, default)
                rows_of = self._nodes.rows_of()
                for node, rate in measured.items():
                    rows = rows_of.get(node)
                    if rows is not None:
                        from_source[rows] = rate
            else:  # links measured to most nodes: looked up by row
                from_source = np.array(
                    list(map(measured.get, self._nodes, repeat(default))), np.float64
                )
            rates = np.maximum(rates, from_source)
        return rates if self._index is None else rates[self._index]

    def models(
        self, default: CostPredictors
    ) -> tuple[list[CostPredictors], np.ndarray, np.ndarray]:
        """The shared base models (the policy's `default` for rows without a model), each row's
        index into them, and each row's KV bytes per token."""
        root, kv_bytes = self.root, self.kv_bytes
        if _any(root == NO_MODEL):
            root = np.where(root == NO_MODEL, len(self.roots), root)
            kv_bytes = np.where(self.root == NO_MODEL, default.kv_bytes_per_token, kv_bytes)
            return [*self.roots, default], root, kv_bytes
        return list(self.roots), root, kv_bytes

    def costs(self, position: int, default: CostPredictors) -> CostPredictors:
        return self.costs_of(position) or default


def _with_queue(row: InstanceSnapshot, queue_s: float) -> InstanceSnapshot:
    return row if row.queue_time_s == queue_s else _replace(row, queue_time_s=queue_s)
