"""InstanceColumns: the columns a decision reads say what the snapshots say, subsets included."""

import numpy as np
from policy_helpers import chain

from crescent.common.block_index import BlockIndex
from crescent.conductor.policy import CostPredictors, InstanceSnapshot
from crescent.conductor.policy.columns import NO_MODEL, InstanceColumns

BASE = CostPredictors(lambda n, p: 1.0, lambda b, c: 0.1, 2.0)
DERIVED = CostPredictors(
    lambda n, p: 0.5 + 2 * BASE.prefill_s(n, p),
    lambda b, c: 3 * BASE.decode_step_s(b, c),
    4.0,
    base=BASE,
    prefill_ratio=2.0,
    prefill_overhead_s=0.5,
    decode_ratio=3.0,
)


def snapshots() -> list[InstanceSnapshot]:
    return [
        InstanceSnapshot("a", "n0", 0, 1, 0.5, 10, 100, context_tokens=7, costs=DERIVED),
        InstanceSnapshot("b", "n1", 0, 2, 0.0, 20, 100, is_stale=True),
        InstanceSnapshot("c", "n2", 0, 3, 1.5, 90, 100, costs=BASE),
        InstanceSnapshot("d", "n3", 0, 4, 2.5, 0, 100, is_accepting=False, costs=DERIVED),
    ]


def test_columns_hold_what_the_snapshots_say():
    columns = InstanceColumns.of(snapshots())
    assert InstanceColumns.of(columns) is columns
    assert list(columns) == snapshots()
    assert columns.queue_s.tolist() == [0.5, 0.0, 1.5, 2.5]
    assert columns.is_usable.tolist() == [True, False, True, False]
    assert columns.kv_free.tolist() == [90, 80, 10, 100]
    assert columns.num_context.tolist() == [7, 20, 90, 0]
    assert columns.prefill_ratio.tolist() == [2.0, 1.0, 1.0, 2.0]
    assert columns.prefill_overhead_s.tolist() == [0.5, 0.0, 0.0, 0.5]
    assert columns.decode_ratio.tolist() == [3.0, 1.0, 1.0, 3.0]
    # A model derived from BASE and BASE itself share one root; no model is NO_MODEL.
    assert columns.root[1] == NO_MODEL
    assert [columns.roots[r] for r in columns.root[[0, 2, 3]].tolist()] == [BASE] * 3
    roots, root, kv_bytes = columns.models(BASE)
    assert roots[root[1]] is BASE and kv_bytes.tolist() == [4.0, 2.0, 2.0, 4.0]


def test_subsets_of_subsets_read_the_right_rows():
    columns = InstanceColumns.of(snapshots())
    usable = columns.where(columns.is_usable)
    assert usable.ids == ["a", "c"] and usable.nodes == ["n0", "n2"]
    assert columns.where(np.ones(4, dtype=bool)) is columns
    kept = columns.without({"a"}).where(np.array([True, False, True]))
    assert kept.ids == ["b", "d"] and [s.instance_id for s in kept] == ["b", "d"]
    assert kept.id_of(1) == "d" and kept.costs_of(1) is DERIVED and kept.node_of("d") == "n3"
    assert kept[1] == snapshots()[3] and kept.queue_s.tolist() == [0.0, 2.5]


def test_a_row_reads_the_queue_of_its_column():
    rows = snapshots()
    columns = InstanceColumns.of(rows)
    columns.queue_s[2] = 0.25  # as the view drains a queue without a new snapshot
    assert columns[2].queue_time_s == 0.25 and list(columns)[2].queue_time_s == 0.25
    assert columns[0] is rows[0]


def test_prefix_lengths_read_by_bit_equal_the_match_by_name():
    """Rows read their node's prefix length through the index's node bits; a subset reads its
    own rows, a node the index does not know reads 0, and a node that moves to another bit
    (another left and came back) is read at its new bit, not the one kept from before."""
    hashes = chain("r", 40)
    index = BlockIndex()
    nodes = [f"n{i}" for i in range(70)]  # more than eight bytes of bits
    for i, node in enumerate(nodes):
        index.add_many(hashes[: (i * 7) % 41], node)
    rows = [
        InstanceSnapshot(f"p{i}", node, 0, 0, 0.0, 0, 100, is_stale=i % 3 == 0)
        for i, node in enumerate([*nodes, "unknown"])
    ]
    columns = InstanceColumns.of(rows)
    usable = columns.where(columns.is_usable)
    for _ in range(2):
        match = index.match(hashes)
        for part in (columns, usable):
            assert part.prefix_lengths(match).tolist() == [match.length(n) for n in part.nodes]
        index.remove_node("n0")  # frees bit 0 ...
        index.remove_node("n5")
        index.add_many(hashes[:3], "n5")  # ... which n5 takes
        index.add_many(hashes[:9], "n0")
