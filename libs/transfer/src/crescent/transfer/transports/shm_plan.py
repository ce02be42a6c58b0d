"""Planning of the shm transport's copies, so that many small entries cost about what one
large one does. Every decision is a few numpy calls over a group's columns, none per entry.

- Row copies: a group of many entries of one size, contiguous on one side and at offsets of
  one alignment on the other (a staging area and a store's free slots), is one numpy call: a
  scatter (`rows[index] = block`), a gather (`np.take`) or one block copy, a loop in C.
- Otherwise runs: entries that lie back to back in both segments (a block's layers,
  consecutive slots) are one run, copied by one memcpy; runs are cut into chunks of at most
  `chunk_bytes`, copied one by one so that the deadline and the owners' liveness are checked
  as the copy goes.

A run, and a row copy, succeeds or fails as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from crescent.transfer.batch import Op
from crescent.transfer.groups import EntryGroup
from crescent.transfer.segment import ShmMapping

# (batch indices of the entries it belongs to, remote segment name, destination, source,
# remote mapping): one copy of at most chunk_bytes.
Chunk = tuple[Sequence[int], str, memoryview, memoryview, ShmMapping]

# Groups of fewer entries are planned in plain Python: a numpy call's fixed cost would not
# pay off.
MIN_ROW_ENTRIES = 8


class Run:
    """Entries of a group that lie back to back in the local and the remote segment."""

    __slots__ = ("group", "indices", "length", "local_offset", "mapping", "remote_offset")

    def __init__(
        self,
        group: EntryGroup,
        mapping: ShmMapping,
        indices: Sequence[int],
        local_offset: int,
        remote_offset: int,
        length: int,
    ) -> None:
        self.group, self.mapping, self.indices = group, mapping, indices
        self.local_offset, self.remote_offset, self.length = local_offset, remote_offset, length

    def chunks(self, chunk_bytes: int) -> list[Chunk]:
        local = self.group.local.view()[self.local_offset : self.local_offset + self.length]
        remote = self.mapping.view[self.remote_offset : self.remote_offset + self.length]
        dst, src = (remote, local) if self.group.op is Op.WRITE else (local, remote)
        name = self.group.remote.name
        if self.length <= chunk_bytes:
            return [(self.indices, name, dst, src, self.mapping)]
        return [
            (
                self.indices,
                name,
                dst[start : start + chunk_bytes],
                src[start : start + chunk_bytes],
                self.mapping,
            )
            for start in range(0, self.length, chunk_bytes)
        ]


def plan_runs(group: EntryGroup, mapping: ShmMapping) -> list[Run]:
    """The group's entries as runs of back-to-back entries, in group order."""
    local_offsets, remote_offsets, lengths = (
        group.local_offsets,
        group.remote_offsets,
        group.lengths,
    )
    num = len(lengths)
    if num < MIN_ROW_ENTRIES:
        starts = [0]
        starts.extend(
            row
            for row in range(1, num)
            if local_offsets[row] != local_offsets[row - 1] + lengths[row - 1]
            or remote_offsets[row] != remote_offsets[row - 1] + lengths[row - 1]
        )
    else:
        local_array, remote_array, length_array = (
            np.array(local_offsets),
            np.array(remote_offsets),
            np.array(lengths),
        )
        breaks = np.flatnonzero(
            (local_array[1:] != local_array[:-1] + length_array[:-1])
            | (remote_array[1:] != remote_array[:-1] + length_array[:-1])
        )
        starts = [0, *(breaks + 1).tolist()]
    stops = [*starts[1:], num]
    return [
        Run(
            group,
            mapping,
            group.indices[start:stop],
            local_offsets[start],
            remote_offsets[start],
            sum(lengths[start:stop]) if stop - start > 1 else lengths[start],
        )
        for start, stop in zip(starts, stops, strict=True)
    ]


