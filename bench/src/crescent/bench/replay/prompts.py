"""Token-id prompts for a trace: each hash id maps to a fixed block of token ids, so requests
that share leading ids share real token prefixes, and any server's prefix cache sees the
sharing the trace recorded.

A trace block is 512 tokens; `block_tokens` may shrink it (a small model with a short context
keeps the same sharing structure at fewer tokens per block), and `max_input_tokens` cuts the
prompt's tail, which keeps every shared prefix that fits. For the server to reuse a shared
block, `block_tokens` should be a multiple of the server's cache block size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from crescent.bench.trace import TRACE_BLOCK_TOKENS, TraceRequest

FIRST_TOKEN_ID = 100  # leave the low ids (special tokens of most vocabularies) out


@dataclass(frozen=True)
class PromptShape:
    block_tokens: int = TRACE_BLOCK_TOKENS
    max_input_tokens: int | None = None
    max_output_tokens: int | None = None
    vocab_size: int = 32000

    def __post_init__(self) -> None:
        if self.block_tokens < 1 or self.vocab_size <= FIRST_TOKEN_ID:
            raise ValueError(f"block tokens must be >= 1 and vocab size > {FIRST_TOKEN_ID}")
        for name in ("max_input_tokens", "max_output_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")


def block_of(hash_id: int, block_tokens: int, vocab_size: int) -> np.ndarray:
    """The token ids standing for trace block `hash_id`: the same for the same (id, size, vocab),
    and, with overwhelming likelihood, different for different ids."""
    generator = np.random.Generator(np.random.PCG64([hash_id, block_tokens]))
    return generator.integers(FIRST_TOKEN_ID, vocab_size, size=block_tokens, dtype=np.int64)


def prompt_length(request: TraceRequest, shape: PromptShape) -> int:
    scaled = max(1, math.ceil(request.input_length * shape.block_tokens / TRACE_BLOCK_TOKENS))
    return scaled if shape.max_input_tokens is None else min(scaled, shape.max_input_tokens)


def prompt_tokens(request: TraceRequest, shape: PromptShape) -> list[int]:
    length = prompt_length(request, shape)
    num_blocks = math.ceil(length / shape.block_tokens)
    blocks = [
        block_of(h, shape.block_tokens, shape.vocab_size) for h in request.hash_ids[:num_blocks]
    ]
    return np.concatenate(blocks)[:length].tolist()


def output_tokens(request: TraceRequest, shape: PromptShape) -> int:
    if shape.max_output_tokens is None:
        return request.output_length
    return min(request.output_length, shape.max_output_tokens)
