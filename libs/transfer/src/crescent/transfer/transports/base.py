"""The contract every transport follows, and what the engine hands it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

from crescent.transfer.batch import Deadline, TransferEntry
from crescent.transfer.config import TransferConfig, TransportKind
from crescent.transfer.descriptor import Endpoint, SegmentDescriptor
from crescent.transfer.errors import TransferError
from crescent.transfer.groups import EntryGroup
from crescent.transfer.registry import SegmentRegistry
from crescent.transfer.segment import Segment


class WorkItem(NamedTuple):
    """One checked entry with its segments, for transports that plan entry by entry (the
    lanes of tcp and rdma); see `work_items`."""

    entry: TransferEntry
    local: Segment
    remote: SegmentDescriptor


# Batch index → error, for the entries that failed; every other entry moved all its bytes.
Failures = dict[int, TransferError]


def work_items(groups: Sequence[EntryGroup]) -> tuple[list[WorkItem], list[int]]:
    """The groups' entries as work items, and each one's index in the batch."""
    items: list[WorkItem] = []
    indices: list[int] = []
    for group in groups:
        local, remote = group.local, group.remote
        items.extend(WorkItem(entry, local, remote) for entry in group.entries())
        indices.extend(group.indices)
    return items, indices


def failures_of(indices: Sequence[int], outcomes: Sequence[TransferError | None]) -> Failures:
    """Per-item outcomes (as lanes report them) as Failures of the batch."""
    return {
        index: outcome
        for index, outcome in zip(indices, outcomes, strict=True)
        if outcome is not None
    }


@dataclass(frozen=True, slots=True)
class TransportContext:
    """What every transport shares with its engine."""

    config: TransferConfig
    registry: SegmentRegistry
    executor: ThreadPoolExecutor
    host_id: str


class Transport(ABC):
    """Moves bytes for work items whose remote segments it can reach.

    Server side: `expose` says how peers reach a newly registered segment (the endpoint
    goes into its descriptor). Client side: `can_reach` tells whether this transport can
    serve a descriptor, and `execute` runs items and reports one outcome per item.

    Contract for `execute`: it returns by the deadline (plus a few milliseconds of
    cleanup), never raises for an entry's failure, and reports the entries that failed, by
    batch index, with a TransferError: PeerUnreachable when the owner is dead,
    TransferTimeout when the deadline passed first, SegmentNotFound / OutOfBounds when the
    owner refused. Entries it does not report moved all their bytes.
    """

    kind: ClassVar[TransportKind]
    # Whether local memory registered only with the engine's registry (a caller's buffers,
    # crescent.transfer.buffers) can be moved; rdma needs memory registered with its device.
    moves_unregistered_memory: ClassVar[bool] = True

    def __init__(self, context: TransportContext) -> None:
        self.context = context

    async def start(self) -> None:
        """Open listeners or devices. Called once before any other method."""

    async def close(self) -> None:
        """Release everything `start` and `execute` opened. Idempotent."""

    @abstractmethod
    def expose(self, segment: Segment, segment_id: int) -> Endpoint | None:
        """Make a newly registered segment reachable; None if this transport cannot."""

    def withdraw(self, segment: Segment) -> None:
        """Stop serving a segment that is being unregistered."""

    @property
    def num_served_bytes(self) -> int:
        """Bytes this transport's server moved for peers (0 where the owner never sees them)."""
        return 0

    @abstractmethod
    def can_reach(self, descriptor: SegmentDescriptor) -> bool:
        """Whether `execute` can move bytes to and from this remote segment."""

    @abstractmethod
    async def execute(self, groups: Sequence[EntryGroup], deadline: Deadline) -> Failures:
        """Move every entry of the groups (checked by the engine); the failed ones by index."""
