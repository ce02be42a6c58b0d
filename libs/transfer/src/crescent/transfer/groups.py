"""A batch as columns: entries that share an op, a local and a remote segment, with their
offsets and lengths as plain lists of ints.

Why: a batch of a few hundred small entries must cost about what one large entry does. Read
once into columns, a batch is checked in a few C-level passes (`map`, `min`, `max`, `count`)
per group rather than Python work per entry, and the transports get groups, not one object
per entry. Lists rather than numpy arrays: on small batches a numpy call costs more than the
whole check, and after a large copy has pushed the interpreter out of the CPU caches every
extra call costs several times that; the shm planner turns columns into arrays only where a
batch is large enough to pay for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import add, attrgetter

from crescent.transfer.batch import Op, TransferEntry
from crescent.transfer.descriptor import SegmentDescriptor
from crescent.transfer.segment import Segment

_OP = attrgetter("op")
_LOCAL_SEGMENT = attrgetter("local_segment")
_REMOTE_SEGMENT = attrgetter("remote_segment")
_LOCAL_OFFSET = attrgetter("local_offset")
_REMOTE_OFFSET = attrgetter("remote_offset")
_LENGTH = attrgetter("length")

# (op, local segment name, remote segment name): what the entries of one group share.
GroupKey = tuple[object, str, str]


@dataclass(frozen=True, slots=True)
class Columns:
    """Entries of one batch that share `key`: their indices in the batch and their numbers
    (ints, not yet checked against any segment)."""

    key: GroupKey
    indices: Sequence[int]
    local_offsets: list[int]
    remote_offsets: list[int]
    lengths: list[int]

    def take(self, rows: Sequence[int]) -> Columns:
        """The entries at positions `rows` of this group."""
        return Columns(
            self.key,
            [self.indices[row] for row in rows],
            [self.local_offsets[row] for row in rows],
            [self.remote_offsets[row] for row in rows],
            [self.lengths[row] for row in rows],
        )


@dataclass(frozen=True, slots=True)
class EntryGroup:
    """Checked entries of one batch between one local and one remote segment, one op: every
    range lies inside its segment and every length is positive. `indices` are the entries'
    positions in the batch, which outcomes are reported by."""

    op: Op
    local: Segment
    remote: SegmentDescriptor
    indices: Sequence[int]
    local_offsets: list[int]
    remote_offsets: list[int]
    lengths: list[int]

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def num_bytes(self) -> int:
        return sum(self.lengths)

    def entries(self) -> list[TransferEntry]:
        """The group as entries again, for transports that plan per entry (tcp, rdma)."""
        op, local, remote = self.op, self.local.name, self.remote.name
        return [
            TransferEntry(op, local, local_offset, remote, remote_offset, length)
            for local_offset, remote_offset, length in zip(
                self.local_offsets, self.remote_offsets, self.lengths, strict=True
            )
        ]


def to_columns(entries: Sequence[TransferEntry]) -> list[Columns]:
    """The entries as columns, one per distinct (op, local, remote), in order of first use.

    TypeError if an offset or length is not an int: the caller then checks entry by entry,
    which names the bad one.
    """
    num = len(entries)
    if not num:
        return []
    local_offsets = list(map(_LOCAL_OFFSET, entries))
    remote_offsets = list(map(_REMOTE_OFFSET, entries))
    lengths = list(map(_LENGTH, entries))
    # A sum of ints is an int; one float, numpy scalar or None among them makes it something
    # else or raises (one C-level pass per column).
    for column in (local_offsets, remote_offsets, lengths):
        if type(sum(column)) is not int:
            raise TypeError("offsets and lengths must be ints")
    ops = list(map(_OP, entries))
    locals_ = list(map(_LOCAL_SEGMENT, entries))
    remotes = list(map(_REMOTE_SEGMENT, entries))
    key = (ops[0], locals_[0], remotes[0])
    if ops.count(key[0]) == num and locals_.count(key[1]) == num and remotes.count(key[2]) == num:
        return [Columns(key, range(num), local_offsets, remote_offsets, lengths)]
    by_key: dict[GroupKey, list[int]] = {}
    for index, entry_key in enumerate(zip(ops, locals_, remotes)):
        by_key.setdefault(entry_key, []).append(index)
    whole = Columns(key, range(num), local_offsets, remote_offsets, lengths)
    return [_keyed(whole.take(rows), entry_key) for entry_key, rows in by_key.items()]


def _keyed(columns: Columns, key: GroupKey, indices: Sequence[int] | None = None) -> Columns:
    return Columns(
        key,
        columns.indices if indices is None else indices,
        columns.local_offsets,
        columns.remote_offsets,
        columns.lengths,
    )


def columns_of(entries: Sequence[TransferEntry], indices: Sequence[int]) -> list[Columns]:
    """Columns of `entries[i]` for i in `indices`, entries whose fields `TransferEntry.check`
    accepted (any integral type, made plain ints here)."""
    plain = [
        TransferEntry(
            entry.op,
            entry.local_segment,
            int(entry.local_offset),
            entry.remote_segment,
            int(entry.remote_offset),
            int(entry.length),
        )
        for entry in (entries[i] for i in indices)
    ]
    return [
        _keyed(part, part.key, [indices[i] for i in part.indices]) for part in to_columns(plain)
    ]


def fits(columns: Columns, local_size: int, remote_size: int) -> bool:
    """Whether every entry's range lies inside its segments and every length is positive."""
    lengths = columns.lengths
    return (
        min(lengths) > 0
        and min(columns.local_offsets) >= 0
        and min(columns.remote_offsets) >= 0
        and max(map(add, columns.local_offsets, lengths)) <= local_size
        and max(map(add, columns.remote_offsets, lengths)) <= remote_size
    )


def misfits(columns: Columns, local_size: int, remote_size: int) -> tuple[list[int], list[int]]:
    """(positions of entries with a range outside a segment, positions of zero-length
    entries) within the group."""
    bad, empty = [], []
    for row, (local_offset, remote_offset, length) in enumerate(
        zip(columns.local_offsets, columns.remote_offsets, columns.lengths, strict=True)
    ):
        if (
            length < 0
            or local_offset < 0
            or remote_offset < 0
            or local_offset + length > local_size
            or remote_offset + length > remote_size
        ):
            bad.append(row)
        elif not length:
            empty.append(row)
    return bad, empty
