"""A caller's own memory as the local side of a batch, so that its bytes go straight to or
from the socket instead of through a registered staging segment (one memcpy fewer per byte).

`BufferSegment` wraps any C-contiguous buffer. The engine takes it with `register_local`: it
gets no id and no endpoints, so no peer can address it, and only transports that move bytes
from plain process memory (shm, tcp; not rdma, whose memory must be registered with the
device beforehand) accept it. `buffer_regions` finds the memory a list of buffers lives in, so
that blocks sliced from one array are one segment and a batch of them one group of entries.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from crescent.transfer.segment import MemoryKind, Segment


class BufferSegment(Segment):
    """A caller's buffer as a segment for the batches it takes part in. The segment holds a
    view of it, so the memory stays alive while a transfer uses it; writing into it (a read
    batch) needs a writable buffer."""

    def __init__(self, name: str, buffer: memoryview) -> None:
        view = memoryview(buffer).cast("B")
        super().__init__(name, view.nbytes, MemoryKind.HOST)
        self._view: memoryview | None = view

    def view(self) -> memoryview:
        if self._view is None:
            raise ValueError(f"segment {self.name!r} is closed")
        return self._view

    def array(self) -> np.ndarray:
        return np.frombuffer(self.view(), dtype=np.uint8)

    def close(self) -> None:
        """Drop this segment's view; the caller's memory is the caller's."""
        self._view = None


def buffer_regions(
    buffers: Sequence[memoryview],
) -> tuple[list[memoryview], list[tuple[int, int]]]:
    """The distinct regions `buffers` lie in, and for each buffer (region index, offset).

    A buffer sliced from a numpy array lies in the top-most array it was sliced from (when
    that one is C-contiguous); buffers from one such array share a region. Any other buffer
    is its own region, shared only with buffers of the same memory (the same block written
    to many slots)."""
    regions: list[memoryview] = []
    region_starts: list[int] = []
    by_owner: dict[int, int] = {}
    keep_alive = []  # owners whose id() keys by_owner must not be reused during this call
    places = []
    for buffer in buffers:
        owner = _owner(buffer)
        keep_alive.append(owner)
        start = _address(buffer)
        index = by_owner.get(id(owner))
        if index is not None:
            offset = start - region_starts[index]
            if 0 <= offset and offset + buffer.nbytes <= regions[index].nbytes:
                places.append((index, offset))
                continue
        region = _region_of(owner, buffer)
        index = len(regions)
        regions.append(region)
        region_starts.append(_address(region))
        by_owner[id(owner)] = index
        places.append((index, start - region_starts[index]))
    return regions, places


def _owner(buffer: memoryview) -> object:
    """The object whose memory `buffer` shows: for numpy, the top-most array of its slices."""
    owner = buffer.obj
    while isinstance(owner, np.ndarray) and isinstance(owner.base, np.ndarray):
        owner = owner.base
    return owner


def _region_of(owner: object, buffer: memoryview) -> memoryview:
    """All of `owner`'s memory as bytes when it is one C-contiguous block holding `buffer`,
    else `buffer` itself."""
    if isinstance(owner, np.ndarray) and owner.flags.c_contiguous:
        region = memoryview(owner.reshape(-1).view(np.uint8))
        offset = _address(buffer) - _address(region)
        if 0 <= offset and offset + buffer.nbytes <= region.nbytes:
            return region
    return memoryview(buffer).cast("B")


def _address(buffer: memoryview) -> int:
    """Where `buffer`'s memory starts. ctypes reads a writable buffer's pointer ten times
    faster than numpy's array interface, which a batch of many small blocks pays per block;
    read-only and empty buffers take the numpy road."""
    if buffer.readonly or not buffer.nbytes:
        return np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0]
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))
