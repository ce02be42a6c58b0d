"""The store's control API on store.<node>.ctl (DESIGN §5): allocate-then-commit writes, pinned
reads, lookups, replication and eviction of KV blocks, named by (model, chained hash).

Block bytes never travel here: they move on the data plane into and out of the slots these
messages name (offsets into the store's registered segment).
"""

from __future__ import annotations

from crescent.common.codec import Message


class BlockMeta(Message):
    """Value of blocks/<model>/<hash>/<node> in etcd."""

    tier: str
    slot: int
    size: int


class AllocBlocks(Message):
    model: str
    hashes: list[bytes]
    ttl_s: float = 30.0  # an allocation not committed by then is reclaimed


class BlockSlots(Message):
    """Where to write: `offsets[i]` in `segment` belongs to `allocated[i]`; blocks in
    `existing` are already stored and need no write."""

    segment: str
    block_bytes: int
    allocated: list[bytes]
    offsets: list[int]
    existing: list[bytes] = []


class CommitBlocks(Message):
    model: str
    hashes: list[bytes]


class AbortBlocks(Message):
    model: str
    hashes: list[bytes]


class LookupBlocks(Message):
    model: str
    hashes: list[bytes]


class LookupReply(Message):
    """The longest prefix of the asked hashes this node holds, with each block's tier."""

    tiers: list[str]


class PinBlocks(Message):
    """Pin the longest held prefix of `hashes` in DRAM (loading SSD blocks first) for reading."""

    model: str
    hashes: list[bytes]
    ttl_s: float = 30.0


class PinnedBlocks(Message):
    segment: str
    block_bytes: int
    hashes: list[bytes]
    offsets: list[int]


class UnpinBlocks(Message):
    model: str
    hashes: list[bytes]


class ReplicateBlocks(Message):
    """Pull these blocks from the store on `source_node` and keep them here."""

    model: str
    hashes: list[bytes]
    source_node: str


class ReplicateReply(Message):
    num_copied: int
    num_present: int


class EvictBlocks(Message):
    model: str
    hashes: list[bytes]


class EvictReply(Message):
    evicted: list[bytes]
    kept: list[bytes]  # pinned or not here


class Done(Message):
    num_blocks: int


StoreRequest = (AllocBlocks | CommitBlocks | AbortBlocks | LookupBlocks | PinBlocks | UnpinBlocks
                | ReplicateBlocks | EvictBlocks)
