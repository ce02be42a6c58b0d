"""The estimates of what a finished request's chunks hold are within reach of what CPython
measures (tracemalloc), a little above it."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from crescent.common.held_bytes import chunks_bytes
from crescent.common.messages import TokenChunk, TokenLogprobs


def chunks(num_top: int) -> list[TokenChunk]:
    draw = random.Random(0)

    def entry() -> TokenLogprobs:
        return TokenLogprobs(
            logprob=-draw.random(),
            top_ids=[draw.randrange(1000, 32000) for _ in range(num_top)],
            top_logprobs=[-draw.random() for _ in range(num_top)],
        )

    return [
        TokenChunk(
            request_id="r",
            seq=seq,
            token_ids=[draw.randrange(1000, 32000) for _ in range(16)],
            step_at=1.5,
            logprobs=[entry() for _ in range(16)] if num_top else [],
        )
        for seq in range(100)
    ]


@pytest.mark.parametrize("num_top", [0, 5, 20])
def test_chunks_are_estimated_a_little_above_what_they_hold(num_top):
    tracemalloc.start()
    try:
        held = chunks(num_top)
        measured, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert 1.0 <= chunks_bytes(held) / measured <= 1.2
