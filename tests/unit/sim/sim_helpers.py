"""Small traces built in the tests, so every expected figure can be worked out independently."""

from __future__ import annotations

import math
from collections.abc import Sequence

from crescent.bench.trace import TRACE_BLOCK_TOKENS, TraceRequest


def item(
    index: int,
    arrival_s: float,
    hash_ids: Sequence[int],
    output_length: int = 1,
    input_length: int | None = None,
) -> TraceRequest:
    """A request whose prompt is exactly its blocks (the last one full) unless told otherwise."""
    n = input_length if input_length is not None else len(hash_ids) * TRACE_BLOCK_TOKENS
    assert len(hash_ids) == math.ceil(n / TRACE_BLOCK_TOKENS)
    return TraceRequest(index, arrival_s, n, output_length, tuple(hash_ids))


def spaced(trace: Sequence[TraceRequest], gap_s: float) -> list[TraceRequest]:
    """The same requests, one every `gap_s` seconds, so no two overlap."""
    return [
        TraceRequest(r.index, i * gap_s, r.input_length, r.output_length, r.hash_ids)
        for i, r in enumerate(trace)
    ]
