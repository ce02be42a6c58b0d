"""Planning of the shm transport's copies, so that many small entries cost about what one
large one does.

- Runs: items that lie back to back in both the local and the remote segment (a block's
  layers, consecutive slots, a staging area) are one run, copied by one memcpy.
- Row copies: a batch of many entries of one size between the same two segments, contiguous
  on one side and at offsets of one alignment on the other (a staging area and a store's free
  slots), is one numpy call: a scatter (`rows[index] = block`), a gather (`np.take`) or one
  block copy, a loop in C instead of one Python-level copy per entry.
- Otherwise chunks: runs cut into pieces of at most `chunk_bytes`, copied one by one so that
  the deadline and the owners' liveness are checked as the copy goes.

A run, and a row copy, succeeds or fails as a whole.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from crescent.transfer.batch import Op
from crescent.transfer.errors import TransferError
from crescent.transfer.segment import ShmMapping
from crescent.transfer.transports.base import WorkItem

# (first item index, end item index, destination, source, remote mapping): one copy of at most
# chunk_bytes, of a run of items [first, end).
Chunk = tuple[int, int, memoryview, memoryview, ShmMapping]

# Batches of fewer entries are copied as runs: a numpy call's fixed cost would not pay off.
MIN_ROW_ENTRIES = 8


class Run:
    """Items [first, end) of a batch that lie back to back in the local and the remote segment."""

    __slots__ = (
        "end",
        "first",
        "length",
        "local",
        "local_offset",
        "mapping",
        "op",
        "remote_offset",
    )

    def __init__(self, index: int, item: WorkItem, mapping: ShmMapping) -> None:
        entry = item.entry
        self.first, self.end, self.op, self.local, self.mapping = (
            index,
            index + 1,
            entry.op,
            item.local,
            mapping,
        )
        self.local_offset, self.remote_offset, self.length = (
            entry.local_offset,
            entry.remote_offset,
            entry.length,
        )

    def extend(self, index: int, item: WorkItem, mapping: ShmMapping) -> bool:
        """Take the next item if it continues this run on both sides."""
        entry = item.entry
        if (
            index != self.end
            or entry.op is not self.op
            or item.local is not self.local
            or mapping is not self.mapping
            or entry.local_offset != self.local_offset + self.length
            or entry.remote_offset != self.remote_offset + self.length
        ):
            return False
        self.end = index + 1
        self.length += entry.length
        return True

    def chunks(self, chunk_bytes: int) -> list[Chunk]:
        local = self.local.view()[self.local_offset : self.local_offset + self.length]
        remote = self.mapping.view[self.remote_offset : self.remote_offset + self.length]
        dst, src = (remote, local) if self.op is Op.WRITE else (local, remote)
        if self.length <= chunk_bytes:
            return [(self.first, self.end, dst, src, self.mapping)]
        return [
            (
                self.first,
                self.end,
                dst[start : start + chunk_bytes],
                src[start : start + chunk_bytes],
                self.mapping,
            )
            for start in range(0, self.length, chunk_bytes)
        ]


def plan_runs(
    items: Sequence[WorkItem], mappings: dict[str, ShmMapping], outcomes: list[TransferError | None]
) -> list[Run]:
    """The items still to copy (outcome None), as runs of back-to-back items in batch order."""
    runs: list[Run] = []
    for index, item in enumerate(items):
        if outcomes[index] is not None:
            continue
        mapping = mappings[item.remote.name]
        if not runs or not runs[-1].extend(index, item, mapping):
            runs.append(Run(index, item, mapping))
    return runs


class RowCopy:
    """A batch of equal-size entries between one local segment and one mapping, contiguous on
    at least one side and aligned on the other: one numpy call copies them all. `of` says
    whether a batch qualifies."""

    def __init__(
        self,
        dst_rows: np.ndarray,
        dst_index: np.ndarray | slice,
        src_rows: np.ndarray,
        src_index: np.ndarray | slice,
    ) -> None:
        self._dst_rows, self._dst_index = dst_rows, dst_index
        self._src_rows, self._src_index = src_rows, src_index

    @classmethod
    def of(
        cls,
        items: Sequence[WorkItem],
        mappings: dict[str, ShmMapping],
        outcomes: list[TransferError | None],
    ) -> RowCopy | None:
        if len(items) < MIN_ROW_ENTRIES:
            return None
        first = items[0]
        length, op, local, remote = (
            first.entry.length,
            first.entry.op,
            first.local,
            first.remote.name,
        )
        local_offsets, remote_offsets = [], []
        for item, outcome in zip(items, outcomes):
            entry = item.entry
            if (
                outcome is not None
                or entry.length != length
                or entry.op is not op
                or item.local is not local
                or item.remote.name != remote
            ):
                return None
            local_offsets.append(entry.local_offset)
            remote_offsets.append(entry.remote_offset)
        local_rows = _rows(local.view(), local_offsets, length)
        remote_rows = _rows(mappings[remote].view, remote_offsets, length)
        if local_rows is None or remote_rows is None:
            return None
        (dst_rows, dst_index), (src_rows, src_index) = (
            (remote_rows, local_rows) if op is Op.WRITE else (local_rows, remote_rows)
        )
        if isinstance(dst_index, np.ndarray) and isinstance(src_index, np.ndarray):
            return None  # scattered on both sides: numpy would gather into a temporary first
        return cls(dst_rows, dst_index, src_rows, src_index)

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


def _rows(
    view: memoryview, offsets: list[int], length: int
) -> tuple[np.ndarray, np.ndarray | slice] | None:
    """`view` as rows of `length` bytes aligned with the offsets, and the offsets as row
    numbers (a slice where they follow each other); None if they do not share an alignment."""
    base = offsets[0] % length
    starts = np.array(offsets, dtype=np.int64) - base
    if (starts % length).any():
        return None
    numbers = starts // length
    num_rows = (view.nbytes - base) // length
    rows = np.frombuffer(view, np.uint8, num_rows * length, base).reshape(num_rows, length)
    if (np.diff(numbers) == 1).all():
        return rows, slice(int(numbers[0]), int(numbers[0]) + len(numbers))
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
