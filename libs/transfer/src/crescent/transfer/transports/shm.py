"""The shm transport: same-host peers, memcpy between mapped segments.

A peer's segment is reachable when its owner runs on our kernel (same boot id) and its
/dev/shm file is the very file it published (same device and inode). The file is mapped
once and kept. How a batch is copied is planned in shm_plan.py: back-to-back entries as one
run, many equal entries as one numpy call, the rest chunk by chunk so that the deadline and
the owner's liveness are checked as the copy goes.

Where the copies run: a batch of at least `shm_parallel_bytes` whose copies are large (a row
copy, or runs of `shm_parallel_entry_bytes` on average) is split in `shm_copy_threads` parts
copied at once, since numpy releases the GIL while it copies and two threads moved 1.2–1.9×
the bytes of one (bench/README.md, transfer, 2026-11-28). Batches of at most
`shm_inline_bytes` are copied on the event loop (a thread hop alone costs more than such a
copy gains from leaving it), a split one there and on the other copy threads; larger ones
in worker threads only.

A dead owner cannot be seen through memory, so the owner holds a shared flock on its
file while alive; a batch whose owner is found dead before, during or after the copy fails
with PeerUnreachable (its writes landed in memory nobody serves any more).
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from crescent.transfer.batch import Deadline
from crescent.transfer.config import TransferConfig, TransportKind
from crescent.transfer.descriptor import Endpoint, SegmentDescriptor, ShmEndpoint
from crescent.transfer.errors import PeerUnreachable
from crescent.transfer.groups import EntryGroup
from crescent.transfer.segment import Segment, ShmMapping, ShmSegment, shm_file_identity
from crescent.transfer.transports.base import Failures, Transport, TransportContext
from crescent.transfer.transports.shm_plan import Chunk, RowCopy, Run, plan_runs, split

# Chunks up to this size are copied by memoryview assignment: a plain memcpy with less
# call overhead than numpy, holding the GIL for a few microseconds only. Larger chunks go
# through numpy, which releases the GIL while it copies.
GIL_COPY_BYTES = 256 << 10

T = TypeVar("T")


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

    async def execute(self, groups: Sequence[EntryGroup], deadline: Deadline) -> Failures:
        failures: Failures = {}
        mapped = self._alive(await self._map_all(groups, failures), failures)
        rows: list[RowCopy] = []
        runs: list[Run] = []
        for group, mapping in mapped:
            row_copy = RowCopy.of(group, mapping)
            if row_copy is not None:
                rows.append(row_copy)
            else:
                runs.extend(plan_runs(group, mapping))
        num_bytes = sum(group.num_bytes for group, _ in mapped)
        is_inline = num_bytes <= self.context.config.shm_inline_bytes
        unfinished: list[tuple[Sequence[int], str]] = []
        if rows:
            unfinished += await self._copy_rows(rows, deadline, is_inline)
        if runs:
            mappings = list({id(m): m for _, m in mapped}.values())
            unfinished += await self._copy_chunks(runs, mappings, deadline, is_inline)
        for indices, name in unfinished:
            error = deadline.timeout_error(name)
            for index in indices:
                failures[index] = error
        self._alive(mapped, failures)
        return failures

    async def _copy_rows(
        self, rows: list[RowCopy], deadline: Deadline, is_inline: bool
    ) -> list[tuple[Sequence[int], str]]:
        """One numpy call per group (bounded by it, so checked before, not during); a large
        group is split over the copy threads, a numpy call each."""
        loop = asyncio.get_running_loop()
        config = self.context.config
        for position, row_copy in enumerate(rows):
            if deadline.is_expired():
                return [(r.group.indices, r.group.remote.name) for r in rows[position:]]
            if row_copy.num_bytes >= config.shm_parallel_bytes and config.shm_copy_threads > 1:
                parts = row_copy.split(config.shm_copy_threads)
                await self._run_parts([part.run for part in parts], is_inline)
            elif is_inline:
                row_copy.run()
            else:
                await loop.run_in_executor(self.context.executor, row_copy.run)
        return []

    async def _copy_chunks(
        self, runs: list[Run], mappings: list[ShmMapping], deadline: Deadline, is_inline: bool
    ) -> list[tuple[Sequence[int], str]]:
        config = self.context.config
        num_bytes = sum(run.length for run in runs)
        num_threads = _num_copy_threads(num_bytes, len(runs), config)
        chunk_bytes = max(1, min(config.slice_bytes, -(-num_bytes // num_threads)))
        chunks = [chunk for run in runs for chunk in run.chunks(chunk_bytes)]
        copier = _Copier(mappings, deadline, config.slice_bytes)
        if is_inline and num_threads == 1:
            return copier.run(chunks)
        calls = [functools.partial(copier.run, part) for part in split(chunks, num_threads)]
        try:
            parts = await self._run_parts(calls, is_inline)
        except asyncio.CancelledError:
            copier.abort.set()
            raise
        return [unfinished for part in parts for unfinished in part]

    async def _run_parts(self, calls: list[Callable[[], T]], is_inline: bool) -> list[T]:
        """Runs the parts of one batch at once, each on a copy thread; but where the batch is
        small enough for the event loop, its first part runs here. Waking a thread parked on
        an idle core costs that core's wake-up: on a 2-core VM, a 16 MiB copy in two halves
        ran at 30 GB/s on two worker threads, 51 GB/s on one worker beside the caller, and 37
        GB/s on the caller alone (bench/README.md, transfer, 2026-11-29)."""
        loop = asyncio.get_running_loop()
        offloaded = calls[1:] if is_inline else calls
        futures = [loop.run_in_executor(self.context.executor, call) for call in offloaded]
        try:
            here = [calls[0]()] if is_inline else []
        finally:
            results = await asyncio.gather(*futures)
        return here + results

    async def _map_all(
        self, groups: Sequence[EntryGroup], failures: Failures
    ) -> list[tuple[EntryGroup, ShmMapping]]:
        """Each group with the mapping of its remote segment; groups whose segment cannot be
        mapped fail. New mappings are made in a worker thread: populating the page tables
        of a large pool takes a while, and the event loop must not wait for it."""
        mapped = []
        for group in groups:
            try:
                mapping = await self._mapping(group.remote)
            except OSError as exc:
                _fail_group(group, failures, f"cannot map its shm file: {exc}")
                continue
            mapped.append((group, mapping))
        return mapped

    async def _mapping(self, descriptor: SegmentDescriptor) -> ShmMapping:
        endpoint = descriptor.endpoint(ShmEndpoint)
        assert endpoint is not None, "routed to shm without an shm endpoint"
        mapping = self._mappings.get(endpoint.shm_name)
        if mapping is not None and mapping.maps(endpoint):
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
            if raced.maps(endpoint):
                mapping.close()
                return raced
            raced.close()
        self._mappings[endpoint.shm_name] = mapping
        return mapping

    def _alive(
        self, mapped: list[tuple[EntryGroup, ShmMapping]], failures: Failures
    ) -> list[tuple[EntryGroup, ShmMapping]]:
        """The groups whose owner still lives; the others fail (their writes, if any, landed
        in memory nobody serves any more), and their mappings are dropped."""
        dead = {id(m): m for _, m in mapped if not m.owner_is_alive()}
        if not dead:
            return mapped
        alive = []
        for group, mapping in mapped:
            if id(mapping) in dead:
                _fail_group(group, failures, "its owner process died")
            else:
                alive.append((group, mapping))
        for mapping in dead.values():
            if self._mappings.get(mapping.shm_name) is mapping:
                del self._mappings[mapping.shm_name]
            mapping.close()
        return alive


def _num_copy_threads(num_bytes: int, num_runs: int, config: TransferConfig) -> int:
    """Large runs copy faster on several threads (numpy drops the GIL while copying);
    small ones do not: their per-run Python work needs the GIL, and threads then only
    take turns."""
    if (
        num_runs == 0
        or num_bytes < config.shm_parallel_bytes
        or num_bytes // num_runs < config.shm_parallel_entry_bytes
    ):
        return 1
    return config.shm_copy_threads


class _Copier:
    """Copies chunks, checking the deadline (and `abort`, set when the batch is cancelled)
    before each chunk and the owners' liveness about every `check_bytes`, so that a dead
    owner's copies stop early."""

    def __init__(self, mappings: list[ShmMapping], deadline: Deadline, check_bytes: int) -> None:
        self._mappings = mappings
        self._deadline = deadline
        self._check_bytes = check_bytes
        self.abort = threading.Event()

    def run(self, chunks: Sequence[Chunk]) -> list[tuple[Sequence[int], str]]:
        """Returns (batch indices, remote segment) of chunks that were not copied, because
        the deadline passed or the owner died (the caller tells which)."""
        unfinished: list[tuple[Sequence[int], str]] = []
        dead: set[int] = set()
        since_check = 0
        for position, (indices, name, dst, src, mapping) in enumerate(chunks):
            if since_check >= self._check_bytes:
                since_check = 0
                dead = {id(m) for m in self._mappings if not m.owner_is_alive()}
            if self._deadline.is_expired() or self.abort.is_set():
                unfinished.extend((chunk[0], chunk[1]) for chunk in chunks[position:])
                break
            if id(mapping) in dead:
                unfinished.append((indices, name))
                continue
            if dst.nbytes <= GIL_COPY_BYTES:
                dst[:] = src
            else:
                np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))
            since_check += dst.nbytes
        return unfinished


def _fail_group(group: EntryGroup, failures: Failures, cause: str) -> None:
    error = PeerUnreachable(group.remote.node, group.remote.name, cause)
    for index in group.indices:
        failures[index] = error