class RowCopy:
    """A group of equal-size entries contiguous on at least one side and aligned on the other:
    one numpy call copies them all. `of` says whether a group qualifies."""

    def __init__(
        self,
        group: EntryGroup,
        dst: tuple[np.ndarray, np.ndarray | slice],
        src: tuple[np.ndarray, np.ndarray | slice],
    ) -> None:
        self.group = group
        self._dst_rows, self._dst_index = dst
        self._src_rows, self._src_index = src

    @classmethod
    def of(cls, group: EntryGroup, mapping: ShmMapping) -> RowCopy | None:
        lengths = group.lengths
        num = len(lengths)
        if num < MIN_ROW_ENTRIES:
            return None
        length = lengths[0]
        if lengths.count(length) != num:
            return None
        local_rows = _rows(group.local.view(), group.local_offsets, length)
        if local_rows is None:
            return None
        remote_rows = _rows(mapping.view, group.remote_offsets, length)
        if remote_rows is None:
            return None
        dst, src = (remote_rows, local_rows) if group.op is Op.WRITE else (local_rows, remote_rows)
        if isinstance(dst[1], np.ndarray) and isinstance(src[1], np.ndarray):
            return None  # scattered on both sides: numpy would gather into a temporary first
        return cls(group, dst, src)

    @property
    def num_bytes(self) -> int:
        return self.group.num_bytes

    def split(self, num_parts: int) -> list[RowCopy]:
        """This copy as up to `num_parts` copies of consecutive entries, about equal in size,
        for as many threads (each still one numpy call)."""
        num = len(self.group.lengths)
        bounds = [num * part // num_parts for part in range(num_parts + 1)]
        return [
            RowCopy(
                self.group,
                (self._dst_rows, _part(self._dst_index, start, stop)),
                (self._src_rows, _part(self._src_index, start, stop)),
            )
            for start, stop in pairwise(bounds)
            if stop > start
        ]

    def run(self) -> None:
        if isinstance(self._src_index, slice):  # a scatter (or one block) from contiguous rows
            self._dst_rows[self._dst_index] = self._src_rows[self._src_index]
        else:  # a gather straight into contiguous rows (mode="clip": "raise" buffers `out`)
            np.take(
                self._src_rows,
                self._src_index,
                axis=0,
                out=self._dst_rows[self._dst_index],
                mode="clip",
            )


def _part(index: np.ndarray | slice, start: int, stop: int) -> np.ndarray | slice:
    """Entries start..stop of a row index (a slice of rows, or row numbers)."""
    if isinstance(index, slice):
        return slice(index.start + start, index.start + stop)
    return index[start:stop]


def _rows(
    view: memoryview, offsets: list[int], length: int
) -> tuple[np.ndarray, np.ndarray | slice] | None:
    """`view` as rows of `length` bytes aligned with the offsets, and the offsets as row
    numbers (a slice where they follow each other); None if they do not share an alignment."""
    first = offsets[0]
    base = first % length
    num_rows = (view.nbytes - base) // length
    rows = np.frombuffer(view, np.uint8, num_rows * length, base).reshape(num_rows, length)
    if offsets == list(range(first, first + len(offsets) * length, length)):
        return rows, slice(first // length, first // length + len(offsets))
    numbers, remainders = np.divmod(np.array(offsets) - base, length)
    if remainders.any():
        return None
    return rows, numbers.astype(np.intp)


def split(chunks: list[Chunk], num_parts: int) -> list[list[Chunk]]:
    """Contiguous runs of chunks with about equal bytes, one per copy thread."""
    if num_parts == 1:
        return [chunks]
    total = sum(chunk[2].nbytes for chunk in chunks)
    parts: list[list[Chunk]] = [[] for _ in range(num_parts)]
    done = 0
    for chunk in chunks:
        part = min(num_parts - 1, done * num_parts // max(total, 1))
        parts[part].append(chunk)
        done += chunk[2].nbytes
    return [part for part in parts if part]
