"""Errors of the data plane.

Every error raised or reported by crescent.transfer is a `TransferError`. Subclasses carry
the data a caller needs to act (which segment, which peer, which range) as attributes, so
callers branch on types and fields, never on message text.

Recoverable per entry (the caller may retry, perhaps elsewhere): `PeerUnreachable`,
`TransferTimeout`. Caller bugs or stale descriptors (retrying the same entry will not
help): `BadEntry`, `SegmentNotFound`, `OutOfBounds`, `NoRoute`. A broken connection never
reaches callers by itself: its slices are retried on another connection, and only a peer
that stays unreachable fails them.
"""

from __future__ import annotations

import asyncio


class TransferError(Exception):
    """Root of every error of crescent.transfer."""


class BadEntry(TransferError):
    """An entry that can never run: negative length or offset, an empty segment name."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"bad transfer entry: {reason}")
        self.reason = reason


class SegmentNotFound(TransferError):
    """No segment of that name: not registered locally, unknown to the resolver, or gone
    from the peer that served it (`peer` is then set)."""

    def __init__(self, segment: str, peer: str | None = None) -> None:
        where = f" on peer {peer}" if peer else ""
        super().__init__(f"segment {segment!r} not found{where}")
        self.segment = segment
        self.peer = peer


class OutOfBounds(TransferError):
    """A range that does not fit in its segment."""

    def __init__(self, segment: str, offset: int, length: int, size: int | None) -> None:
        of_size = f" of size {size}" if size is not None else ""
        super().__init__(
            f"range [{offset}, {offset + length}) is outside segment {segment!r}{of_size}"
        )
        self.segment = segment
        self.offset = offset
        self.length = length
        self.size = size


class ResolverFailed(TransferError):
    """The resolver raised something other than "not found" (its store is down, say)."""

    def __init__(self, segment: str, cause: str) -> None:
        super().__init__(f"resolving segment {segment!r} failed: {cause}")
        self.segment = segment
        self.cause = cause


class NoRoute(TransferError):
    """None of this engine's transports can reach the segment."""

    def __init__(self, segment: str, tried: tuple[str, ...]) -> None:
        super().__init__(f"no transport reaches segment {segment!r} (tried {', '.join(tried)})")
        self.segment = segment
        self.tried = tried


class PeerUnreachable(TransferError):
    """The peer serving `segment` is dead or refuses connections."""

    def __init__(self, peer: str, segment: str, cause: str) -> None:
        super().__init__(f"peer {peer} serving segment {segment!r} is unreachable: {cause}")
        self.peer = peer
        self.segment = segment
        self.cause = cause


class ProtocolError(TransferError):
    """A peer sent bytes that are not our wire protocol; the connection is dropped."""


class RemoteError(TransferError):
    """The peer refused a slice for a reason without a more precise error class."""

    def __init__(self, peer: str, segment: str, message: str) -> None:
        super().__init__(f"peer {peer} refused a slice of segment {segment!r}: {message}")
        self.peer = peer
        self.segment = segment
        self.message = message


class TransferTimeout(TransferError, asyncio.TimeoutError):
    """The batch deadline passed before this entry finished. Also an `asyncio.TimeoutError`
    so generic timeout handling catches it."""

    def __init__(self, segment: str, timeout: float) -> None:
        super().__init__(f"transfer to segment {segment!r} missed its {timeout:.3f} s deadline")
        self.segment = segment
        self.timeout = timeout


class TransportUnavailable(TransferError):
    """A transport was asked for but cannot run here (no device, library missing)."""

    def __init__(self, transport: str, reason: str) -> None:
        super().__init__(f"transport {transport} unavailable: {reason}")
        self.transport = transport
        self.reason = reason


class EngineNotRunning(TransferError):
    """The engine was used before `start()` or after `close()`."""
