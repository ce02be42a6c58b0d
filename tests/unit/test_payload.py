"""How much fits one NATS message: entries of a reply (num_fitting), a request's sequence
(sequence_bytes against sequence_room), counted in encoded bytes."""

from __future__ import annotations

from crescent.common.codec import encode
from crescent.common.messages import ResentTokens, SamplingParams, TokenChunk
from crescent.common.payload import (
    RESERVED_BYTES,
    TOKEN_ID_BYTES,
    num_fitting,
    sequence_bytes,
    sequence_room,
)

SHELL = ResentTokens(request_id="r", is_known=True)


def chunks(num: int, num_tokens: int) -> list[TokenChunk]:
    return [
        TokenChunk(request_id="r", seq=i, token_ids=[1000] * num_tokens, step_at=0.0)
        for i in range(num)
    ]


def test_entries_that_fit_all_go_in_one_message():
    entries = chunks(10, 4)
    assert num_fitting(SHELL, entries, 1 << 20) == 10
    assert num_fitting(SHELL, [], 1 << 20) == 0


def test_a_part_holds_the_most_whole_entries_within_the_limit():
    entries = chunks(100, 200)
    limit = 8 << 10
    num = num_fitting(SHELL, entries, limit)
    assert 0 < num < 100
    part = ResentTokens(request_id="r", is_known=True, chunks=entries[:num])
    assert len(encode(part)) <= limit - RESERVED_BYTES
    one_more = ResentTokens(request_id="r", is_known=True, chunks=entries[: num + 1])
    assert len(encode(one_more)) > limit - RESERVED_BYTES - 8  # within a list header's bytes


def test_an_entry_larger_than_the_room_still_goes_alone():
    assert num_fitting(SHELL, chunks(3, 2000), 2 << 10) == 1


def test_a_sequence_counts_its_prompt_as_encoded_and_its_output_at_the_most():
    small, large = [7] * 1000, [1 << 20] * 1000  # 1 and 5 bytes a token id
    assert sequence_bytes(large, 0, 512) - sequence_bytes(small, 0, 512) == 4000
    with_output = sequence_bytes(small, 10, 512) - sequence_bytes(small, 0, 512)
    assert with_output == 10 * TOKEN_ID_BYTES  # two blocks either way
    assert sequence_room(1 << 20, SamplingParams()) < (1 << 20)
