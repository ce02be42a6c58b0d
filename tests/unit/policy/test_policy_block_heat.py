"""BlockHeat: decaying hit counts of held blocks and the hottest-first ranking."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import chain

from crescent.conductor.policy import BlockHeat, BlockIndex

A = chain("a", 6)


def test_hits_decay_by_half_life_and_rank_parents_first_on_ties():
    index = BlockIndex()
    heat = BlockHeat(index, hit_half_life_s=10.0)
    index.add_many(A[:3], "n1")
    index.add(A[0], "n2")
    for t in range(4):
        heat.record_hits(A[:3], now=float(t))
    assert heat.hits(A[0], 3.0) == heat.hits(A[2], 3.0)
    hot = heat.hottest(2, now=3.0)
    assert [h.hash for h in hot] == [A[0], A[1]]
    assert hot[0].num_replicas == 2 and hot[1].num_replicas == 1
    assert abs(heat.hits(A[0], 13.0) - hot[0].hits / 2) < 1e-9
    heat.record_hits([b"?" * 16], now=3.0)  # unheld blocks are not counted
    assert len(heat.hottest(10, 3.0)) == 3


def test_a_block_held_nowhere_is_not_ranked_and_forget_drops_its_hits():
    index = BlockIndex()
    heat = BlockHeat(index)
    index.add(A[0], "n1")
    heat.record_hits(A[:1], now=0.0)
    index.remove(A[0], "n1")
    assert heat.hottest(10, 0.0) == []
    heat.forget(A[0])
    index.add(A[0], "n1")
    assert heat.hits(A[0], 0.0) == 0.0 and heat.depth(A[0]) is None


@settings(max_examples=80, deadline=None)
@given(
    hits=st.lists(
        st.tuples(st.integers(0, 40), st.floats(0, 300), st.integers(1, 5)),
        min_size=1,
        max_size=120,
    ),
    k=st.integers(0, 12),
    now=st.floats(0, 400),
)
def test_hottest_is_the_brute_force_ranking(hits, k, now):
    index = BlockIndex()
    heat = BlockHeat(index, hit_half_life_s=30.0)
    blocks = [bytes([i]) * 4 for i in range(41)]
    for b in blocks:
        index.add(b, "n0")
    for block, at, repeat in sorted(hits, key=lambda hit: hit[1]):
        for _ in range(repeat):
            heat.record_hits([blocks[block]], at)
    expected = sorted(
        (b for b in blocks if heat.hits(b, now) > 0 or heat.depth(b) is not None),
        key=lambda b: (-heat.hits(b, now), heat.depth(b), b),
    )[:k]
    assert [hot.hash for hot in heat.hottest(k, now)] == expected
