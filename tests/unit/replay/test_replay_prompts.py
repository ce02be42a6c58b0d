"""Hash id → token block mapping: the same ids give the same tokens, different ids different
ones, so requests sharing leading ids share exactly that many blocks of real prompt tokens."""

from crescent.bench.replay.prompts import (
    PromptShape,
    block_of,
    output_tokens,
    prompt_length,
    prompt_tokens,
)
from crescent.bench.trace import TraceRequest


def req(hash_ids, input_length=None, output_length=10):
    n = input_length if input_length is not None else 512 * len(hash_ids)
    return TraceRequest(0, 0.0, n, output_length, tuple(hash_ids))


def test_same_id_same_tokens_and_different_ids_differ():
    assert (block_of(7, 512, 32000) == block_of(7, 512, 32000)).all()
    assert (block_of(7, 512, 32000) != block_of(8, 512, 32000)).mean() > 0.99
    assert not (
        block_of(7, 64, 32000) == block_of(7, 512, 32000)[:64]
    ).all()  # size is part of the key
    tokens = block_of(123456789, 512, 1000)
    assert tokens.min() >= 100 and tokens.max() < 1000


def test_requests_sharing_leading_ids_share_exactly_those_blocks():
    a = prompt_tokens(req([1, 2, 3, 4]), PromptShape())
    b = prompt_tokens(req([1, 2, 9, 4]), PromptShape())
    assert len(a) == len(b) == 2048
    assert a[:1024] == b[:1024]
    assert a[1024:1536] != b[1024:1536]
    assert a[1536:] == b[1536:]  # equal ids give equal blocks wherever they sit


def test_caps_keep_the_sharing_structure():
    shape = PromptShape(block_tokens=16, max_input_tokens=40, max_output_tokens=3)
    a = prompt_tokens(req([1, 2, 3, 4], input_length=2000), shape)
    b = prompt_tokens(req([1, 2, 5], input_length=1100), shape)
    assert len(a) == 40 and prompt_length(req([1, 2, 5], input_length=1100), shape) == 35
    assert a[:32] == b[:32] and a[32:35] != b[32:35]
    assert output_tokens(req([1], output_length=10), shape) == 3
    assert output_tokens(req([1], output_length=2), shape) == 2
