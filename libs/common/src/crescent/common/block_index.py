"""Which node holds which KV block: one pure index (no I/O) that the conductor and the store
client both fill from the `blocks/<model>/<hash>/<node>` keys in etcd.

Block hashes are chained (crescent.common.hashing), so a block's hash names its whole prefix,
and a node's usable prefix for a request is the longest run of the request's hashes, from the
first, that the node holds. `match` finds that run for every node at once: each node gets a
bit, each block the bitmask of its holders, and the walk over the request's hashes ANDs the
masks where a block's holders differ from its parent's, noting which nodes drop out there.
The lookups and the comparisons run in C, however many nodes hold a block; Python visits only
the positions where the holders change, and spells out per-node lengths only where runs end.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, islice, repeat
from operator import ne

_BLOCK_KEY_PARTS = 3  # <model>/<hash>/<node> at the end of a blocks/ key
_FEW_BITS = 8


@dataclass(frozen=True)
class PrefixMatch:
    """Per node, how many leading blocks of a request it holds (absent nodes hold none)."""

    lengths: Mapping[str, int]
    best_len: int
    best_nodes: frozenset[str]  # every node holding all `best_len` blocks

    def length(self, node: str) -> int:
        return self.lengths.get(node, 0)

    @property
    def best_node(self) -> str | None:
        return min(self.best_nodes) if self.best_nodes else None


EMPTY_MATCH = PrefixMatch({}, 0, frozenset())


@dataclass(frozen=True)
class BlockKey:
    """The parts of a `blocks/<model>/<hash>/<node>` key."""

    model: str
    block_hash: bytes
    node: str


def parse_block_key(key: str) -> BlockKey | None:
    """The model, hash and node a blocks/ key names; None for a key that is not one."""
    parts = key.rsplit("/", _BLOCK_KEY_PARTS)
    if len(parts) <= _BLOCK_KEY_PARTS or not all(parts[-_BLOCK_KEY_PARTS:]):
        return None
    model, hash_hex, node = parts[-_BLOCK_KEY_PARTS:]
    try:
        return BlockKey(model, bytes.fromhex(hash_hex), node)
    except ValueError:
        return None


def apply_block_change(index: BlockIndex, key: str, is_put: bool) -> BlockKey | None:
    """Apply one change under blocks/ in etcd (a put, or a delete or lease expiry) to `index`;
    the key's parts, or None when the key is malformed and nothing changed."""
    block_key = parse_block_key(key)
    if block_key is None:
        return None
    if is_put:
        index.add(block_key.block_hash, block_key.node)
    else:
        index.remove(block_key.block_hash, block_key.node)
    return block_key


class BlockIndex:
    """hash → the nodes holding that block, and node → the blocks it holds."""

    def __init__(self) -> None:
        self._holder_bits: dict[bytes, int] = {}  # hash → bitmask of node slots
        self._blocks: dict[str, set[bytes]] = {}  # node → hashes it holds
        self._slot_of: dict[str, int] = {}  # node → its bit position
        self._node_at: list[str | None] = []  # bit position → node (None: free)
        self._free_slots: list[int] = []

    @property
    def num_blocks(self) -> int:
        return len(self._holder_bits)

    def nodes(self) -> list[str]:
        return sorted(self._blocks)

    def holders(self, block_hash: bytes) -> frozenset[str]:
        return frozenset(self._nodes_in(self._holder_bits.get(block_hash, 0)))

    def num_replicas(self, block_hash: bytes) -> int:
        return self._holder_bits.get(block_hash, 0).bit_count()

    def is_held(self, block_hash: bytes) -> bool:
        return block_hash in self._holder_bits

    def num_blocks_of(self, node: str) -> int:
        return len(self._blocks.get(node, ()))

    def blocks_of(self, node: str) -> frozenset[bytes]:
        return frozenset(self._blocks.get(node, ()))

    def add(self, block_hash: bytes, node: str) -> None:
        blocks = self._blocks.get(node)
        if blocks is None:
            blocks = self._blocks[node] = set()
            self._take_slot(node)
        blocks.add(block_hash)
        bit = 1 << self._slot_of[node]
        self._holder_bits[block_hash] = self._holder_bits.get(block_hash, 0) | bit

    def add_many(self, hashes: Iterable[bytes], node: str) -> None:
        for block_hash in hashes:
            self.add(block_hash, node)

    def remove(self, block_hash: bytes, node: str) -> None:
        blocks = self._blocks.get(node)
        if blocks is None or block_hash not in blocks:
            return
        blocks.discard(block_hash)
        holders = self._holder_bits[block_hash] & ~(1 << self._slot_of[node])
        if holders:
            self._holder_bits[block_hash] = holders
        else:
            del self._holder_bits[block_hash]
        if not blocks:
            del self._blocks[node]
            self._free_slot(node)

    def remove_node(self, node: str) -> None:
        """A node's store went away (its etcd lease expired): forget everything it held."""
        for block_hash in list(self._blocks.get(node, ())):
            self.remove(block_hash, node)

    def match(self, hashes: Sequence[bytes]) -> PrefixMatch:
        """Longest held prefix of `hashes` per node, and the best one anywhere."""
        holders = list(map(self._holder_bits.get, hashes, repeat(0)))
        if not holders or not holders[0]:
            return EMPTY_MATCH
        # The set of nodes holding blocks 0..i can only shrink where block i's holders differ
        # from block i-1's: those few positions are found in C, and only they are visited.
        changes = compress(range(1, len(holders)), map(ne, holders, islice(holders, 1, None)))
        alive = holders[0]
        best_len = len(holders)
        lengths: dict[str, int] = {}
        nodes: list[str] = []
        for position in changes:
            still = alive & holders[position]
            if still != alive:
                nodes = self._nodes_in(alive ^ still)  # they hold blocks 0..position-1
                lengths.update(dict.fromkeys(nodes, position))
                alive = still
                if not still:
                    best_len = position
                    break
        if alive:  # these hold the whole request
            nodes = self._nodes_in(alive)
            lengths.update(dict.fromkeys(nodes, best_len))
        # The last run to end is the longest: its nodes hold the best prefix.
        return PrefixMatch(lengths, best_len, frozenset(nodes))

    def _nodes_in(self, mask: int) -> list[str]:
        """The nodes whose bits are set in `mask`. Few bits are peeled off one by one; many are
        read from bin(), whose cost grows with the highest bit rather than with the count."""
        node_at = self._node_at
        if mask.bit_count() > _FEW_BITS:
            return [node_at[slot] for slot, bit in enumerate(reversed(bin(mask)[2:])) if bit == "1"]
        nodes = []
        while mask:
            low = mask & -mask
            nodes.append(node_at[low.bit_length() - 1])
            mask ^= low
        return nodes

    def _take_slot(self, node: str) -> None:
        if self._free_slots:
            slot = self._free_slots.pop()
            self._node_at[slot] = node
        else:
            slot = len(self._node_at)
            self._node_at.append(node)
        self._slot_of[node] = slot

    def _free_slot(self, node: str) -> None:
        slot = self._slot_of.pop(node)
        self._node_at[slot] = None
        self._free_slots.append(slot)
