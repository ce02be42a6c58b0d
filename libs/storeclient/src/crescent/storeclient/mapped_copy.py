"""Copies between a caller's buffers and a same-host store's pool, mapped into this process.

A batch of at least `parallel_bytes` in blocks of at least PARALLEL_BLOCK_BYTES is split over
`threads` worker threads, one numpy copy per block: numpy releases the GIL while it copies,
and on a 2-core machine two threads copied a 16 MiB batch of 1 MiB blocks out of DRAM in
about half the time of one. Smaller blocks gained nothing that way (64 KiB: each thread's
per-block Python work waits for the GIL; bench/README.md, store, 2026-11-28), so they, and
small batches, are copied on the caller's thread by memoryview assignment, which costs less
per block than a numpy call and needs no thread hop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise

import numpy as np

from crescent.transfer import Op

PARALLEL_BLOCK_BYTES = 256 << 10


class MappedCopier:
    """The copy threads of one store client, and when to use them."""

    def __init__(self, threads: int, parallel_bytes: int) -> None:
        self._threads = threads
        self._parallel_bytes = parallel_bytes
        self._executor = (
            ThreadPoolExecutor(threads, thread_name_prefix="store-copy") if threads > 1 else None
        )

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    async def copy(
        self, op: Op, pool: memoryview, offsets: Sequence[int], buffers: Sequence[memoryview]
    ) -> None:
        """Copy byte buffers into (WRITE) or out of (READ) `pool` at `offsets`. Returns once
        every byte is copied, also when cancelled: a cancelled put frees its slots, and no
        thread may still be writing into them then."""
        num_bytes = sum(map(len, buffers))
        if (
            self._executor is None
            or num_bytes < self._parallel_bytes
            or num_bytes < PARALLEL_BLOCK_BYTES * len(buffers)
        ):
            _copy_views(op, pool, offsets, buffers)
            return
        array = np.frombuffer(pool, np.uint8)
        bounds = [len(buffers) * part // self._threads for part in range(self._threads + 1)]
        loop = asyncio.get_running_loop()
        futures = [
            loop.run_in_executor(
                self._executor, _copy_arrays, op, array, offsets[start:stop], buffers[start:stop]
            )
            for start, stop in pairwise(bounds)
            if stop > start
        ]
        try:
            await asyncio.gather(*futures)
        except asyncio.CancelledError:
            await asyncio.wait(futures)
            raise


def _copy_views(
    op: Op, pool: memoryview, offsets: Sequence[int], buffers: Sequence[memoryview]
) -> None:
    for offset, buffer in zip(offsets, buffers, strict=True):
        region = pool[offset : offset + len(buffer)]
        if op is Op.WRITE:
            region[:] = buffer
        else:
            buffer[:] = region


def _copy_arrays(
    op: Op, pool: np.ndarray, offsets: Sequence[int], buffers: Sequence[memoryview]
) -> None:
    for offset, buffer in zip(offsets, buffers, strict=True):
        region = pool[offset : offset + len(buffer)]
        if op is Op.WRITE:
            np.copyto(region, np.frombuffer(buffer, np.uint8))
        else:
            np.copyto(np.frombuffer(buffer, np.uint8), region)
