"""The shm transport: same-host peers, one memcpy per entry between mapped segments.

A peer's segment is reachable when its owner runs on our kernel (same boot id) and its
/dev/shm file is the very file it published (same device and inode). The file is mapped
once and kept; copies run in worker threads (numpy releases the GIL while it copies; big
entries are split over `shm_copy_threads` threads), in chunks so that the deadline and the
owner's liveness are checked as they go. Batches of at most `shm_inline_bytes` are copied
on the event loop: a thread hop would cost more than the copy.

A dead owner cannot be seen through memory, so the owner holds a shared flock on its
file while alive; a batch whose owner is found dead before, during or after the copy fails
with PeerUnreachable (its writes landed in memory nobody serves any more).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np

from crescent.transfer.batch import Deadline, Op
from crescent.transfer.config import TransferConfig, TransportKind
from crescent.transfer.descriptor import Endpoint, SegmentDescriptor, ShmEndpoint
from crescent.transfer.errors import PeerUnreachable, TransferError
from crescent.transfer.segment import Segment, ShmMapping, ShmSegment, shm_file_identity
from crescent.transfer.transports.base import Transport, TransportContext, WorkItem


# (item index, destination, source, remote mapping): one copy of at most chunk_bytes.
_Chunk = tuple[int, memoryview, memoryview, ShmMapping]

# Chunks up to this size are copied by memoryview assignment: a plain memcpy with less
# call overhead than numpy, holding the GIL for a few microseconds only. Larger chunks go
# through numpy, which releases the GIL while it copies.
GIL_COPY_BYTES = 256 << 10


class ShmTransport(Transport):
    kind = TransportKind.SHM

    def __init__(self, context: TransportContext) -> None:
        super().__init__(context)
        self._mappings: dict[str, ShmMapping] = {}

    async def close(self) -> None:
        for mapping in self._mappings.values():
            mapping.close()
        self._mappings.clear()

    def expose(self, segment: Segment, segment_id: int) -> Endpoint | None:
        if not isinstance(segment, ShmSegment):
            return None
        return ShmEndpoint(segment.shm_name, segment.device, segment.inode)

    def can_reach(self, descriptor: SegmentDescriptor) -> bool:
        endpoint = descriptor.endpoint(ShmEndpoint)
        return (
            endpoint is not None
            and descriptor.host_id == self.context.host_id
            and shm_file_identity(endpoint.shm_name) == (endpoint.device, endpoint.inode)
        )

    async def execute(
        self, items: Sequence[WorkItem], deadline: Deadline
    ) -> list[TransferError | None]:
        outcomes: list[TransferError | None] = [None] * len(items)
        mappings = await self._map_all(items, outcomes)
        self._fail_dead_owners(mappings, items, outcomes)
        config = self.context.config
        lengths = [item.entry.length for i, item in enumerate(items) if outcomes[i] is None]
        num_bytes = sum(lengths)
        num_threads = _num_copy_threads(num_bytes, len(lengths), config)
        chunk_bytes = max(1, min(config.slice_bytes, -(-num_bytes // num_threads)))
        chunks = _plan_chunks(items, mappings, outcomes, chunk_bytes)
        copier = _Copier(list(set(mappings.values())), deadline, config.slice_bytes)
        if num_bytes <= config.shm_inline_bytes:
            unfinished = copier.run(chunks)
        else:
            loop = asyncio.get_running_loop()
            futures = [
                loop.run_in_executor(self.context.executor, copier.run, part)
                for part in _split(chunks, num_threads)
            ]
            try:
                parts = await asyncio.gather(*futures)
            except asyncio.CancelledError:
                copier.abort.set()
                raise
            unfinished = set().union(*parts)
        for index in unfinished:
            outcomes[index] = deadline.timeout_error(items[index].remote.name)
        self._fail_dead_owners(mappings, items, outcomes)
        return outcomes

    async def _map_all(
        self, items: Sequence[WorkItem], outcomes: list[TransferError | None]
    ) -> dict[str, ShmMapping]:
        """The mapping of each remote segment of the batch; items whose segment cannot be
        mapped fail. New mappings are made in a worker thread: populating the page tables
        of a large pool takes a while, and the event loop must not wait for it."""
        mappings: dict[str, ShmMapping] = {}
        failures: dict[str, str] = {}
        for index, item in enumerate(items):
            name = item.remote.name
            if name not in mappings and name not in failures:
                try:
                    mappings[name] = await self._mapping(item.remote)
                except OSError as exc:
                    failures[name] = f"cannot map its shm file: {exc}"
            if name in failures:
                outcomes[index] = _unreachable(item, failures[name])
        return mappings

    async def _mapping(self, descriptor: SegmentDescriptor) -> ShmMapping:
        endpoint = descriptor.endpoint(ShmEndpoint)
        assert endpoint is not None, "routed to shm without an shm endpoint"
        mapping = self._mappings.get(endpoint.shm_name)
        if mapping is not None and (mapping.device, mapping.inode) == (
            endpoint.device,
            endpoint.inode,
        ):
            return mapping
        if mapping is not None:
            mapping.close()
            del self._mappings[endpoint.shm_name]
        loop = asyncio.get_running_loop()
        mapping = await loop.run_in_executor(
            self.context.executor,
            ShmMapping,
            endpoint.shm_name,
            descriptor.size,
            endpoint.device,
            endpoint.inode,
        )
        raced = self._mappings.get(endpoint.shm_name)
        if raced is not None:  # a concurrent batch mapped this name meanwhile
            if (raced.device, raced.inode) == (mapping.device, mapping.inode):
                mapping.close()
                return raced
            raced.close()
        self._mappings[endpoint.shm_name] = mapping
        return mapping

    def _fail_dead_owners(
        self,
        mappings: dict[str, ShmMapping],
        items: Sequence[WorkItem],
        outcomes: list[TransferError | None],
    ) -> None:
        dead = {name for name, mapping in mappings.items() if not mapping.owner_is_alive()}
        if not dead:
            return
        for index, item in enumerate(items):
            if item.remote.name in dead:
                outcomes[index] = _unreachable(item, "its owner process died")
        for name in dead:
            mapping = mappings.pop(name)
            if self._mappings.get(mapping.shm_name) is mapping:
                del self._mappings[mapping.shm_name]
            mapping.close()


def _num_copy_threads(num_bytes: int, num_entries: int, config: TransferConfig) -> int:
    """Large entries copy faster on several threads (numpy drops the GIL while copying);
    small ones do not: their per-entry Python work needs the GIL, and threads then only
    take turns."""
    if num_entries == 0 or num_bytes // num_entries < config.shm_parallel_entry_bytes:
        return 1
    return config.shm_copy_threads


def _plan_chunks(
    items: Sequence[WorkItem],
    mappings: dict[str, ShmMapping],
    outcomes: list[TransferError | None],
    chunk_bytes: int,
) -> list[_Chunk]:
    """Every copy still to do, cut into chunks of at most `chunk_bytes`."""
    chunks = []
    for index, item in enumerate(items):
        if outcomes[index] is not None:
            continue
        entry = item.entry
        mapping = mappings[item.remote.name]
        local = item.local.view()[entry.local_offset : entry.local_offset + entry.length]
        remote = mapping.view[entry.remote_offset : entry.remote_offset + entry.length]
        dst, src = (remote, local) if entry.op is Op.WRITE else (local, remote)
        if entry.length <= chunk_bytes:
            chunks.append((index, dst, src, mapping))
            continue
        for start in range(0, entry.length, chunk_bytes):
            end = start + chunk_bytes
            chunks.append((index, dst[start:end], src[start:end], mapping))
    return chunks


def _split(chunks: list[_Chunk], num_parts: int) -> list[list[_Chunk]]:
    """Contiguous runs of chunks with about equal bytes, one per copy thread."""
    if num_parts == 1:
        return [chunks]
    total = sum(chunk[1].nbytes for chunk in chunks)
    parts: list[list[_Chunk]] = [[] for _ in range(num_parts)]
    done = 0
    for chunk in chunks:
        part = min(num_parts - 1, done * num_parts // max(total, 1))
        parts[part].append(chunk)
        done += chunk[1].nbytes
    return [part for part in parts if part]


class _Copier:
    """Copies chunks, checking the deadline (and `abort`, set when the batch is cancelled)
    before each chunk and the owners' liveness about every `check_bytes`, so that a dead
    owner's copies stop early."""

    def __init__(self, mappings: list[ShmMapping], deadline: Deadline, check_bytes: int) -> None:
        self._mappings = mappings
        self._deadline = deadline
        self._check_bytes = check_bytes
        self.abort = threading.Event()

    def run(self, chunks: Sequence[_Chunk]) -> set[int]:
        """Returns the indices of items with a chunk that was not copied, because the
        deadline passed or the owner died (the caller tells which)."""
        unfinished: set[int] = set()
        dead: set[int] = set()
        since_check = 0
        for position, (index, dst, src, mapping) in enumerate(chunks):
            if since_check >= self._check_bytes:
                since_check = 0
                dead = {id(m) for m in self._mappings if not m.owner_is_alive()}
            if self._deadline.is_expired() or self.abort.is_set():
                unfinished.update(chunk[0] for chunk in chunks[position:])
                break
            if id(mapping) in dead:
                unfinished.add(index)
                continue
            if dst.nbytes <= GIL_COPY_BYTES:
                dst[:] = src
            else:
                np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))
            since_check += dst.nbytes
        return unfinished


def _unreachable(item: WorkItem, cause: str) -> PeerUnreachable:
    return PeerUnreachable(item.remote.node, item.remote.name, cause)
