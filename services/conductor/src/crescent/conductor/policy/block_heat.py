"""How hot each held KV block is: a per-block hit count that decays with a half-life, so
yesterday's system prompt stops looking hot on its own. `now` is always an argument.

The heat sits beside the block index (crescent.common.block_index), which says who holds a
block; only blocks some node holds are counted or ranked, since only they can be replicated.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

from crescent.common.block_index import BlockIndex


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


class BlockHeat:
    """Decaying hit counts of the blocks in `index`."""

    def __init__(self, index: BlockIndex, hit_half_life_s: float = 60.0) -> None:
        if not hit_half_life_s > 0:
            raise ValueError(f"hit_half_life_s must be > 0, got {hit_half_life_s}")
        self.index = index
        self.hit_half_life_s = hit_half_life_s
        self._hits: dict[bytes, _Hits] = {}

    def record_hits(self, hashes: Sequence[bytes], now: float) -> None:
        """Count one use of every block of a request that some node holds.

        Every placed request runs this over all of its blocks, so _Hits.decayed is written
        out, and its decay is worked out once for the blocks last hit at the same moment (a
        prompt's shared prefix was mostly hit by the same requests): a 1,024-block request
        took 2.6× less time (bench/README.md, schedule, 2026-12-06)."""
        half_life = self.hit_half_life_s
        is_held = self.index.is_held
        all_hits = self._hits
        decay_at, decay = now, 1.0  # the decay factor of blocks last hit at `decay_at`
        for depth, block_hash in enumerate(hashes):
            if not is_held(block_hash):
                continue
            hits = all_hits.get(block_hash)
            if hits is None:
                all_hits[block_hash] = hits = _Hits(depth, now)
            elif hits.depth > depth:
                hits.depth = depth
            if hits.at < now:
                if hits.at != decay_at:
                    decay_at, decay = hits.at, 0.5 ** ((now - hits.at) / half_life)
                hits.value = hits.value * decay + 1.0
                hits.at = now
            else:
                hits.value += 1.0

    def forget(self, block_hash: bytes) -> None:
        """The block is held nowhere any more: it cannot be replicated, so its count goes."""
        self._hits.pop(block_hash, None)

    def hits(self, block_hash: bytes, now: float) -> float:
        hits = self._hits.get(block_hash)
        return hits.decayed(now, self.hit_half_life_s) if hits else 0.0

    def depth(self, block_hash: bytes) -> int | None:
        """The position of the block in the requests that hit it, once it has been hit."""
        hits = self._hits.get(block_hash)
        return hits.depth if hits else None

    def hottest(self, k: int, now: float) -> list[HotBlock]:
        """The `k` held blocks with the most decayed hits; on ties, shallower (parent) blocks
        first."""
        half_life = self.hit_half_life_s
        is_held = self.index.is_held
        # _Hits.decayed written out: a pass ranks every hit block, and one comprehension over
        # plain tuples costs a third of a key function calling a method per block.
        scored = [
            (
                -(hits.value * 0.5 ** ((now - hits.at if now > hits.at else 0.0) / half_life)),
                hits.depth,
                h,
            )
            for h, hits in self._hits.items()
            if is_held(h)
        ]
        num_replicas = self.index.num_replicas
        return [
            HotBlock(h, num_replicas(h), -negated) for negated, _, h in heapq.nsmallest(k, scored)
        ]
