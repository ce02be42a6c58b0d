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


def _counted_one_block_at_a_time(hashes, held, steps):
    """The counts by the definition, a block at a time: value decayed to `now`, plus one; the
    time of the latest hit; the shallowest depth."""
    counts: dict[bytes, tuple[float, float, int]] = {}
    for offset, length, now in steps:
        for depth, block_hash in enumerate(hashes[offset : offset + length]):
            if block_hash not in held:
                continue
            value, at, shallowest = counts.get(block_hash, (0.0, now, depth))
            value = value * 0.5 ** (max(0.0, now - at) / 10.0) + 1.0
            counts[block_hash] = (value, max(at, now), min(shallowest, depth))
    return counts


@given(
    st.sets(st.integers(0, 11)),
    st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 12), st.sampled_from([0.0, 0.5, 3.0, -1.0])),
        max_size=30,
    ),
)
def test_hits_are_counted_as_the_definition_counts_them(held_positions, steps):
    blocks = chain("h", 12)
    held = {blocks[i] for i in held_positions}
    index = BlockIndex()
    for block_hash in held:
        index.add(block_hash, "n1")
    heat = BlockHeat(index, hit_half_life_s=10.0)
    now, timed = 100.0, []
    for offset, length, step in steps:  # time mostly moves on; sometimes it stalls or steps back
        now += step
        timed.append((offset, length, now))
        heat.record_hits(blocks[offset : offset + length], now)
    expected = _counted_one_block_at_a_time(blocks, held, timed)
    assert {h: (heat.hits(h, at), heat.depth(h)) for h, (_, at, _) in expected.items()} == {
        h: (value, depth) for h, (value, _, depth) in expected.items()
    }
