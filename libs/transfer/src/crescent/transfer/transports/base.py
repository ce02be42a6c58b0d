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
from crescent.transfer.registry import SegmentRegistry
from crescent.transfer.segment import Segment


class WorkItem(NamedTuple):
    """One entry after the engine checked it: both ranges are inside their segments. (A
    named tuple: the engine makes one per entry, and a small entry must cost little.)"""

    entry: TransferEntry
    local: Segment
    remote: SegmentDescriptor


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
    cleanup), never raises for an item's failure, and reports per item None (all bytes
    moved) or a TransferError: PeerUnreachable when the owner is dead, TransferTimeout when
    the deadline passed first, SegmentNotFound / OutOfBounds when the owner refused.
    """

    kind: ClassVar[TransportKind]

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
    async def execute(
        self, items: Sequence[WorkItem], deadline: Deadline
    ) -> list[TransferError | None]:
        """Run every item; one outcome per item, in order."""
