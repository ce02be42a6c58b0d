"""The shared block index: holder bookkeeping, node bit slots, etcd keys, and prefix matching
against a brute-force scan per node."""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from crescent.common.block_index import BlockIndex, BlockKey, apply_block_change, parse_block_key


def chain(name: str, num_blocks: int) -> list[bytes]:
    return [
        hashlib.blake2b(f"{name}/{i}".encode(), digest_size=16).digest() for i in range(num_blocks)
    ]


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
    index.remove(A[0], "nowhere")
    assert dict(index.match(A).lengths) == {"n1": 1, "n2": 3}
    index.remove_node("n2")
    assert (
        index.holders(A[1]) == frozenset()
        and index.holders(A[2]) == {"n1"}
        and index.nodes() == ["n1"]
    )
    assert index.num_blocks == 2 and index.blocks_of("n1") == {A[0], A[2]}
    assert (
        index.num_replicas(A[0]) == 1 and not index.is_held(A[1]) and index.num_blocks_of("n2") == 0
    )


def test_a_node_that_empties_gives_its_slot_to_the_next_node():
    index = BlockIndex()
    index.add_many(A[:2], "n1")
    index.add(A[0], "n2")
    index.remove_node("n1")
    index.add_many(A[:3], "n3")  # takes n1's old bit: n1 must not come back through it
    match = index.match(A)
    assert dict(match.lengths) == {"n2": 1, "n3": 3} and index.holders(A[0]) == {"n2", "n3"}


def test_block_keys_parse_and_apply():
    hash_hex = A[0].hex()
    assert parse_block_key(f"/crescent/c/blocks/m/{hash_hex}/n1") == BlockKey("m", A[0], "n1")
    for key in (
        "/crescent/c/blocks/m/zz/n1",
        f"{hash_hex}/n1",
        f"/crescent/c/blocks/m/{hash_hex}/",
        "",
    ):
        assert parse_block_key(key) is None, key
    index = BlockIndex()
    assert apply_block_change(
        index, f"/crescent/c/blocks/m/{hash_hex}/n1", is_put=True
    ) == BlockKey("m", A[0], "n1")
    assert index.holders(A[0]) == {"n1"}
    apply_block_change(index, f"/crescent/c/blocks/m/{hash_hex}/n1", is_put=False)
    assert index.num_blocks == 0 and index.nodes() == []
    assert apply_block_change(index, "/crescent/c/blocks/m/nothex/n1", is_put=True) is None


def brute_force_lengths(holdings: dict[str, set[bytes]], hashes: list[bytes]) -> dict[str, int]:
    lengths = {}
    for node, held in holdings.items():
        n = 0
        while n < len(hashes) and hashes[n] in held:
            n += 1
        if n:
            lengths[node] = n
    return lengths


def assert_matches_brute_force(
    index: BlockIndex, holdings: dict[str, set[bytes]], hashes: list[bytes], nodes: list[str]
) -> None:
    """The index's match of `hashes` says what a scan of each node's holdings says."""
    expected = brute_force_lengths(holdings, hashes)
    match = index.match(hashes)
    assert dict(match.lengths) == expected
    assert [match.length(n) for n in [*nodes, "nowhere"]] == [
        expected.get(n, 0) for n in [*nodes, "nowhere"]
    ]
    best = max(expected.values(), default=0)
    assert match.best_len == best
    assert match.best_nodes == {n for n, length in expected.items() if length == best}


POOL = chain("pool", 12)
NODES = [f"n{i}" for i in range(70)]  # more than one 64-bit word of node bits


@settings(max_examples=200, deadline=None)
@given(
    holdings=st.dictionaries(
        st.sampled_from(NODES), st.sets(st.sampled_from(POOL), max_size=12), max_size=70
    ),
    hashes=st.lists(st.sampled_from(POOL), max_size=12, unique=True),
    removed=st.lists(st.tuples(st.sampled_from(NODES), st.sampled_from(POOL)), max_size=12),
)
def test_prefix_lengths_equal_a_brute_force_per_node_scan(holdings, hashes, removed):
    index = BlockIndex()
    for node, held in holdings.items():
        index.add_many(held, node)
    for node, block in removed:
        index.remove(block, node)
        if node in holdings:
            holdings[node].discard(block)
    assert_matches_brute_force(index, holdings, hashes, NODES)
    for block in POOL:
        assert index.holders(block) == {n for n, held in holdings.items() if block in held}


LONG = chain("long", 400)  # longer than the first two of match's chunks of lookups


@settings(max_examples=200, deadline=None)
@given(
    prefixes=st.dictionaries(st.sampled_from(NODES), st.integers(0, len(LONG)), max_size=20),
    holes=st.lists(st.tuples(st.sampled_from(NODES), st.integers(0, len(LONG) - 1)), max_size=8),
    request_len=st.integers(0, len(LONG)),
)
def test_long_requests_match_a_brute_force_scan_across_chunks(prefixes, holes, request_len):
    """Runs that end in any chunk, holes anywhere, and holder sets that recur after a change
    (interned masks: the same object again) give the same lengths as a scan per node."""
    index = BlockIndex()
    holdings = {node: set(LONG[:length]) for node, length in prefixes.items() if length}
    for node, held in holdings.items():
        index.add_many(held, node)
        index.add_many(LONG[: prefixes[node]], node)  # adding again changes nothing
    for node, position in holes:
        index.remove(LONG[position], node)
        holdings.get(node, set()).discard(LONG[position])
    hashes = LONG[:request_len]
    assert_matches_brute_force(index, holdings, hashes, NODES)
    for node, position in holes[:3]:
        index.add(LONG[position], node)
        holdings.setdefault(node, set()).add(LONG[position])
    assert_matches_brute_force(index, holdings, hashes, NODES)


# Chains that share their first blocks, as sessions extending one system prompt do.
SHARED = chain("shared", 150)
BRANCHES = [SHARED + chain(f"branch{b}", 150) for b in range(3)]
operation = st.one_of(
    st.tuples(
        st.sampled_from(["add", "remove"]),
        st.sampled_from(NODES[:6]),
        st.integers(0, 2),
        st.one_of(st.just(0), st.integers(0, 299)),  # prefixes from block 0, and stretches
        st.integers(1, 300),
    ),
    st.tuples(
        st.just("remove_node"), st.sampled_from(NODES[:6]), st.just(0), st.just(0), st.just(0)
    ),
    st.tuples(st.just("match"), st.just(""), st.integers(0, 2), st.integers(0, 300), st.just(0)),
)


@settings(max_examples=300, deadline=None)
@given(operations=st.lists(operation, max_size=25))
def test_repeated_matches_through_changes_equal_a_brute_force_scan(operations):
    """Stretches of one holder set that a match noted are reused by the next match with the
    same prefix, and forgotten when any of their blocks gains or loses a holder: each match,
    whatever came before it, equals a scan per node."""
    index = BlockIndex()
    holdings: dict[str, set[bytes]] = {}
    for kind, node, branch, start, count in operations:
        blocks = BRANCHES[branch][start : start + count]
        if kind == "add":
            index.add_many(blocks, node)
            holdings.setdefault(node, set()).update(blocks)
        elif kind == "remove":
            for block in blocks:
                index.remove(block, node)
            holdings.get(node, set()).difference_update(blocks)
        elif kind == "remove_node":
            index.remove_node(node)
            holdings.pop(node, None)
        for hashes in (BRANCHES[branch][:start], BRANCHES[(branch + 1) % 3]):
            assert_matches_brute_force(index, holdings, hashes, NODES[:6])
