"""Transports behind one small ABC (base.Transport), one module per transport."""

from __future__ import annotations

from crescent.transfer.config import TransportKind
from crescent.transfer.errors import TransportUnavailable
from crescent.transfer.transports.base import Transport, TransportContext, WorkItem
from crescent.transfer.transports.rdma import RdmaTransport, unavailable_reason
from crescent.transfer.transports.shm import ShmTransport
from crescent.transfer.transports.tcp import TcpTransport


def create_transport(kind: TransportKind, context: TransportContext) -> Transport:
    match kind:
        case TransportKind.SHM:
            return ShmTransport(context)
        case TransportKind.TCP:
            return TcpTransport(context)
        case TransportKind.RDMA:
            return RdmaTransport(context)
    raise ValueError(f"unknown transport {kind!r}")


def is_available(kind: TransportKind, rdma_device: str | None = None) -> bool:
    """Whether a transport can run on this machine (only rdma needs hardware)."""
    return kind is not TransportKind.RDMA or unavailable_reason(rdma_device) is None


def check_transports(
    kinds: tuple[TransportKind, ...] | None, rdma_device: str | None = None
) -> None:
    """TransportUnavailable, with the reason, for the first of `kinds` that cannot run here,
    so a service asked for a transport fails at start instead of falling back to another."""
    for kind in kinds or ():
        if kind is TransportKind.RDMA:
            reason = unavailable_reason(rdma_device)
            if reason is not None:
                raise TransportUnavailable(kind.value, reason)


__all__ = [
    "RdmaTransport",
    "ShmTransport",
    "TcpTransport",
    "Transport",
    "TransportContext",
    "WorkItem",
    "check_transports",
    "create_transport",
    "is_available",
]
