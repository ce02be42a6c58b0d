"""What a peer needs to know to reach a segment: the `SegmentDescriptor`.

A process registers a segment with its `TransferEngine` and gets a descriptor; someone
else (the store service) publishes it, e.g. in etcd, and peers resolve segment names back
to descriptors. The descriptor lists one endpoint per transport that can serve the segment,
so the reading side picks the best transport it shares with the owner.

Descriptors are msgspec Structs: they encode to MessagePack and reject malformed input on
decode with a clear error.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

DESCRIPTOR_VERSION = 1


class ShmEndpoint(msgspec.Struct, frozen=True, tag="shm"):
    """A POSIX shared-memory file under /dev/shm. `device` and `inode` identify the very
    file, so a same-named file in another mount namespace is never mistaken for it.
    The owner holds a shared flock on the file while it is alive."""

    shm_name: str
    device: int
    inode: int


class TcpEndpoint(msgspec.Struct, frozen=True, tag="tcp"):
    """The owner's tcp data server; `segment_id` names the segment on the wire."""

    host: str
    port: int
    segment_id: int


class RdmaEndpoint(msgspec.Struct, frozen=True, tag="rdma"):
    """Memory region of the owner's RDMA device plus where to exchange queue-pair numbers.

    One-sided verbs need the remote address and rkey; an RC queue pair also needs the
    owner's address (lid for InfiniBand, gid for RoCE) and a fresh QP on the owner side,
    which the client asks for at `handshake_host:handshake_port`.
    """

    device: str
    port_num: int
    lid: int
    gid: str
    gid_index: int
    addr: int
    rkey: int
    handshake_host: str
    handshake_port: int


Endpoint = ShmEndpoint | TcpEndpoint | RdmaEndpoint
E = TypeVar("E", ShmEndpoint, TcpEndpoint, RdmaEndpoint)


class SegmentDescriptor(msgspec.Struct, frozen=True):
    """A registered segment as its peers see it.

    `host_id` is the owner's kernel boot id: equal boot ids mean one kernel, which is the
    first condition for the shm transport. `size` bounds every remote offset.
    """

    name: str
    node: str
    host_id: str
    size: int
    endpoints: tuple[Endpoint, ...] = ()
    v: int = DESCRIPTOR_VERSION

    def endpoint(self, kind: type[E]) -> E | None:
        """The endpoint of one transport, or None when the owner does not offer it."""
        for endpoint in self.endpoints:
            if isinstance(endpoint, kind):
                return endpoint
        return None


def encode_descriptor(descriptor: SegmentDescriptor) -> bytes:
    """MessagePack bytes, as published in etcd."""
    return msgspec.msgpack.encode(descriptor)


def decode_descriptor(data: bytes) -> SegmentDescriptor:
    """Parse and validate; raises msgspec.ValidationError / DecodeError on bad input."""
    descriptor = msgspec.msgpack.decode(data, type=SegmentDescriptor)
    if descriptor.v != DESCRIPTOR_VERSION:
        raise msgspec.ValidationError(f"unsupported descriptor version {descriptor.v}")
    return descriptor
