"""About how much memory a finished request's tokens and logprobs hold in a Python process,
for bounding what a worker keeps of requests that ended (crescent.common.recent.Recent).

Estimates, a little above what CPython 3.11 measures (tests/unit/test_held_bytes.py): a token
id is an int object and its list slot; a logprobs entry is a struct, two lists and, for each
alternative, an int and a float with their slots."""

from __future__ import annotations

from collections.abc import Iterable

from crescent.common.messages import PrefillResult, TokenChunk, TokenLogprobs

TOKEN_ID_BYTES = 36
CHUNK_BYTES = 300  # the struct and its fields
LOGPROBS_BYTES = 250  # the struct, its float and its two lists
ALTERNATIVE_BYTES = 75


def logprobs_bytes(entries: Iterable[TokenLogprobs]) -> int:
    return sum(LOGPROBS_BYTES + ALTERNATIVE_BYTES * len(entry.top_ids) for entry in entries)


def chunks_bytes(chunks: Iterable[TokenChunk]) -> int:
    return sum(
        CHUNK_BYTES + TOKEN_ID_BYTES * len(chunk.token_ids) + logprobs_bytes(chunk.logprobs)
        for chunk in chunks
    )


def result_bytes(result: PrefillResult) -> int:
    return CHUNK_BYTES + logprobs_bytes(result.prompt_logprobs)
