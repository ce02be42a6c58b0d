"""Pure planning: bounds checks, cutting entries into slices, and the queue lanes share.

No I/O here, so every rule about ranges and striping is unit-testable on its own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from crescent.transfer.batch import Op, TransferEntry
from crescent.transfer.errors import OutOfBounds

DEFAULT_SLICE_BYTES = 4 << 20


def check_range(segment: str, offset: int, length: int, size: int) -> None:
    """Raise OutOfBounds unless [offset, offset + length) lies inside [0, size)."""
    if offset < 0 or length < 0 or offset + length > size:
        raise OutOfBounds(segment, offset, length, size)


@dataclass(frozen=True, slots=True)
class Slice:
    """A piece of one entry small enough to be one request on one connection."""

    item: int
    op: Op
    local_offset: int
    remote_offset: int
    length: int


def plan_slices(entries: Sequence[TransferEntry], slice_bytes: int) -> list[Slice]:
    """Cut every entry into slices of at most `slice_bytes`, in entry order.

    `Slice.item` is the entry's index in `entries`. Zero-length entries yield no slice:
    they are complete before anything moves.
    """
    if slice_bytes <= 0:
        raise ValueError(f"slice_bytes must be positive, got {slice_bytes}")
    slices = []
    for item, entry in enumerate(entries):
        for start in range(0, entry.length, slice_bytes):
            length = min(slice_bytes, entry.length - start)
            slices.append(
                Slice(
                    item,
                    entry.op,
                    entry.local_offset + start,
                    entry.remote_offset + start,
                    length,
                )
            )
    return slices


class SliceQueue:
    """Slices of one batch for one peer, shared by that peer's lanes (one per connection).

    A free lane takes the next group from the front, so slices stripe across connections
    in the order lanes become free: a fast connection takes more, a slow one fewer. A lane
    whose connection breaks puts its unfinished slices back at the front, where the next
    free lane, on another connection, picks them up. Thread-safe.
    """

    def __init__(self, slices: Iterable[Slice]) -> None:
        self._slices = deque(slices)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._slices)

    def take(self, max_items: int, max_bytes: int) -> list[Slice]:
        """Up to `max_items` consecutive slices of the same op, at most `max_bytes` in all
        (the first slice is always taken, whatever its size). Empty when nothing is left.

        One op per group keeps a pipelined connection from deadlocking: a group of writes
        gets back only small replies, a group of reads sends only small requests.
        """
        with self._lock:
            if not self._slices:
                return []
            first = self._slices.popleft()
            group = [first]
            num_bytes = first.length
            while (
                self._slices
                and len(group) < max_items
                and self._slices[0].op is first.op
                and num_bytes + self._slices[0].length <= max_bytes
            ):
                piece = self._slices.popleft()
                group.append(piece)
                num_bytes += piece.length
            return group

    def put_back(self, slices: Sequence[Slice]) -> None:
        """Return unfinished slices to the front, keeping their order."""
        with self._lock:
            self._slices.extendleft(reversed(slices))

    def drain(self) -> list[Slice]:
        """Remove and return everything left (to fail it)."""
        with self._lock:
            left = list(self._slices)
            self._slices.clear()
            return left
