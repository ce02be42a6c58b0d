"""Bookkeeping of a node's KV blocks: which slot of which tier holds what, who pins it, and
what to evict. Pure: no I/O, no clock (time comes in as `now`), so its rules — a pinned block
is never evicted, a half-written block is never visible, eviction goes DRAM → SSD → dropped —
are tested exhaustively on their own.

The caller performs the copies this module plans: `allocate` and `promote` return the moves
(DRAM slot → SSD slot) to carry out before the freed DRAM slot is reused.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from crescent.common.errors import RecoverableError

BlockKey = tuple[str, bytes]  # (model, chained block hash)


class PoolError(RecoverableError):
    """A pool operation that cannot be done; the pool is unchanged."""


class PoolFullError(PoolError):
    def __init__(self, tier: str, num_pinned: int) -> None:
        super().__init__(
            f"{tier} pool full: every slot is pinned or being written ({num_pinned} pinned)"
        )
        self.tier = tier


class Tier(enum.Enum):
    DRAM = "dram"
    SSD = "ssd"


class State(enum.Enum):
    WRITING = "writing"  # allocated, not committed: invisible to lookups and reads
    READY = "ready"


@dataclass
class Block:
    key: BlockKey
    tier: Tier
    slot: int
    state: State
    expires_at: float = 0.0  # WRITING: when an uncommitted allocation is reclaimed
    pins: list[float] = field(default_factory=list)  # expiry time of each pin

    @property
    def is_pinned(self) -> bool:
        return bool(self.pins)


@dataclass(frozen=True)
class Move:
    """Copy `key` from DRAM slot `dram_slot` to SSD slot `ssd_slot` (demotion)."""

    key: BlockKey
    dram_slot: int
    ssd_slot: int


@dataclass
class Plan:
    """What the caller must do for an allocation or promotion, in order: moves, then use `slot`."""

    slot: int
    moves: list[Move] = field(default_factory=list)
    dropped: list[BlockKey] = field(default_factory=list)  # gone from this node (metadata delete)


class BlockPool:
    def __init__(
        self,
        num_dram_slots: int,
        num_ssd_slots: int = 0,
        on_settled: Callable[[], None] = lambda: None,
    ) -> None:
        self.num_dram_slots = num_dram_slots
        self.num_ssd_slots = num_ssd_slots
        self.blocks: dict[BlockKey, Block] = {}
        self._free: dict[Tier, list[int]] = {
            Tier.DRAM: list(range(num_dram_slots - 1, -1, -1)),
            Tier.SSD: list(range(num_ssd_slots - 1, -1, -1)),
        }
        # Ready blocks per tier, least recently used first.
        self._lru: dict[Tier, OrderedDict[BlockKey, None]] = {
            Tier.DRAM: OrderedDict(),
            Tier.SSD: OrderedDict(),
        }
        # What `expire` looks at: blocks with pins, and allocations not committed yet. A few
        # among all the node's blocks, which may be millions with an SSD tier.
        self._pinned: set[BlockKey] = set()
        self._writing: set[BlockKey] = set()
        # Called whenever allocations stop being written (committed, aborted or reclaimed, the
        # last also inside an allocation on a full pool): the store's waiting lookups look again.
        self._on_settled = on_settled

    def num_free(self, tier: Tier) -> int:
        return len(self._free[tier])

    def num_ready(self, tier: Tier) -> int:
        return len(self._lru[tier])

    def get(self, key: BlockKey) -> Block | None:
        """The block if it is readable (committed); WRITING blocks do not exist to readers."""
        block = self.blocks.get(key)
        return block if block is not None and block.state is State.READY else None

    def touch(self, key: BlockKey) -> None:
        """A use of the block (if ready): it becomes the most recently used of its tier."""
        block = self.get(key)
        if block is not None:
            self._lru[block.tier].move_to_end(key)

    def allocate(self, key: BlockKey, now: float, ttl_s: float) -> Plan:
        """A DRAM slot for a new block, invisible until `commit`."""
        if key in self.blocks:
            raise PoolError(f"block {key[1].hex()} of {key[0]} already exists or is being written")
        plan = self._take_dram_slot(now)
        self.blocks[key] = Block(key, Tier.DRAM, plan.slot, State.WRITING, expires_at=now + ttl_s)
        self._writing.add(key)
        return plan

    def allocate_free(self, keys: list[BlockKey], now: float, ttl_s: float) -> list[int] | None:
        """DRAM slots for new blocks `keys` (none of which exists), in one step when free
        slots cover them all, so no eviction is planned; None (nothing changed) otherwise, and
        the caller allocates them one by one. The slots come in ascending order: free slots
        that lie back to back stay back to back, so the bytes of the blocks move in fewer
        pieces."""
        free = self._free[Tier.DRAM]
        if len(keys) > len(free):
            return None
        slots = free[len(free) - len(keys) :]
        del free[len(free) - len(keys) :]
        slots.sort()
        expires_at = now + ttl_s
        blocks = self.blocks
        for key, slot in zip(keys, slots):
            blocks[key] = Block(key, Tier.DRAM, slot, State.WRITING, expires_at=expires_at)
        self._writing.update(keys)
        return slots

    def commit_all(self, keys: list[BlockKey]) -> list[Block]:
        """Commit every one of `keys`, or none (PoolError) if one was not allocated."""
        blocks = [self.blocks.get(key) for key in keys]
        for key, block in zip(keys, blocks):
            if block is None or block.state is not State.WRITING:
                raise PoolError(
                    f"commit of block {key[1].hex()} of {key[0]}, which was not allocated"
                )
        lru = self._lru[Tier.DRAM]
        for block in blocks:
            block.state = State.READY
            lru[block.key] = None
        self._writing.difference_update(keys)
        self._on_settled()
        return blocks

    def commit(self, key: BlockKey) -> Block:
        block = self.blocks.get(key)
        if block is None or block.state is not State.WRITING:
            raise PoolError(f"commit of block {key[1].hex()} of {key[0]}, which was not allocated")
        block.state = State.READY
        self._lru[Tier.DRAM][key] = None
        self._writing.discard(key)
        self._on_settled()
        return block

    def abort(self, key: BlockKey) -> None:
        """Give back an allocation whose write failed."""
        block = self.blocks.get(key)
        if block is not None and block.state is State.WRITING:
            del self.blocks[key]
            self._writing.discard(key)
            self._free[Tier.DRAM].append(block.slot)
            self._on_settled()

    def pin(self, key: BlockKey, now: float, ttl_s: float) -> Block:
        """Keep a DRAM block from eviction until `unpin` or `now + ttl_s` (a crashed reader's
        pins run out)."""
        block = self.get(key)
        if block is None or block.tier is not Tier.DRAM:
            raise PoolError(f"pin of block {key[1].hex()} of {key[0]}, which is not ready in DRAM")
        block.pins.append(now + ttl_s)
        self._pinned.add(key)
        self._lru[Tier.DRAM].move_to_end(key)
        return block

    def unpin(self, key: BlockKey) -> None:
        block = self.blocks.get(key)
        if block is not None and block.pins:
            block.pins.remove(min(block.pins))
            if not block.pins:
                self._pinned.discard(key)

    def promote(self, key: BlockKey, now: float) -> tuple[Plan, int]:
        """Plan moving an SSD block back to DRAM; returns (plan for the DRAM slot, its SSD slot).
        The caller copies SSD → DRAM slot, then calls `finish_promote`."""
        block = self.get(key)
        if block is None or block.tier is not Tier.SSD:
            raise PoolError(f"promote of block {key[1].hex()} of {key[0]}, which is not on SSD")
        del self._lru[Tier.SSD][key]  # not an eviction victim while it moves
        try:
            plan = self._take_dram_slot(now)
        except PoolError:
            self._lru[Tier.SSD][key] = None
            raise
        return plan, block.slot

    def finish_promote(self, key: BlockKey, dram_slot: int) -> None:
        block = self.blocks[key]
        self._free[Tier.SSD].append(block.slot)
        block.tier, block.slot = Tier.DRAM, dram_slot
        self._lru[Tier.DRAM][key] = None

    def evict(self, key: BlockKey) -> Block:
        """Drop a ready, unpinned block from this node."""
        block = self.get(key)
        if block is None:
            raise PoolError(f"evict of block {key[1].hex()} of {key[0]}, which is not here")
        if block.is_pinned:
            raise PoolError(f"evict of block {key[1].hex()} of {key[0]}, which is pinned")
        self._remove(block)
        return block

    def expire(self, now: float) -> list[BlockKey]:
        """Drop runs-out pins and reclaim allocations never committed; returns reclaimed keys."""
        for key in list(self._pinned):
            self._drop_pins_run_out(self.blocks[key], now)
        reclaimed = [key for key in self._writing if self.blocks[key].expires_at <= now]
        for key in reclaimed:
            self.abort(key)
        return reclaimed

    def _drop_pins_run_out(self, block: Block, now: float) -> None:
        block.pins = [t for t in block.pins if t > now]
        if not block.pins:
            self._pinned.discard(block.key)

    def _take_dram_slot(self, now: float) -> Plan:
        """A free DRAM slot, else the slot of the least recently used block no pin holds (that
        block demoted to SSD or dropped). A full pool is a long-running store's usual state, so
        reclaiming allocations that ran out uncommitted (`expire`, which the store also runs
        every second) comes only when no block can be evicted."""
        free = self._free[Tier.DRAM]
        if free:
            return Plan(slot=free.pop())
        victim = self._lru_victim(now)
        if victim is not None:
            return self._displace(victim)
        self.expire(now)
        if free:
            return Plan(slot=free.pop())
        raise PoolFullError("DRAM", len(self._pinned))

    def _lru_victim(self, now: float) -> Block | None:
        """The least recently used ready DRAM block that no pin still running holds; the pins
        that ran out are dropped on the way."""
        for key in self._lru[Tier.DRAM]:
            block = self.blocks[key]
            if block.pins:
                self._drop_pins_run_out(block, now)
            if not block.pins:
                return block
        return None

    def _displace(self, victim: Block) -> Plan:
        """Free `victim`'s DRAM slot: it moves to an SSD slot, or leaves the node."""
        plan = Plan(slot=victim.slot)
        del self._lru[Tier.DRAM][victim.key]
        ssd_slot = self._take_ssd_slot(plan)
        if ssd_slot is None:
            del self.blocks[victim.key]
            plan.dropped.append(victim.key)
        else:
            plan.moves.append(Move(victim.key, victim.slot, ssd_slot))
            victim.tier, victim.slot = Tier.SSD, ssd_slot
            self._lru[Tier.SSD][victim.key] = None
        return plan

    def _take_ssd_slot(self, plan: Plan) -> int | None:
        if self.num_ssd_slots == 0:
            return None
        if not self._free[Tier.SSD]:
            if not self._lru[Tier.SSD]:
                return None
            oldest, _ = self._lru[Tier.SSD].popitem(last=False)
            plan.dropped.append(oldest)
            self._free[Tier.SSD].append(self.blocks.pop(oldest).slot)
        return self._free[Tier.SSD].pop()

    def _remove(self, block: Block) -> None:
        del self.blocks[block.key]
        self._lru[block.tier].pop(block.key, None)
        self._free[block.tier].append(block.slot)

    def is_writing(self, key: BlockKey) -> bool:
        """Whether `key` is allocated here and not yet committed or aborted."""
        return key in self._writing

    def longest_prefix(self, keys: list[BlockKey]) -> list[Block]:
        """The ready blocks of the longest prefix of `keys` held here, in order. Finding a block
        is a use of it: each found block becomes the most recently used of its tier, so a hot
        prefix is the last to be evicted, not the first (it was inserted early)."""
        found = []
        for key in keys:
            block = self.get(key)
            if block is None:
                break
            self._lru[block.tier].move_to_end(key)
            found.append(block)
        return found
