"""crescent.transfer: moves bytes between registered memory segments (shm, tcp, rdma).

See README.md of the distribution for what this package owns and must not import.
"""

from crescent.transfer.batch import BatchResult, Deadline, Op, TransferEntry
from crescent.transfer.config import TransferConfig, TransportKind, parse_transports
from crescent.transfer.descriptor import (
    RdmaEndpoint,
    SegmentDescriptor,
    ShmEndpoint,
    TcpEndpoint,
    decode_descriptor,
    encode_descriptor,
)
from crescent.transfer.engine import EngineStatus, TransferEngine, TransportCounters
from crescent.transfer.errors import (
    BadEntry,
    EngineNotRunning,
    NoRoute,
    OutOfBounds,
    PeerUnreachable,
    ProtocolError,
    RemoteError,
    ResolverFailed,
    SegmentNotFound,
    TransferError,
    TransferTimeout,
    TransportUnavailable,
)
from crescent.transfer.resolver import DictResolver, Resolver
from crescent.transfer.segment import MemoryKind, Segment, ShmSegment, sweep_orphans

__all__ = [
    "BadEntry",
    "BatchResult",
    "Deadline",
    "DictResolver",
    "EngineNotRunning",
    "EngineStatus",
    "MemoryKind",
    "NoRoute",
    "Op",
    "OutOfBounds",
    "PeerUnreachable",
    "ProtocolError",
    "RdmaEndpoint",
    "RemoteError",
    "Resolver",
    "ResolverFailed",
    "Segment",
    "SegmentDescriptor",
    "SegmentNotFound",
    "ShmEndpoint",
    "ShmSegment",
    "TcpEndpoint",
    "TransferConfig",
    "TransferEngine",
    "TransferEntry",
    "TransferError",
    "TransferTimeout",
    "TransportCounters",
    "TransportKind",
    "TransportUnavailable",
    "decode_descriptor",
    "encode_descriptor",
    "parse_transports",
    "sweep_orphans",
]
