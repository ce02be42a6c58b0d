"""Which node holds which KV block, and how hot each block is: the conductor's shadow of the
`blocks/<model>/<hash>/<node>` keys in etcd.

Block hashes are chained (crescent.common.hashing), so a block's hash names its whole prefix and
a node's usable prefix for a request is the longest run of the request's hashes, from the
first, that the node holds. `match` finds that run for every node at once by walking the hashes
and shrinking the set of nodes still matching, so it costs O(len(hashes) × replicas) however
many nodes and blocks the cluster has.

Hotness is a per-block hit count that decays with a half-life, so yesterday's system prompt
stops looking hot on its own; `now` is always an argument.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple


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


class HotBlock(NamedTuple):
    hash: bytes
    num_replicas: int
    hits: float


class _Hits:
    """A decaying count: `value` as of time `at`; `depth` orders parents before children on ties."""

    __slots__ = ("at", "depth", "value")

    def __init__(self, depth: int, at: float) -> None:
        self.value = 0.0
        self.at = at
        self.depth = depth

    def decayed(self, now: float, half_life_s: float) -> float:
        return self.value * 0.5 ** (max(0.0, now - self.at) / half_life_s)


class BlockIndex:
    def __init__(self, hit_half_life_s: float = 60.0) -> None:
        if not hit_half_life_s > 0:
            raise ValueError(f"hit_half_life_s must be > 0, got {hit_half_life_s}")
        self.hit_half_life_s = hit_half_life_s
        self._holders: dict[bytes, set[str]] = {}
        self._blocks: dict[str, set[bytes]] = {}
        self._hits: dict[bytes, _Hits] = {}

    @property
    def num_blocks(self) -> int:
        return len(self._holders)

    def nodes(self) -> list[str]:
        return sorted(self._blocks)

    def holders(self, block_hash: bytes) -> frozenset[str]:
        return frozenset(self._holders.get(block_hash, ()))

    def num_replicas(self, block_hash: bytes) -> int:
        return len(self._holders.get(block_hash, ()))

    def num_blocks_of(self, node: str) -> int:
        return len(self._blocks.get(node, ()))

    def blocks_of(self, node: str) -> frozenset[bytes]:
        return frozenset(self._blocks.get(node, ()))

    def add(self, block_hash: bytes, node: str) -> None:
        self._holders.setdefault(block_hash, set()).add(node)
        self._blocks.setdefault(node, set()).add(block_hash)

    def remove(self, block_hash: bytes, node: str) -> None:
        holders = self._holders.get(block_hash)
        if holders is None or node not in holders:
            return
        holders.discard(node)
        if not holders:
            del self._holders[block_hash]
            self._hits.pop(block_hash, None)  # a block held nowhere cannot be replicated
        blocks = self._blocks[node]
        blocks.discard(block_hash)
        if not blocks:
            del self._blocks[node]

    def remove_node(self, node: str) -> None:
        """A node's store went away (its etcd lease expired): forget everything it held."""
        for block_hash in list(self._blocks.get(node, ())):
            self.remove(block_hash, node)

    def match(self, hashes: Sequence[bytes]) -> PrefixMatch:
        """Longest held prefix of `hashes` per node, and the best one anywhere."""
        lengths: dict[str, int] = {}
        holders_of = self._holders.get
        alive: set[str] = set()  # never mutated: it may be one of the index's own sets
        depth = 0
        for block_hash in hashes:
            holders = holders_of(block_hash)
            if not holders:
                break
            # Most steps lose no node; the subset test finds that without allocating a set.
            if depth and not alive <= holders:
                still = alive & holders
                for node in alive - still:
                    lengths[node] = depth
                if not still:
                    break
                alive = still
            elif not depth:
                alive = holders
            depth += 1
        for node in alive:
            lengths.setdefault(node, depth)
        return PrefixMatch(lengths, depth, frozenset(alive) if depth else frozenset())

    def record_hits(self, hashes: Sequence[bytes], now: float) -> None:
        """Count one use of every block of a request that some node holds."""
        half_life = self.hit_half_life_s
        for depth, block_hash in enumerate(hashes):
            if block_hash not in self._holders:
                continue
            hits = self._hits.get(block_hash)
            if hits is None:
                hits = self._hits[block_hash] = _Hits(depth, now)
            hits.value = hits.decayed(now, half_life) + 1.0
            hits.at = max(hits.at, now)
            hits.depth = min(hits.depth, depth)

    def hits(self, block_hash: bytes, now: float) -> float:
        hits = self._hits.get(block_hash)
        return hits.decayed(now, self.hit_half_life_s) if hits else 0.0

    def hottest(self, k: int, now: float) -> list[HotBlock]:
        """The `k` blocks with the most decayed hits; on ties, shallower (parent) blocks first."""
        half_life = self.hit_half_life_s
        # _Hits.decayed written out: a pass ranks every hit block, and one comprehension over
        # plain tuples costs a third of a key function calling a method per block.
        scored = [(-(hits.value * 0.5 ** ((now - hits.at if now > hits.at else 0.0) / half_life)), hits.depth, h)
                  for h, hits in self._hits.items()]
        return [HotBlock(h, len(self._holders[h]), -negated) for negated, _, h in heapq.nsmallest(k, scored)]

    def depth(self, block_hash: bytes) -> int | None:
        """The position of the block in the requests that hit it, once it has been hit."""
        hits = self._hits.get(block_hash)
        return hits.depth if hits else None

    def add_many(self, hashes: Iterable[bytes], node: str) -> None:
        for block_hash in hashes:
            self.add(block_hash, node)
