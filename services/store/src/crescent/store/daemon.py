"""Store daemon: one per node. It owns the node's KV blocks — a DRAM pool in a shared-memory
segment that the data plane serves (and co-located engines map directly), an optional SSD
tier — and publishes where each block is in etcd. Requests arrive on store.<node>.ctl.

Every pool change runs under one lock, together with the disk copies it plans, so a slot is
never handed out while its old block is still being moved to SSD. Block bytes from clients
move outside the lock, on the data plane, between allocate and commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

from crescent.common.errors import FatalError, RecoverableError
from crescent.common.etcd import MirrorEvent, PrefixMirror
from crescent.common.hashing import HASH_BYTES
from crescent.common.messages import InstanceInfo, InstanceLoad, StoreStats, StoreStatsRequest
from crescent.common.service import Runtime
from crescent.common.store_messages import (
    AbortBlocks,
    AllocBlocks,
    BlockMeta,
    BlockSlots,
    CommitBlocks,
    Done,
    EvictBlocks,
    EvictReply,
    LookupBlocks,
    LookupReply,
    PinBlocks,
    PinnedBlocks,
    ReplicateBlocks,
    ReplicateReply,
    StoreRequest,
    UnpinBlocks,
)
from crescent.common.telemetry import Ewma
from crescent.store import metrics
from crescent.store.metadata import MetadataWriter
from crescent.store.pool import Block, BlockKey, BlockPool, Plan, PoolError, PoolFullError, Tier
from crescent.store.settings import StoreSettings
from crescent.store.ssd import SsdTier
from crescent.storeclient.directory import SegmentDirectory, encode_segments
from crescent.storeclient.metrics import KV_TRANSFER_BYTES
from crescent.storeclient.transfer_metrics import register_transfer_metrics
from crescent.transfer import (
    Op,
    ShmSegment,
    TransferConfig,
    TransferEngine,
    TransferEntry,
    TransportUnavailable,
    parse_transports,
    sweep_orphans,
)

log = logging.getLogger(__name__)

EXPIRE_PERIOD_S = 1.0
METADATA_FLUSH_TIMEOUT_S = 5.0  # a shutdown's wait for etcd to take the queued block metadata


class BadBlockRequest(PoolError):
    """A request that names blocks wrongly (hash size, duplicates)."""


class ReplicationFailed(RecoverableError):
    def __init__(self, source_node: str, error: Exception) -> None:
        super().__init__(f"pulling blocks from {source_node} failed: {error}")
        self.source_node = source_node


def _keys(model: str, hashes: list[bytes]) -> list[BlockKey]:
    for block_hash in hashes:
        if len(block_hash) != HASH_BYTES:
            raise BadBlockRequest(
                f"block hash of {len(block_hash)} bytes; hashes are {HASH_BYTES} bytes"
            )
    if len(set(hashes)) != len(hashes):
        raise BadBlockRequest("the same block hash appears twice in one request")
    return [(model, h) for h in hashes]


class StoreDaemon:
    role = "store"

    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self.block_bytes = settings.block_bytes
        # set, and replaced, whenever blocks being written are committed, aborted or reclaimed
        self._settled = asyncio.Event()
        self.pool = BlockPool(
            settings.dram_bytes // settings.block_bytes,
            settings.ssd_bytes // settings.block_bytes,
            on_settled=self._note_settled,
        )
        self.directory = SegmentDirectory()
        self.segment: ShmSegment | None = None
        self.ssd: SsdTier | None = None
        self.transfer: TransferEngine | None = None
        self.metadata: MetadataWriter | None = None
        self._lock = asyncio.Lock()
        self._runtime: Runtime | None = None
        self.pull_rate: dict[str, Ewma] = {}  # source node → recent bytes/s of replication pulls
        self._handlers = {
            AllocBlocks: self.alloc,
            CommitBlocks: self.commit,
            AbortBlocks: self.abort,
            LookupBlocks: self.lookup,
            PinBlocks: self.pin,
            UnpinBlocks: self.unpin,
            ReplicateBlocks: self.replicate,
            EvictBlocks: self.evict,
            StoreStatsRequest: self.stats,
        }

    @property
    def segment_name(self) -> str:
        return f"{self.settings.node}.store"

    async def start(self, runtime: Runtime) -> None:
        self._runtime = runtime
        settings = self.settings
        orphans = sweep_orphans()
        if orphans:
            log.warning("removed shared memory left by dead processes", extra={"files": orphans})
        self.segment = ShmSegment.create(
            self.segment_name, self.pool.num_dram_slots * self.block_bytes
        )
        if self.pool.num_ssd_slots:
            self.ssd = SsdTier(Path(settings.ssd_path), self.pool.num_ssd_slots, self.block_bytes)
        config = TransferConfig(
            node=settings.node,
            transports=parse_transports(settings.transports),
            tcp_host=settings.host,
            tcp_advertise_host=runtime.advertise_host,
            tcp_port=settings.transfer_port,
        )
        self.transfer = TransferEngine(self.directory, config)
        try:
            await self.transfer.start()
        except TransportUnavailable as exc:
            raise FatalError(f"--transports {settings.transports}: {exc}") from exc
        register_transfer_metrics(self.transfer, "store")
        descriptor = self.transfer.register(self.segment)
        segments = PrefixMirror(runtime.etcd, runtime.keys.segments(""), self.directory.apply)
        await segments.load()
        runtime.tasks.spawn("segments-watch", segments.run())
        self.metadata = MetadataWriter(runtime.etcd, runtime.leased, runtime.keys, settings.node)
        runtime.leased.on_renew.append(self.metadata.put_all(self._all_metadata))
        runtime.tasks.spawn("block-metadata", self.metadata.run())
        runtime.tasks.spawn("expire", self._expire_loop())
        await runtime.bus.serve(
            runtime.subjects.store_ctl(settings.node), StoreRequest | StoreStatsRequest, self.handle
        )
        # Published last: whoever finds the segment in etcd can already talk to this store.
        await runtime.leased.put(
            runtime.keys.segments(settings.node), encode_segments([descriptor])
        )

    async def handle(self, request):
        return await self._handlers[type(request)](request)

    def instance_info(self) -> InstanceInfo:
        return InstanceInfo(
            role=self.role,
            instance_id=self._runtime.instance_id,
            node=self.settings.node,
            http_url=self._runtime.http_url,
            started_at=time.time(),
        )

    def health(self) -> dict:
        return {"node": self.settings.node, "num_blocks": len(self.pool.blocks)}

    def load(self) -> InstanceLoad:
        for tier in Tier:
            num_slots = self.pool.num_dram_slots if tier is Tier.DRAM else self.pool.num_ssd_slots
            metrics.TIER_USED_BYTES.labels(tier.value).set(
                (num_slots - self.pool.num_free(tier)) * self.block_bytes
            )
            metrics.TIER_CAPACITY_BYTES.labels(tier.value).set(num_slots * self.block_bytes)
        return InstanceLoad(
            role=self.role,
            instance_id=self._runtime.instance_id,
            node=self.settings.node,
            sent_at=time.time(),
            period_s=self.settings.telemetry_period_s,
            bandwidth={node: rate.value for node, rate in self.pull_rate.items()},
        )

    async def finish_inflight(self) -> None:
        """Write the block metadata still queued before the lease is revoked (a read or write in
        flight finishes while NATS drains)."""
        if self.metadata is not None:
            await self.metadata.flush(METADATA_FLUSH_TIMEOUT_S)

    async def drain(self) -> None:
        """Runs after the lease is revoked (block metadata gone): release memory and files."""
        if self.transfer is not None:
            await self.transfer.close()
        if self.segment is not None:
            self.segment.close()
        if self.ssd is not None:
            self.ssd.close()

    def _slot_view(self, slot: int) -> memoryview:
        return self.segment.view()[slot * self.block_bytes : (slot + 1) * self.block_bytes]

    def _meta(self, tier: Tier, slot: int) -> BlockMeta:
        return BlockMeta(tier=tier.value, slot=slot, size=self.block_bytes)

    def _all_metadata(self) -> list[tuple[str, bytes, BlockMeta]]:
        return [
            (b.key[0], b.key[1], self._meta(b.tier, b.slot))
            for b in self.pool.blocks.values()
            if self.pool.get(b.key) is not None
        ]

    async def _carry_out(self, *plans: Plan) -> None:
        """Do what the pool planned, in plan order, before the plans' slots may be reused:
        demote, forget dropped. The SSD writes go in one call: with a thread hop a block, a put
        of 32 blocks of 64 KiB into a full DRAM took 3.2–3.7 ms, with one hop 1.9–2.2 ms
        (bench/README.md, store, 2026-11-30)."""
        moves = [move for plan in plans for move in plan.moves]
        if moves:
            await self.ssd.write_all(
                [(move.ssd_slot, self._slot_view(move.dram_slot)) for move in moves]
            )
        for plan in plans:
            for move in plan.moves:
                self.metadata.put(*move.key, self._meta(Tier.SSD, move.ssd_slot))
            for model, block_hash in plan.dropped:
                self.metadata.delete(model, block_hash)

    async def _expire_loop(self) -> None:
        while True:
            await asyncio.sleep(EXPIRE_PERIOD_S)
            async with self._lock:
                reclaimed = self.pool.expire(time.monotonic())
            if reclaimed:
                log.warning(
                    "reclaimed uncommitted allocations", extra={"num_blocks": len(reclaimed)}
                )

    async def alloc(self, request: AllocBlocks) -> BlockSlots:
        keys = _keys(request.model, request.hashes)
        now = time.monotonic()
        async with self._lock:
            blocks = self.pool.blocks
            existing = [key for key in keys if key in blocks]
            for key in existing:
                self.pool.touch(key)  # written again by someone: a use, for LRU
            new = [key for key in keys if key not in blocks] if existing else keys
            slots = self.pool.allocate_free(new, now, request.ttl_s)
            if slots is None:  # evictions to plan (and carry out) block by block
                slots = await self._allocate_evicting(new, now, request.ttl_s)
        block_bytes = self.block_bytes
        return BlockSlots(
            segment=self.segment_name,
            block_bytes=block_bytes,
            allocated=[key[1] for key in new],
            offsets=[slot * block_bytes for slot in slots],
            existing=[key[1] for key in existing],
        )

    async def _allocate_evicting(self, keys: list[BlockKey], now: float, ttl_s: float) -> list[int]:
        """Slots for `keys` planned one by one, then what the plans ask done at once (under the
        lock); all or none (PoolFullError, after the demotions already planned are done: the
        pool counts those blocks on SSD)."""
        plans: list[Plan] = []
        try:
            for key in keys:
                plans.append(self.pool.allocate(key, now, ttl_s))
        except PoolFullError:
            await self._carry_out(*plans)
            for key in keys[: len(plans)]:
                self.pool.abort(key)
            raise
        await self._carry_out(*plans)
        return [plan.slot for plan in plans]

    async def commit(self, request: CommitBlocks) -> Done:
        """Answered once lookups and pins here see the blocks; their etcd keys follow through
        the metadata writer, or are in etcd already when the request sets `wait_metadata`."""
        keys = _keys(request.model, request.hashes)
        await self.metadata.make_room()
        async with self._lock:
            blocks = self.pool.commit_all(keys)
            put, meta = self.metadata.put, self._meta
            for block in blocks:
                put(*block.key, meta(block.tier, block.slot))
        if request.wait_metadata:
            await self.metadata.sync()
        return Done(num_blocks=len(keys))

    async def abort(self, request: AbortBlocks) -> Done:
        async with self._lock:
            for key in _keys(request.model, request.hashes):
                self.pool.abort(key)
        return Done(num_blocks=len(request.hashes))

    def _note_settled(self) -> None:
        """Wake the lookups waiting for blocks being written: some were committed, aborted or
        reclaimed."""
        self._settled.set()
        self._settled = asyncio.Event()

    async def lookup(self, request: LookupBlocks) -> LookupReply:
        """The longest prefix held here; where it stops at a block being written, waits (up
        to `wait_writing_s`) for that block to settle and looks again."""
        keys = _keys(request.model, request.hashes)
        started = time.monotonic()
        deadline = started + request.wait_writing_s
        waited = False
        while True:
            blocks = self.pool.longest_prefix(keys)
            if len(blocks) == len(keys) or not self.pool.is_writing(keys[len(blocks)]):
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            waited = True
            with contextlib.suppress(TimeoutError):  # then one last look
                async with asyncio.timeout(remaining):
                    await self._settled.wait()
        if request.wait_writing_s > 0:
            metrics.LOOKUP_WAIT.observe(time.monotonic() - started if waited else 0.0)
        return LookupReply(tiers=[b.tier.value for b in blocks])

    async def pin(self, request: PinBlocks) -> PinnedBlocks:
        """Pin the longest prefix held here, loading SSD blocks into DRAM first; stops early
        (a shorter prefix) if DRAM is full of pinned blocks. The SSD blocks' promotions are
        planned first (DRAM blocks pinned as they come, so no promotion evicts them), then
        carried out together: the demotions they cause in one SSD call, then the reads in
        another. A get of 32 SSD blocks of 64 KiB took 6.0–6.2 ms with two thread hops a
        block, 1.5–2.0 ms so (bench/README.md, store, 2026-11-30)."""
        now = time.monotonic()
        async with self._lock:
            prefix: list[Block] = []
            promotions: list[tuple[Block, Plan, int]] = []
            for block in self.pool.longest_prefix(_keys(request.model, request.hashes)):
                if block.tier is Tier.SSD:
                    try:
                        plan, ssd_slot = self.pool.promote(block.key, now)
                    except PoolFullError:
                        break
                    promotions.append((block, plan, ssd_slot))
                else:
                    self.pool.pin(block.key, now, request.ttl_s)
                prefix.append(block)
            if promotions:
                await self._carry_out(*(plan for _, plan, _ in promotions))
                await self.ssd.read_all(
                    [(ssd_slot, self._slot_view(plan.slot)) for _, plan, ssd_slot in promotions]
                )
                for block, plan, _ in promotions:
                    self.pool.finish_promote(block.key, plan.slot)
                    self.metadata.put(*block.key, self._meta(Tier.DRAM, plan.slot))
                    self.pool.pin(block.key, now, request.ttl_s)
        return PinnedBlocks(
            segment=self.segment_name,
            block_bytes=self.block_bytes,
            hashes=[block.key[1] for block in prefix],
            offsets=[block.slot * self.block_bytes for block in prefix],
        )

    async def unpin(self, request: UnpinBlocks) -> Done:
        async with self._lock:
            for key in _keys(request.model, request.hashes):
                self.pool.unpin(key)
        return Done(num_blocks=len(request.hashes))

    async def evict(self, request: EvictBlocks) -> EvictReply:
        evicted, kept = [], []
        async with self._lock:
            for key in _keys(request.model, request.hashes):
                try:
                    self.pool.evict(key)
                except PoolError:
                    kept.append(key[1])
                    continue
                self.metadata.delete(*key)
                evicted.append(key[1])
        await self.metadata.sync()
        return EvictReply(evicted=evicted, kept=kept)

    async def replicate(self, request: ReplicateBlocks) -> ReplicateReply:
        """Pull the blocks this node lacks from `source_node`; counted by reason and outcome."""
        _keys(request.model, request.hashes)
        if request.source_node == self.settings.node:
            raise BadBlockRequest("replicate from this node to itself")
        try:
            reply = await self._pull(request)
        except BaseException:
            metrics.REPLICATIONS.labels(request.reason, "failed").inc()
            raise
        metrics.REPLICATIONS.labels(request.reason, "ok").inc()
        if reply.num_copied:
            metrics.REPLICATED_BLOCKS.labels(request.reason, request.source_node).inc(
                reply.num_copied
            )
        return reply

    async def _pull(self, request: ReplicateBlocks) -> ReplicateReply:
        missing = [h for h in request.hashes if (request.model, h) not in self.pool.blocks]
        if not missing:
            return ReplicateReply(num_copied=0, num_present=len(request.hashes))
        bus, source = self._runtime.bus, self._runtime.subjects.store_ctl(request.source_node)
        timeout_s = self.settings.transfer_timeout_s
        pinned = await bus.request(
            source,
            PinBlocks(model=request.model, hashes=missing, ttl_s=2 * timeout_s),
            PinnedBlocks,
            timeout_s,
        )
        try:
            if pinned.block_bytes != self.block_bytes:
                raise BadBlockRequest(
                    f"{request.source_node} stores {pinned.block_bytes}-byte blocks, "
                    f"this node {self.block_bytes}-byte blocks"
                )
            await self._know_segment(request.source_node, pinned.segment)
            slots = await self.alloc(
                AllocBlocks(model=request.model, hashes=pinned.hashes, ttl_s=2 * timeout_s)
            )
            remote = dict(zip(pinned.hashes, pinned.offsets))
            entries = [
                TransferEntry(
                    Op.READ, self.segment_name, offset, pinned.segment, remote[h], self.block_bytes
                )
                for h, offset in zip(slots.allocated, slots.offsets)
            ]
            started = time.monotonic()
            result = await self.transfer.transfer(entries, timeout=timeout_s)
            self._note_rate(
                request.source_node, len(entries) * self.block_bytes, time.monotonic() - started
            )
            KV_TRANSFER_BYTES.labels("read", "data-plane").inc(len(entries) * self.block_bytes)
            if not result.is_ok:
                await self.abort(AbortBlocks(model=request.model, hashes=slots.allocated))
                raise ReplicationFailed(request.source_node, result.failed()[0][1])
            await self.commit(CommitBlocks(model=request.model, hashes=slots.allocated))
        finally:
            await self._unpin_at(source, request, pinned.hashes)
        return ReplicateReply(
            num_copied=len(slots.allocated),
            num_present=len(request.hashes) - len(missing) + len(slots.existing),
        )

    async def _unpin_at(
        self, source_subject: str, request: ReplicateBlocks, hashes: list[bytes]
    ) -> None:
        """Release the source's pins. A failure is logged, not raised: the copy stands (or its
        own error is what the caller hears), and the pins lapse by their TTL anyway."""
        try:
            await self._runtime.bus.request(
                source_subject,
                UnpinBlocks(model=request.model, hashes=hashes),
                Done,
                self.settings.transfer_timeout_s,
            )
        except Exception as exc:
            log.warning(
                "unpin at the replication source failed; its pins lapse by their TTL",
                extra={"source_node": request.source_node, "error": repr(exc)},
            )

    async def _know_segment(self, node: str, segment: str) -> None:
        """A store that just started may not have reached this one's segment watch yet; read
        its entry directly rather than fail the pull."""
        if self.directory(segment) is None:
            key = self._runtime.keys.segments(node)
            entry = await self._runtime.etcd.get(key.encode())
            if entry is not None:
                self.directory.apply(MirrorEvent(key, entry.value))

    def _note_rate(self, source_node: str, num_bytes: int, seconds: float) -> None:
        """What the conductor's T_transfer uses: a moving average of achieved pull bandwidth."""
        if num_bytes and seconds > 0:
            self.pull_rate.setdefault(source_node, Ewma()).add(num_bytes / seconds)

    async def stats(self, request: StoreStatsRequest) -> StoreStats:
        return StoreStats(
            node=self.settings.node,
            instance_id=self._runtime.instance_id,
            num_blocks=self.pool.num_ready(Tier.DRAM) + self.pool.num_ready(Tier.SSD),
            used_bytes=(self.pool.num_dram_slots - self.pool.num_free(Tier.DRAM))
            * self.block_bytes,
            capacity_bytes=self.pool.num_dram_slots * self.block_bytes,
        )
