"""How the store client moves block bytes to and from a store it does not map: over the data
plane, straight from and into the caller's buffers where the transport takes plain process
memory (tcp, shm), else (rdma, which moves only memory registered with its device) through a
registered staging segment, made on first use.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from crescent.common.errors import RecoverableError
from crescent.storeclient.directory import SegmentDirectory
from crescent.transfer import Op, ShmSegment, TransferEngine, TransferEntry
from crescent.transfer.buffers import BufferSegment, buffer_regions

# Staged moves go in parts of this size, whose transfers run at once while the next part is
# copied into staging (or the previous one out of it).
PIPELINE_BYTES = 4 << 20


class StagingTooSmall(RecoverableError):
    def __init__(self, num_bytes: int) -> None:
        super().__init__(f"a {num_bytes}-byte block exceeds the staging segment")
        self.num_bytes = num_bytes


class DataPlaneMover:
    """Moves buffers to and from offsets of other processes' segments through one engine."""

    def __init__(
        self,
        transfer: TransferEngine,
        directory: SegmentDirectory,
        node: str,
        staging_bytes: int,
        timeout_s: float,
    ) -> None:
        self._transfer = transfer
        self._directory = directory
        self._node = node
        self._staging_bytes = staging_bytes
        self._timeout_s = timeout_s
        self.staging: ShmSegment | None = None
        self._staging_lock = asyncio.Lock()
        self._buffer_ids = itertools.count()

    def close(self) -> None:
        if self.staging is not None:
            self.staging.close()

    async def move(
        self, op: Op, segment: str, offsets: Sequence[int], buffers: Sequence[memoryview]
    ) -> None:
        """Copy buffers into (WRITE) or out of (READ) `segment` at `offsets`."""
        descriptor = self._directory(segment)
        if descriptor is not None and self._transfer.moves_local_buffers(descriptor):
            await self._move_direct(op, segment, offsets, buffers)
            return
        async with self._staging_lock:
            staging = self._staging_segment().view()
            start = 0
            while start < len(buffers):
                end, used = start, 0
                while end < len(buffers) and used + len(buffers[end]) <= len(staging):
                    used += len(buffers[end])
                    end += 1
                if end == start:
                    raise StagingTooSmall(len(buffers[start]))
                await self._move_staged(
                    op, segment, offsets[start:end], buffers[start:end], staging
                )
                start = end

    async def _move_direct(
        self, op: Op, segment: str, offsets: Sequence[int], buffers: Sequence[memoryview]
    ) -> None:
        """One batch whose local side is the caller's buffers themselves (registered with the
        engine for this batch only): no copy into or out of staging. Buffers sliced from one
        array are one local segment, so the engine sees one group however many blocks.

        Cancelled, it still lets the batch end (by its deadline) before it returns: the
        caller may reuse its buffers at once, so no lane may be left reading or writing them."""
        regions, places = buffer_regions(buffers)
        names: list[str] = []
        try:
            for region in regions:
                name = f"{self._node}.buffer-{next(self._buffer_ids)}"
                self._transfer.register_local(BufferSegment(name, region))
                names.append(name)
            entries = [
                TransferEntry(op, names[region], local_offset, segment, offset, len(buffer))
                for (region, local_offset), offset, buffer in zip(
                    places, offsets, buffers, strict=True
                )
            ]
            batch = asyncio.ensure_future(self._transfer.transfer(entries, timeout=self._timeout_s))
            try:
                result = await asyncio.shield(batch)
            except asyncio.CancelledError:
                await asyncio.wait([batch])
                raise
            result.raise_for_errors()
        finally:
            for name in names:
                self._transfer.unregister_local(name)

    def _staging_segment(self) -> ShmSegment:
        if self.staging is None:
            self.staging = ShmSegment.create(f"{self._node}.client-staging", self._staging_bytes)
            self._transfer.register(self.staging)
        return self.staging

    async def _move_staged(self, op, segment, offsets, buffers, staging: memoryview) -> None:
        """Through the staging segment, in parts of about PIPELINE_BYTES whose transfers run
        at once: a part's copy into staging (write) or out of it (read) overlaps the other
        parts' transfers instead of adding to them."""
        parts, position = [], 0
        for start, end in _parts([len(buffer) for buffer in buffers], PIPELINE_BYTES):
            entries = []
            for offset, buffer in zip(offsets[start:end], buffers[start:end]):
                if op is Op.WRITE:
                    staging[position : position + len(buffer)] = buffer
                entries.append(
                    TransferEntry(op, self.staging.name, position, segment, offset, len(buffer))
                )
                position += len(buffer)
            transfer = self._transfer.transfer(entries, timeout=self._timeout_s)
            parts.append((start, end, entries, asyncio.ensure_future(transfer)))
            await asyncio.sleep(0)  # the part's lanes start before the next part is staged
        try:
            for start, end, entries, transfer in parts:
                (await transfer).raise_for_errors()
                if op is Op.READ:
                    for entry, buffer in zip(entries, buffers[start:end], strict=True):
                        buffer[:] = staging[entry.local_offset : entry.local_offset + entry.length]
        finally:  # staging stays ours until no transfer uses it any more
            pending = [transfer for *_, transfer in parts if not transfer.done()]
            for transfer in pending:
                transfer.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


def _parts(sizes: Sequence[int], max_bytes: int) -> list[tuple[int, int]]:
    """Consecutive index ranges of about `max_bytes` each (at least one item per range)."""
    parts, start, used = [], 0, 0
    for index, size in enumerate(sizes):
        if index > start and used + size > max_bytes:
            parts.append((start, index))
            start, used = index, 0
        used += size
    if start < len(sizes):
        parts.append((start, len(sizes)))
    return parts
