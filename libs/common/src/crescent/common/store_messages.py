"""The store's control API on store.<node>.ctl (DESIGN §5): allocate-then-commit writes, pinned
reads, lookups, replication and eviction of KV blocks, named by (model, chained hash).

Block bytes never travel here: they move on the data plane into and out of the slots these
messages name (offsets into the store's registered segment). Field types from `bounds` carry
the ranges a decoded body must respect.
"""

from __future__ import annotations

from crescent.common.bounds import (
    BlockHashes,
    BlockTiers,
    Count,
    Id,
    Name,
    NumBytes,
    Offsets,
    Seconds,
    Ttl,
)
from crescent.common.codec import Message


class BlockMeta(Message):
    """Value of blocks/<model>/<hash>/<node> in etcd."""

    tier: Name
    slot: Count
    size: NumBytes


class AllocBlocks(Message):
    model: Name
    hashes: BlockHashes
    ttl_s: Ttl = 30.0  # an allocation not committed by then is reclaimed


class BlockSlots(Message):
    """Where to write: `offsets[i]` in `segment` belongs to `allocated[i]`; blocks in
    `existing` are already stored and need no write."""

    segment: Name
    block_bytes: NumBytes
    allocated: BlockHashes
    offsets: Offsets
    existing: BlockHashes = []


class CommitBlocks(Message):
    """Make allocated blocks readable. The reply comes once lookups, pins and gets at this
    store see them; their keys in etcd (what the conductor's block index follows) come after,
    within the store's metadata lag (crescent_store_metadata_lag_seconds). With
    `wait_metadata` the reply also waits until those keys are in etcd."""

    model: Name
    hashes: BlockHashes
    wait_metadata: bool = False


class AbortBlocks(Message):
    model: Name
    hashes: BlockHashes


class LookupBlocks(Message):
    """How much of a prefix this node holds. With `wait_writing_s`, a block of the prefix
    still being written here (allocated, not yet committed or aborted) is waited for up to that
    long: a decode instance asks for a prompt its prefill's save may still be committing, as
    the prefill's first token does not wait for that commit."""

    model: Name
    hashes: BlockHashes
    wait_writing_s: Seconds = 0.0


class LookupReply(Message):
    """The longest prefix of the asked hashes this node holds, with each block's tier."""

    tiers: BlockTiers


class PinBlocks(Message):
    """Pin the longest held prefix of `hashes` in DRAM (loading SSD blocks first) for reading."""

    model: Name
    hashes: BlockHashes
    ttl_s: Ttl = 30.0


class PinnedBlocks(Message):
    segment: Name
    block_bytes: NumBytes
    hashes: BlockHashes
    offsets: Offsets


class UnpinBlocks(Message):
    model: Name
    hashes: BlockHashes


REPLICATE_ON_DEMAND = "on-demand"
REPLICATE_HOT_SPOT = "hot-spot"


class ReplicateBlocks(Message):
    """Pull these blocks from the store on `source_node` and keep them here. `reason` says who
    ordered it (on-demand: a prefill carrying out its planned pull; hot-spot: the conductor's
    replication pass); the store counts pulls by it."""

    model: Name
    hashes: BlockHashes
    source_node: Id
    reason: Name = "unspecified"


class ReplicateReply(Message):
    num_copied: Count
    num_present: Count


class EvictBlocks(Message):
    model: Name
    hashes: BlockHashes


class EvictReply(Message):
    evicted: BlockHashes
    kept: BlockHashes  # pinned or not here


class Done(Message):
    num_blocks: Count


StoreRequest = (
    AllocBlocks
    | CommitBlocks
    | AbortBlocks
    | LookupBlocks
    | PinBlocks
    | UnpinBlocks
    | ReplicateBlocks
    | EvictBlocks
)
