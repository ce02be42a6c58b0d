from hypothesis import given, settings
from hypothesis import strategies as st

from crescent.common.hashing import HASH_BYTES, block_hashes

tokens = st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=0, max_size=200)


def test_only_full_blocks_are_hashed():
    assert len(block_hashes(list(range(10)), 4, "m")) == 2
    assert block_hashes([1, 2, 3], 4, "m") == []
    assert all(len(h) == HASH_BYTES for h in block_hashes(list(range(8)), 4, "m"))


@given(tokens, tokens, st.integers(min_value=1, max_value=16))
def test_same_prefix_gives_same_hashes(prefix, tail_a, block_size):
    a = block_hashes(prefix + tail_a, block_size, "m")
    b = block_hashes(prefix, block_size, "m")
    assert a[: len(b)] == b


@settings(max_examples=200)
@given(
    st.lists(st.integers(min_value=0, max_value=1000), min_size=8, max_size=120),
    st.data(),
    st.integers(min_value=1, max_value=8),
)
def test_one_changed_token_changes_that_block_and_all_later(token_ids, data, block_size):
    position = data.draw(st.integers(min_value=0, max_value=len(token_ids) - 1))
    changed = list(token_ids)
    changed[position] += 1
    before, after = block_hashes(token_ids, block_size, "m"), block_hashes(changed, block_size, "m")
    first_changed_block = position // block_size
    assert before[:first_changed_block] == after[:first_changed_block]
    for i in range(first_changed_block, len(before)):
        assert before[i] != after[i]


def test_model_id_is_part_of_the_hash():
    assert block_hashes([1, 2, 3, 4], 2, "a") != block_hashes([1, 2, 3, 4], 2, "b")


def test_hashes_chain_rather_than_hash_blocks_alone():
    # Equal block contents at different positions (different prefixes) must not collide.
    hashes = block_hashes([5, 5, 5, 5], 2, "m")
    assert hashes[0] != hashes[1]
