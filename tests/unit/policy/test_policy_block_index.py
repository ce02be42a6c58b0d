"""BlockIndex: holder bookkeeping, prefix matching against brute force, decaying hotness."""

from __future__ import annotations

from crescent.conductor.policy import BlockIndex
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import chain

A = chain("a", 6)


def test_match_returns_each_nodes_longest_leading_run_and_the_best():
    index = BlockIndex()
    index.add_many(A[:4], "n1")
    index.add_many(A[:2], "n2")
    index.add_many(A[1:6], "n3")  # no first block: holds no usable prefix
    index.add_many(A[:4], "n0")
    match = index.match(A)
    assert dict(match.lengths) == {"n0": 4, "n1": 4, "n2": 2}
    assert match.length("n3") == 0 and match.length("nowhere") == 0
    assert match.best_len == 4 and match.best_nodes == {"n0", "n1"} and match.best_node == "n0"


def test_match_of_unknown_or_empty_request_is_empty():
    index = BlockIndex()
    index.add(A[0], "n1")
    for hashes in ([], chain("b", 3)):
        match = index.match(hashes)
        assert match.best_len == 0 and match.best_nodes == frozenset() and match.best_node is None


def test_whole_request_held_counts_every_block():
    index = BlockIndex()
    index.add_many(A, "n1")
    assert index.match(A[:3]).lengths == {"n1": 3}


def test_remove_and_remove_node_forget_holdings():
    index = BlockIndex()
    index.add_many(A[:3], "n1")
    index.add_many(A[:3], "n2")
    index.remove(A[1], "n1")
    index.remove(A[1], "n1")  # twice is harmless
    index.remove(b"x" * 16, "n1")
    assert dict(index.match(A).lengths) == {"n1": 1, "n2": 3}
    index.remove_node("n2")
    assert index.holders(A[1]) == frozenset() and index.holders(A[2]) == {"n1"} and index.nodes() == ["n1"]
    assert index.num_blocks == 2 and index.blocks_of("n1") == {A[0], A[2]}


def test_hits_decay_by_half_life_and_rank_parents_first_on_ties():
    index = BlockIndex(hit_half_life_s=10.0)
    index.add_many(A[:3], "n1")
    index.add(A[0], "n2")
    for t in range(4):
        index.record_hits(A[:3], now=float(t))
    assert index.hits(A[0], 3.0) == index.hits(A[2], 3.0)
    hot = index.hottest(2, now=3.0)
    assert [h.hash for h in hot] == [A[0], A[1]]
    assert hot[0].num_replicas == 2 and hot[1].num_replicas == 1
    assert abs(index.hits(A[0], 13.0) - hot[0].hits / 2) < 1e-9
    index.record_hits([b"?" * 16], now=3.0)  # unheld blocks are not counted
    assert len(index.hottest(10, 3.0)) == 3


def test_hits_are_dropped_with_the_last_replica():
    index = BlockIndex()
    index.add(A[0], "n1")
    index.record_hits(A[:1], now=0.0)
    index.remove(A[0], "n1")
    index.add(A[0], "n1")
    assert index.hits(A[0], 0.0) == 0.0


def brute_force_lengths(holdings: dict[str, set[bytes]], hashes: list[bytes]) -> dict[str, int]:
    lengths = {}
    for node, held in holdings.items():
        n = 0
        while n < len(hashes) and hashes[n] in held:
            n += 1
        if n:
            lengths[node] = n
    return lengths


POOL = chain("pool", 12)


@settings(max_examples=200, deadline=None)
@given(
    holdings=st.dictionaries(st.sampled_from([f"n{i}" for i in range(8)]),
                             st.sets(st.sampled_from(POOL), max_size=12), max_size=8),
    hashes=st.lists(st.sampled_from(POOL), max_size=12, unique=True),
    removed=st.lists(st.tuples(st.sampled_from([f"n{i}" for i in range(8)]), st.sampled_from(POOL)), max_size=6),
)
def test_prefix_lengths_equal_a_brute_force_per_node_scan(holdings, hashes, removed):
    index = BlockIndex()
    for node, held in holdings.items():
        index.add_many(held, node)
    for node, block in removed:
        index.remove(block, node)
        if node in holdings:
            holdings[node].discard(block)
    expected = brute_force_lengths(holdings, hashes)
    match = index.match(hashes)
    assert dict(match.lengths) == expected
    best = max(expected.values(), default=0)
    assert match.best_len == best
    assert match.best_nodes == {n for n, length in expected.items() if length == best}


@settings(max_examples=80, deadline=None)
@given(hits=st.lists(st.tuples(st.integers(0, 40), st.floats(0, 300), st.integers(1, 5)), min_size=1, max_size=120),
       k=st.integers(0, 12), now=st.floats(0, 400))
def test_hottest_is_the_brute_force_ranking(hits, k, now):
    """Skipping blocks whose undecayed count is below the k-th best decayed one changes nothing."""
    index = BlockIndex(hit_half_life_s=30.0)
    blocks = [bytes([i]) * 4 for i in range(41)]
    for b in blocks:
        index.add(b, "n0")
    for block, at, repeat in sorted(hits, key=lambda hit: hit[1]):
        for _ in range(repeat):
            index.record_hits([blocks[block]], at)
    expected = sorted((b for b in blocks if index.hits(b, now) > 0 or index.depth(b) is not None),
                      key=lambda b: (-index.hits(b, now), index.depth(b), b))[:k]
    assert [hot.hash for hot in index.hottest(k, now)] == expected
