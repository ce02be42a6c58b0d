"""The tcp transport's wire format and blocking socket helpers.

Each slice is one request with a fixed 28-byte header (struct, not msgpack: it is on the
hot path) followed, for a write, by the payload. Each request gets one reply with a fixed
16-byte header followed by the payload of a read, or by a UTF-8 message for an error.
Replies come in request order on a connection, so a client may pipeline requests.

    request  <HBBIIQQ  magic, version, op, seq, segment_id, offset, length
    reply    <HBBIQ    magic, version, status, seq, length (payload or message bytes)
"""

from __future__ import annotations

import enum
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from crescent.transfer.batch import Deadline
from crescent.transfer.errors import ProtocolError

MAGIC = 0xC7E5
VERSION = 1
REQUEST = struct.Struct("<HBBIIQQ")
REPLY = struct.Struct("<HBBIQ")
MAX_SLICE_BYTES = 1 << 30
MAX_MESSAGE_BYTES = 4096
IOV_MAX = 1024


class WireOp(enum.IntEnum):
    READ = 1
    WRITE = 2


class Status(enum.IntEnum):
    OK = 0
    UNKNOWN_SEGMENT = 1
    OUT_OF_BOUNDS = 2
    BAD_REQUEST = 3


@dataclass(frozen=True, slots=True)
class Request:
    op: WireOp
    seq: int
    segment_id: int
    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Reply:
    status: Status
    seq: int
    length: int


def encode_request(op: WireOp, seq: int, segment_id: int, offset: int, length: int) -> bytes:
    return REQUEST.pack(MAGIC, VERSION, op, seq, segment_id, offset, length)


def decode_request(data: bytes | bytearray | memoryview) -> Request:
    magic, version, op, seq, segment_id, offset, length = REQUEST.unpack(data)
    _check_magic(magic, version)
    if op not in (WireOp.READ, WireOp.WRITE):
        raise ProtocolError(f"unknown op {op}")
    if length > MAX_SLICE_BYTES:
        raise ProtocolError(f"slice of {length} bytes exceeds {MAX_SLICE_BYTES}")
    return Request(WireOp(op), seq, segment_id, offset, length)


def encode_reply(status: Status, seq: int, length: int) -> bytes:
    return REPLY.pack(MAGIC, VERSION, status, seq, length)


def decode_reply(data: bytes | bytearray | memoryview) -> Reply:
    magic, version, status, seq, length = REPLY.unpack(data)
    _check_magic(magic, version)
    try:
        return Reply(Status(status), seq, length)
    except ValueError:
        raise ProtocolError(f"unknown status {status}") from None


def _check_magic(magic: int, version: int) -> None:
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic:#06x}")
    if version != VERSION:
        raise ProtocolError(f"unsupported wire version {version}")


def _arm(sock: socket.socket, deadline: Deadline) -> None:
    remaining = deadline.remaining()
    if remaining <= 0:
        raise TimeoutError("deadline passed")
    sock.settimeout(remaining)


def recv_into_exact(sock: socket.socket, view: memoryview, deadline: Deadline) -> None:
    """Fill `view` from the socket; EOFError if the peer closes first."""
    while view.nbytes:
        _arm(sock, deadline)
        num = sock.recv_into(view)
        if num == 0:
            raise EOFError("peer closed the connection")
        view = view[num:]


def recv_exact(sock: socket.socket, num_bytes: int, deadline: Deadline) -> bytes:
    buffer = bytearray(num_bytes)
    recv_into_exact(sock, memoryview(buffer), deadline)
    return bytes(buffer)


def discard(sock: socket.socket, num_bytes: int, scratch: memoryview, deadline: Deadline) -> None:
    """Read and drop a payload we refused, to stay in step with the stream."""
    while num_bytes:
        chunk = scratch[: min(num_bytes, scratch.nbytes)]
        recv_into_exact(sock, chunk, deadline)
        num_bytes -= chunk.nbytes


def send_buffers(
    sock: socket.socket,
    buffers: Sequence[bytes | memoryview],
    deadline: Deadline,
) -> None:
    """Send all buffers in order with gathering sendmsg: headers and payloads leave in
    the same syscalls, straight from registered memory (no joined copy)."""
    views = [memoryview(buffer) for buffer in buffers if len(buffer)]
    index = 0
    while index < len(views):
        _arm(sock, deadline)
        sent = sock.sendmsg(views[index : index + IOV_MAX])
        while sent:
            size = views[index].nbytes
            if sent >= size:
                sent -= size
                index += 1
            else:
                views[index] = views[index][sent:]
                sent = 0
