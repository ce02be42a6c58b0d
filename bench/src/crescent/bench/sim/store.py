"""One node's KV store as the simulator sees it: blocks by id, a DRAM tier and an optional SSD
tier, each LRU, with capacity counted in blocks.

A block leaves DRAM for SSD when DRAM is full (when there is an SSD tier) and leaves the node
when SSD is full; reading an SSD block brings it back to DRAM. `on_add` / `on_remove` fire when
the node starts or stops holding a block in either tier, which is when the real store writes
or deletes the block's metadata key in etcd.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence

BlockEvent = Callable[[bytes, str], None]


def _no_event(block: bytes, node: str) -> None:
    return None


class NodeStore:
    def __init__(
        self,
        node: str,
        capacity_blocks: int | None,
        ssd_blocks: int = 0,
        on_add: BlockEvent = _no_event,
        on_remove: BlockEvent = _no_event,
    ) -> None:
        self.node = node
        self.capacity_blocks = capacity_blocks  # None: unbounded
        self.ssd_blocks = ssd_blocks
        self.on_add = on_add
        self.on_remove = on_remove
        self._dram: OrderedDict[bytes, None] = OrderedDict()
        self._ssd: OrderedDict[bytes, None] = OrderedDict()

    @property
    def num_blocks(self) -> int:
        return len(self._dram) + len(self._ssd)

    @property
    def num_dram_blocks(self) -> int:
        return len(self._dram)

    def holds(self, block: bytes) -> bool:
        return block in self._dram or block in self._ssd

    def prefix_run(self, blocks: Sequence[bytes]) -> int:
        """How many leading blocks of `blocks` this node holds."""
        dram, ssd = self._dram, self._ssd
        count = 0
        for block in blocks:
            if block not in dram and block not in ssd:
                break
            count += 1
        return count

    def read(self, blocks: Sequence[bytes]) -> int:
        """Use held blocks (most recent last); returns how many came from SSD."""
        num_from_ssd = 0
        dram, ssd = self._dram, self._ssd
        for block in blocks:
            if block in dram:
                dram.move_to_end(block)
            elif block in ssd:
                del ssd[block]
                dram[block] = None
                num_from_ssd += 1
        if num_from_ssd:
            self._evict()
        return num_from_ssd

    def write(self, blocks: Sequence[bytes]) -> None:
        """Hold `blocks` (new ones are added, held ones refreshed), then evict down to capacity."""
        dram, ssd = self._dram, self._ssd
        for block in blocks:
            if block in dram:
                dram.move_to_end(block)
            elif block in ssd:
                del ssd[block]
                dram[block] = None
            else:
                dram[block] = None
                self.on_add(block, self.node)
        self._evict()

    def set_capacity(self, capacity_blocks: int | None) -> None:
        self.capacity_blocks = capacity_blocks
        self._evict()

    def _evict(self) -> None:
        capacity = self.capacity_blocks
        if capacity is None:
            return
        dram, ssd = self._dram, self._ssd
        while len(dram) > capacity:
            block, _ = dram.popitem(last=False)
            if self.ssd_blocks > 0:
                ssd[block] = None
                if len(ssd) > self.ssd_blocks:
                    dropped, _ = ssd.popitem(last=False)
                    self.on_remove(dropped, self.node)
            else:
                self.on_remove(block, self.node)
