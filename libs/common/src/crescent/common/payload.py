"""Replies cut to fit one NATS message.

The server refuses a message larger than its `max_payload` (1 MiB unless configured), and a
reply refused that way never reaches its requester, who waits out its deadline. Most replies
are small; the ones that grow with a request (a prompt's logprobs, a stream's chunks asked for
again) go out in parts, each holding as many whole entries as fit."""

from __future__ import annotations

import msgspec

from crescent.common.codec import Message, encode
from crescent.common.hashing import HASH_BYTES

# Room left in a message for what its entries do not count: the list's own length prefix and
# the NATS protocol line around the payload are a few bytes; this is generous.
RESERVED_BYTES = 1024

_entry_encoder = msgspec.msgpack.Encoder()


def num_fitting(shell: Message, entries: list[msgspec.Struct], max_payload: int) -> int:
    """How many of `entries`, from the first, fit one message of at most `max_payload` bytes
    next to `shell` (the message without them). At least one, so every part moves a reply on
    (an entry alone is far smaller than any payload limit)."""
    room = max_payload - len(encode(shell)) - RESERVED_BYTES
    if len(_entry_encoder.encode(entries)) <= room:  # the usual case, in one encode
        return len(entries)
    for num, entry in enumerate(entries):
        room -= len(_entry_encoder.encode(entry))
        if room < 0:
            return max(num, 1)
    return len(entries)


# A token id of output yet to come takes at most a msgpack uint32; a prefill job may carry the
# hash of each of its blocks (a planned pull), with its bin header.
TOKEN_ID_BYTES = 5
BLOCK_HASH_BYTES = HASH_BYTES + 2
# Room for the rest of a prefill job or decode start: ids, names, numbers, stop tokens.
JOB_RESERVED_BYTES = 4 << 10


def sequence_room(max_payload: int, sampling: msgspec.Struct) -> int:
    """Bytes left for a request's sequence in the one message that carries it (a prefill job,
    a decode start) beside its sampling (stop strings, a grammar...) and the other fields."""
    return max_payload - len(_entry_encoder.encode(sampling)) - JOB_RESERVED_BYTES


def sequence_bytes(token_ids: list[int], max_tokens: int, block_size: int) -> int:
    """The most bytes the sequence takes there: the prompt as encoded, the output a decode
    start carries after a move (TOKEN_ID_BYTES a token), and a prefill job's block hashes."""
    num_blocks = (len(token_ids) + max_tokens) // block_size + 1
    return (
        len(_entry_encoder.encode(token_ids))
        + max_tokens * TOKEN_ID_BYTES
        + num_blocks * BLOCK_HASH_BYTES
    )
