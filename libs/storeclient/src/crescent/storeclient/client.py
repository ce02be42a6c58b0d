"""The store client for the engines (the emulated prefill's KV too) and benchmarks: put
and get KV blocks anywhere in the cluster, find the longest cached prefix per node, order
replication.

Bytes take the shortest road: a store on this host is mapped into this process and its slots
are read and written in place (one memcpy a block, no socket; large batches on several
threads); a store elsewhere is reached through the
data plane, over tcp straight from and into the caller's buffers, over rdma through a
registered staging segment (rdma moves only memory registered with its device).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self

import aetcd

from crescent.common.block_index import BlockIndex, apply_block_change
from crescent.common.bus import Bus
from crescent.common.etcd import MirrorEvent, PrefixMirror
from crescent.common.naming import Keys, Subjects
from crescent.common.store_messages import (
    AbortBlocks,
    AllocBlocks,
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
    UnpinBlocks,
)
from crescent.storeclient import metrics
from crescent.storeclient.data_plane import DataPlaneMover
from crescent.storeclient.directory import SegmentDirectory
from crescent.storeclient.mapped_copy import MappedCopier
from crescent.storeclient.transfer_metrics import register_transfer_metrics
from crescent.transfer import (
    Op,
    ShmEndpoint,
    TransferConfig,
    TransferEngine,
    TransportCounters,
    TransportKind,
)
from crescent.transfer.hostinfo import host_id
from crescent.transfer.segment import ShmMapping

log = logging.getLogger(__name__)


@dataclass
class ClientConfig:
    node: str
    timeout_s: float = 30.0
    staging_bytes: int = 64 << 20  # staging for stores reached over rdma (made on first use)
    use_mapping: bool = (
        True  # map same-host stores; False forces the data plane (tests, benchmarks)
    )
    transfer: TransferConfig | None = None  # its `transports` chooses the data plane's roads

    @property
    def is_mapping(self) -> bool:
        """Whether same-host stores are mapped: only where shm is among the chosen transports
        (mapping is shm without the engine), so `transports=(tcp,)` sends every byte over tcp."""
        kinds = self.transfer.transports if self.transfer is not None else None
        return self.use_mapping and (kinds is None or TransportKind.SHM in kinds)


class StoreClient:
    def __init__(self, bus: Bus, etcd: aetcd.Client, cluster: str, config: ClientConfig) -> None:
        self._bus = bus
        self._etcd = etcd
        self._subjects = Subjects(cluster)
        self._keys = Keys(cluster)
        self.config = config
        self.directory = SegmentDirectory()
        self._indexes: dict[str, BlockIndex] = {}
        self._mappings: dict[str, ShmMapping] = {}
        self._unmappable: set[str] = set()
        self._block_bytes: dict[str, int] = {}
        self._host_id = host_id()
        self._transfer: TransferEngine | None = None
        self._data_plane: DataPlaneMover | None = None
        self._tasks: list[asyncio.Task] = []
        self._unpins: dict[str, set[asyncio.Task]] = {}  # node → unpins not answered yet
        self._transfer_config = config.transfer or TransferConfig(node=config.node)
        self._copier = MappedCopier(
            self._transfer_config.shm_copy_threads, self._transfer_config.shm_parallel_bytes
        )

    async def start(self) -> None:
        segments = PrefixMirror(self._etcd, self._keys.segments(""), self.directory.apply)
        await segments.load()
        self._tasks.append(asyncio.create_task(segments.run(), name="store-client segments"))
        self._transfer = TransferEngine(self.directory, self._transfer_config)
        await self._transfer.start()
        self._data_plane = DataPlaneMover(
            self._transfer,
            self.directory,
            self.config.node,
            self.config.staging_bytes,
            self.config.timeout_s,
        )

    async def close(self) -> None:
        for node in list(self._unpins):
            await self._settle_unpins(node)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for mapping in self._mappings.values():
            mapping.close()
        if self._transfer is not None:
            await self._transfer.close()
        if self._data_plane is not None:
            self._data_plane.close()
        self._copier.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def export_transfer_metrics(self, name: str) -> None:
        """Put this client's per-transport counters on the process's /metrics as `engine=name`
        (after start)."""
        register_transfer_metrics(self._transfer, name)

    def transfer_counters(self) -> dict[TransportKind, TransportCounters]:
        """What this client's data plane moved, per transport (mapped copies are not in it)."""
        return self._transfer.counters() if self._transfer is not None else {}

    async def ctl(self, node: str, request, reply_type):
        """One request to `node`'s store (store.<node>.ctl). With `move` and `mapping`, the
        primitives for callers that work below whole blocks, like the vLLM connector, which
        pins once and then moves one layer at a time."""
        return await self._bus.request(
            self._subjects.store_ctl(node), request, reply_type, self.config.timeout_s
        )

    def mapping(self, segment: str) -> ShmMapping | None:
        """The store's segment mapped here, if it lives on this host (and mapping is on).

        A segment's name outlives its store: a store restarted on the node publishes a new
        shm file under the same name. A mapping is reused only while it is the file the
        directory names and its owner is alive; otherwise bytes written through it would land
        in a dead store's memory, where the live one, and every reader it serves, never sees
        them."""
        if not self.config.is_mapping:
            return None
        descriptor = self.directory(segment)
        endpoint = descriptor.endpoint(ShmEndpoint) if descriptor else None
        cached = self._mappings.get(segment)
        if cached is not None:
            if endpoint is not None and cached.maps(endpoint) and cached.owner_is_alive():
                return cached
            del self._mappings[segment]
            cached.close()
        if endpoint is None or descriptor.host_id != self._host_id:
            return None
        try:
            mapping = ShmMapping(
                endpoint.shm_name, descriptor.size, endpoint.device, endpoint.inode
            )
        except OSError as exc:
            if segment not in self._unmappable:
                self._unmappable.add(segment)
                log.warning(
                    "cannot map a same-host store segment; using the data plane",
                    extra={"segment": segment, "error": repr(exc)},
                )
            return None
        self._mappings[segment] = mapping
        return mapping

    async def move(
        self, op: Op, segment: str, offsets: Sequence[int], buffers: Sequence[memoryview]
    ) -> None:
        """Copy buffers into (WRITE) or out of (READ) the store's segment at `offsets`."""
        mapping = self.mapping(segment)
        if mapping is not None:
            await self._copier.copy(op, mapping.view, offsets, buffers)
            _count_moved(op, "mapped", buffers)
            return
        await self._data_plane.move(op, segment, offsets, buffers)
        _count_moved(op, "data-plane", buffers)

    async def put_blocks(
        self,
        model: str,
        node: str,
        hashes: Sequence[bytes],
        blocks: Sequence,
        wait_metadata: bool = False,
    ) -> int:
        """Store whole blocks on `node`'s store; blocks it already has are skipped. Returns
        how many were written, once they are committed: `node`'s store serves them. Their
        keys reach etcd (the cluster's block index) shortly after, or before this returns
        with `wait_metadata`."""
        slots = await self.allocate(model, node, hashes)
        if not slots.allocated:
            if wait_metadata:  # the blocks' own commit (another writer's) may not be in etcd yet
                await self.ctl(node, CommitBlocks(model=model, hashes=[], wait_metadata=True), Done)
            return 0
        await self.fill(model, node, slots, dict(zip(hashes, blocks)), wait_metadata)
        return len(slots.allocated)

    async def allocate(self, model: str, node: str, hashes: Sequence[bytes]) -> BlockSlots:
        """Slots in `node`'s store for the blocks of `hashes` it lacks (the rest come back as
        `existing`). From now until `fill` commits them (or their ttl runs out), a lookup
        allowed to wait for blocks being written waits for these."""
        await self._settle_unpins(node)  # a block this client read is not pinned any more
        return await self.ctl(node, AllocBlocks(model=model, hashes=list(hashes)), BlockSlots)

    async def fill(
        self,
        model: str,
        node: str,
        slots: BlockSlots,
        blocks: Mapping[bytes, Any],
        wait_metadata: bool = False,
    ) -> None:
        """Write the allocated blocks (`blocks[h]` for each hash of `slots.allocated`) and
        commit them; abort them if the write fails."""
        try:
            await self.move(
                Op.WRITE,
                slots.segment,
                slots.offsets,
                [memoryview(blocks[h]).cast("B") for h in slots.allocated],
            )
        except BaseException:
            await self.ctl(node, AbortBlocks(model=model, hashes=slots.allocated), Done)
            raise
        commit = CommitBlocks(model=model, hashes=slots.allocated, wait_metadata=wait_metadata)
        await self.ctl(node, commit, Done)

    async def get_blocks(
        self,
        model: str,
        node: str,
        hashes: Sequence[bytes],
        out: Sequence[memoryview],
        layer: int | None = None,
        num_layers: int = 1,
    ) -> int:
        """Read the longest prefix of `hashes` held on `node` into `out` (whole blocks, or one
        layer's contiguous slice of each); returns how many blocks were read.

        Returns once the bytes are in `out`; the unpin that follows is sent before it returns
        but not waited for (its round trip overlaps the caller's next step). This client's
        next put or evict on that store waits for it, so that they never find the blocks still
        pinned by this read; a lost unpin runs out with the pin's ttl."""
        pinned = await self.ctl(node, PinBlocks(model=model, hashes=list(hashes)), PinnedBlocks)
        try:
            offsets = pinned.offsets
            if layer is not None:
                layer_bytes = pinned.block_bytes // num_layers
                offsets = [offset + layer * layer_bytes for offset in offsets]
            await self.move(
                Op.READ,
                pinned.segment,
                offsets,
                [memoryview(b).cast("B") for b in out[: len(offsets)]],
            )
        finally:
            if pinned.hashes:
                await self._unpin_later(node, UnpinBlocks(model=model, hashes=pinned.hashes))
        return len(pinned.hashes)

    async def _unpin_later(self, node: str, request: UnpinBlocks) -> None:
        """Send an unpin in a tracked task. One event-loop turn lets the task put its request
        on the connection, so that requests this client sends after it reach the store after it
        (NATS keeps one connection's order, and the store takes requests in order)."""
        task = asyncio.create_task(self._unpin(node, request), name=f"unpin on {node}")
        pending = self._unpins.setdefault(node, set())
        pending.add(task)
        task.add_done_callback(pending.discard)
        await asyncio.sleep(0)

    async def _unpin(self, node: str, request: UnpinBlocks) -> None:
        try:
            await self.ctl(node, request, Done)
        except Exception as exc:  # the pins run out with their ttl
            log.warning("unpin failed", extra={"node": node, "error": repr(exc)})

    async def _settle_unpins(self, node: str) -> None:
        """Wait for this client's unpins on `node` (each is bounded by the request timeout)."""
        pending = self._unpins.get(node)
        if pending:
            await asyncio.gather(*pending)

    async def block_bytes(self, node: str) -> int:
        """The block (slot) size of `node`'s store."""
        if node not in self._block_bytes:
            pinned = await self.ctl(node, PinBlocks(model="", hashes=[]), PinnedBlocks)
            self._block_bytes[node] = pinned.block_bytes
        return self._block_bytes[node]

    async def lookup(self, model: str, node: str, hashes: Sequence[bytes]) -> list[str]:
        """Tiers of the longest prefix of `hashes` on `node`, asked of its store directly."""
        return (
            await self.ctl(node, LookupBlocks(model=model, hashes=list(hashes)), LookupReply)
        ).tiers

    async def watch_model(self, model: str) -> BlockIndex:
        """Start following blocks/<model>/ in etcd (the cluster-wide shadow index)."""
        if model not in self._indexes:
            index = BlockIndex()

            def apply(event: MirrorEvent) -> None:
                if apply_block_change(index, event.key, event.value is not None) is None:
                    log.warning("ignoring malformed block key", extra={"key": event.key})

            mirror = PrefixMirror(self._etcd, self._keys.blocks(model), apply)
            await mirror.load()
            self._tasks.append(
                asyncio.create_task(mirror.run(), name=f"store-client blocks {model}")
            )
            self._indexes[model] = index
        return self._indexes[model]

    async def lookup_prefix(self, model: str, hashes: Sequence[bytes]) -> dict[str, int]:
        """Per node, how many leading blocks of `hashes` it holds (from the shadow index)."""
        return dict((await self.watch_model(model)).match(hashes).lengths)

    async def replicate(
        self, model: str, hashes: Sequence[bytes], source_node: str, target_node: str
    ) -> ReplicateReply:
        request = ReplicateBlocks(model=model, hashes=list(hashes), source_node=source_node)
        return await self.ctl(target_node, request, ReplicateReply)

    async def evict(self, model: str, node: str, hashes: Sequence[bytes]) -> EvictReply:
        await self._settle_unpins(node)  # blocks this client read are not kept as pinned
        return await self.ctl(node, EvictBlocks(model=model, hashes=list(hashes)), EvictReply)


def _count_moved(op: Op, route: str, buffers: Sequence[memoryview]) -> None:
    """Bytes that reached their destination (a failed move raised before this is called)."""
    metrics.KV_TRANSFER_BYTES.labels(op.value, route).inc(sum(len(buffer) for buffer in buffers))
