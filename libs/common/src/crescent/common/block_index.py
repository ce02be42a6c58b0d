"""Which node holds which KV block: one pure index (no I/O) that the conductor and the store
client both fill from the `blocks/<model>/<hash>/<node>` keys in etcd.

Block hashes are chained (crescent.common.hashing), so a block's hash names its whole prefix,
and a node's usable prefix for a request is the longest run of the request's hashes, from the
first, that the node holds. `match` finds that run for every node at once: each node gets a
bit, each block the bitmask of its holders, and the walk over the request's hashes ANDs the
masks where a block's holders differ from its parent's, noting which nodes drop out there.

The conductor matches every request (1,024 blocks at 512 nodes is the scale it is built for),
so the walk stays in C but where runs end: equal holder sets are one shared int object
(interned), so "block i's holders differ from block i-1's" is an identity test; the hashes are
looked up in chunks (doubling) and the walk stops at the chunk where the last run ended; and
the nodes of a mask are read a byte of bits at a time from a table kept per byte of slots.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, compress, islice, repeat
from operator import is_not

_BLOCK_KEY_PARTS = 3  # <model>/<hash>/<node> at the end of a blocks/ key
_FEW_BITS = 8
# Hashes are looked up in chunks that double in size, from this one: the walk stops at the
# chunk where the last run ended, and a long match pays for a few chunks only.
_FIRST_CHUNK = 128


@dataclass(frozen=True, eq=False)
class NodeSlots:
    """Each node's bit in the holder masks, as the index had them when it made a match. The
    index makes a new one only when a node takes or frees a bit, so a reader can keep what it
    derived from one (a row → bit table) for as long as matches hand out the same object."""

    slot_of: Mapping[str, int]
    node_at: tuple[str | None, ...]  # bit → node (None: free)

    @property
    def num_slots(self) -> int:
        return len(self.node_at)


@dataclass(frozen=True)
class PrefixMatch:
    """Per node, how many leading blocks of a request it holds (absent nodes hold none).

    Kept as runs: per run that ends, the mask of the nodes whose run it is and its length, with
    the nodes' bits then (`slots`). A policy reading hundreds of nodes reads the masks (numpy,
    by bit); `lengths` by node name is spelled out only when asked for."""

    best_len: int
    best_nodes: frozenset[str]  # every node holding all `best_len` blocks
    runs: tuple[tuple[int, int], ...] = ()
    slots: NodeSlots | None = None

    @cached_property
    def lengths(self) -> Mapping[str, int]:
        node_at = self.slots.node_at if self.slots is not None else ()
        lengths: dict[str, int] = {}
        for mask, length in self.runs:
            bits = bin(mask)[:1:-1]  # bit i is character i
            lengths.update(
                dict.fromkeys((node_at[i] for i, bit in enumerate(bits) if bit == "1"), length)
            )
        return lengths

    def length(self, node: str) -> int:
        slot = self.slots.slot_of.get(node) if self.slots is not None else None
        if slot is None:
            return 0
        return next((length for mask, length in self.runs if mask >> slot & 1), 0)

    @property
    def best_node(self) -> str | None:
        return min(self.best_nodes) if self.best_nodes else None


EMPTY_MATCH = PrefixMatch(0, frozenset())


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
        self._holder_bits: dict[bytes, int] = {}  # hash → bitmask of node slots (interned)
        self._masks: dict[int, list[int]] = {}  # mask → [its one shared object, blocks using it]
        self._blocks: dict[str, set[bytes]] = {}  # node → hashes it holds
        self._slot_of: dict[str, int] = {}  # node → its bit position
        self._node_at: list[str | None] = []  # bit position → node (None: free)
        self._free_slots: list[int] = []
        # Per byte of slots (slots 8k..8k+7), a byte's value → the nodes of its set bits.
        self._byte_nodes: list[dict[int, tuple[str, ...]]] = []
        self._slots: NodeSlots | None = None  # the bits as matches report them, until one moves
        # Stretches of a request's blocks one holder set holds, as matches found them, until a
        # block of one changes: first hash → (length, last hash, mask); hash → its stretch's.
        self._runs: dict[bytes, tuple[int, bytes, int]] = {}
        self._run_of: dict[bytes, bytes] = {}

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
        elif block_hash in blocks:
            return
        blocks.add(block_hash)
        self._forget_run(block_hash)
        old = self._holder_bits.get(block_hash, 0)
        self._holder_bits[block_hash] = self._intern(old | 1 << self._slot_of[node])
        self._release(old)

    def add_many(self, hashes: Iterable[bytes], node: str) -> None:
        for block_hash in hashes:
            self.add(block_hash, node)

    def remove(self, block_hash: bytes, node: str) -> None:
        blocks = self._blocks.get(node)
        if blocks is None or block_hash not in blocks:
            return
        blocks.discard(block_hash)
        self._forget_run(block_hash)
        old = self._holder_bits[block_hash]
        holders = old & ~(1 << self._slot_of[node])
        if holders:
            self._holder_bits[block_hash] = self._intern(holders)
        else:
            del self._holder_bits[block_hash]
        self._release(old)
        if not blocks:
            del self._blocks[node]
            self._free_slot(node)

    def remove_node(self, node: str) -> None:
        """A node's store went away (its etcd lease expired): forget everything it held."""
        for block_hash in list(self._blocks.get(node, ())):
            self.remove(block_hash, node)

    def match(self, hashes: Sequence[bytes]) -> PrefixMatch:
        """Longest held prefix of `hashes` per node, and the best one anywhere."""
        changes = self._changes(hashes)
        _, alive = next(changes, (0, 0))
        if not alive:
            return EMPTY_MATCH
        runs: list[tuple[int, int]] = []
        best_len = len(hashes)
        # The set of nodes holding blocks 0..i can only shrink where block i's holders differ
        # from block i-1's: only those positions are visited.
        for position, holders in changes:
            still = alive & holders
            if still != alive:
                runs.append((alive ^ still, position))  # they hold blocks 0..position-1
                alive = still
                if not still:
                    best_len = position
                    break
        if alive:  # these hold the whole request
            runs.append((alive, best_len))
        # The last run to end is the longest: its nodes hold the best prefix.
        best_nodes = frozenset(self._nodes_in(runs[-1][0]))
        return PrefixMatch(best_len, best_nodes, tuple(runs), self._node_slots())

    def _node_slots(self) -> NodeSlots:
        if self._slots is None:
            self._slots = NodeSlots(dict(self._slot_of), tuple(self._node_at))
        return self._slots

    def _changes(self, hashes: Sequence[bytes]) -> Iterator[tuple[int, int]]:
        """(i, holders of block i) for block 0 and wherever block i's holders are another
        object than block i-1's (masks are interned: equal sets are one object).

        A stretch of blocks that an earlier match found held by one set, unchanged since, is
        crossed with one lookup (`_runs`); the rest are looked up in chunks that double in size
        (the caller stops reading where every run has ended), and the stretches found in them
        recorded for the next request with the same prefix."""
        get, runs = self._holder_bits.get, self._runs
        previous: object = None  # no mask: block 0 is always reported
        position, size, num_hashes = 0, _FIRST_CHUNK, len(hashes)
        while position < num_hashes:
            run = runs.get(hashes[position])
            if run is not None:
                length, last, mask = run
                end = position + length
                # Chained hashes: the same last block means the same blocks all along.
                if end <= num_hashes and hashes[end - 1] == last:
                    if mask is not previous:
                        yield position, mask
                    previous, position = mask, end
                    continue
            stop = min(num_hashes, position + size)
            holders = list(map(get, hashes[position:stop], repeat(0)))
            self._record(hashes, position, holders)
            shifted = chain((previous,), holders)  # block i-1's holders beside block i's
            for offset in compress(range(len(holders)), map(is_not, holders, shifted)):
                yield position + offset, holders[offset]
            previous, position, size = holders[-1], stop, 2 * size

    def _record(self, hashes: Sequence[bytes], start: int, holders: list[int]) -> None:
        """Note each stretch of one holder set among `hashes[start:]` (`holders` are theirs)
        under its first hash; a change to any of its blocks forgets it (`_forget_run`)."""
        runs, run_of = self._runs, self._run_of
        ends = compress(range(1, len(holders)), map(is_not, holders, islice(holders, 1, None)))
        first = 0
        for end in (*ends, len(holders)):
            mask = holders[first]
            if mask:  # a stretch of unknown blocks is not noted: the walk ends there anyway
                run_hashes = hashes[start + first : start + end]
                head = run_hashes[0]
                for block_hash in run_hashes:
                    covering = run_of.get(block_hash)
                    if covering is not None and covering != head:
                        runs.pop(covering, None)  # one live stretch per block at most
                    run_of[block_hash] = head
                runs[head] = (end - first, run_hashes[-1], mask)
            first = end

    def _forget_run(self, block_hash: bytes) -> None:
        """The block's holders changed: the stretch it is part of no longer holds."""
        head = self._run_of.pop(block_hash, None)
        if head is not None:
            self._runs.pop(head, None)

    def _nodes_in(self, mask: int) -> list[str]:
        """The nodes whose bits are set in `mask`: few bits are peeled off one by one; many are
        read a byte at a time through the per-byte tables."""
        if mask.bit_count() <= _FEW_BITS:
            node_at = self._node_at
            nodes = []
            while mask:
                low = mask & -mask
                nodes.append(node_at[low.bit_length() - 1])
                mask ^= low
            return nodes
        nodes = []
        tables = self._byte_nodes
        for position, byte in enumerate(mask.to_bytes((mask.bit_length() + 7) // 8, "little")):
            if byte:
                table = tables[position]
                group = table.get(byte)
                if group is None:
                    group = table[byte] = self._group(position, byte)
                nodes.extend(group)
        return nodes

    def _group(self, position: int, byte: int) -> tuple[str, ...]:
        base = position * 8
        nodes = (self._node_at[base + bit] for bit in range(8) if byte >> bit & 1)
        return tuple(node for node in nodes if node is not None)

    def _intern(self, mask: int) -> int:
        """The one object for this holder set, so that equal sets are identical."""
        entry = self._masks.get(mask)
        if entry is None:
            self._masks[mask] = [mask, 1]
            return mask
        entry[1] += 1
        return entry[0]

    def _release(self, mask: int) -> None:
        """A block no longer uses this holder set (0: it had none)."""
        if mask:
            entry = self._masks[mask]
            entry[1] -= 1
            if not entry[1]:
                del self._masks[mask]

    def _take_slot(self, node: str) -> None:
        if self._free_slots:
            slot = self._free_slots.pop()
            self._node_at[slot] = node
        else:
            slot = len(self._node_at)
            self._node_at.append(node)
            if slot % 8 == 0:
                self._byte_nodes.append({})
        self._slot_of[node] = slot
        self._byte_nodes[slot // 8].clear()
        self._slots = None

    def _free_slot(self, node: str) -> None:
        slot = self._slot_of.pop(node)
        self._node_at[slot] = None
        self._free_slots.append(slot)
        self._byte_nodes[slot // 8].clear()
        self._slots = None
