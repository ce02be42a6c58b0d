"""Chained block hashes (DESIGN §5), the one function conductor and connector both call.

hash_i = BLAKE2b-128(hash_{i-1} ‖ token ids of block i as little-endian uint32), with
hash_{-1} = BLAKE2b-128(model id). Chaining makes a block's hash name its whole prefix, so
equal hashes mean equal KV; only full blocks are hashed because a partial block's KV changes
as tokens are appended.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

HASH_BYTES = 16


def root_hash(model_id: str) -> bytes:
    return hashlib.blake2b(model_id.encode(), digest_size=HASH_BYTES).digest()


def block_hashes(token_ids: Sequence[int], block_size: int, model_id: str) -> list[bytes]:
    """The chained hashes of every full `block_size`-token block of `token_ids`."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    tokens = array("I", token_ids)
    if tokens.itemsize != 4:
        raise RuntimeError("array('I') is not 32-bit on this platform")
    if array("I", [1]).tobytes()[0] != 1:
        tokens.byteswap()
    raw = tokens.tobytes()
    step = block_size * 4
    parent = root_hash(model_id)
    hashes: list[bytes] = []
    for start in range(0, len(tokens) // block_size * step, step):
        h = hashlib.blake2b(parent, digest_size=HASH_BYTES)
        h.update(raw[start : start + step])
        parent = h.digest()
        hashes.append(parent)
    return hashes
