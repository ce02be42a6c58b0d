"""The tcp transport's wire format and blocking socket helpers.

A request moves many entries of one segment, one op: a fixed 28-byte header (struct, not
msgpack: it is on the hot path), a table of (offset, length) pairs, and for a write the
entries' bytes back to back. One reply answers it: a fixed 16-byte header followed by the
entries' bytes of a read, or by a UTF-8 message for a refusal (which refuses the whole
request). Replies come in request order on a connection, so a client may pipeline requests.
One request per group of entries rather than per entry: small entries would otherwise cost
a header, a reply and several system calls each on both sides.

    request  <HBBIIII  magic, version, op, seq, segment_id, num_entries, (reserved) 0
             <Q        num_bytes (sum of the lengths)
             num_entries × <QQ  offset, length
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
VERSION = 2
REQUEST = struct.Struct("<HBBIIIIQ")
ENTRY = struct.Struct("<QQ")
REPLY = struct.Struct("<HBBIQ")
MAX_SLICE_BYTES = 1 << 30  # bytes of one request
MAX_ENTRIES = 4096  # entries of one request
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
    """A request's header; its table of `num_entries` (offset, length) pairs follows."""

    op: WireOp
    seq: int
    segment_id: int
    num_entries: int
    num_bytes: int


@dataclass(frozen=True, slots=True)
class Reply:
    status: Status
    seq: int
    length: int


def encode_request(
    op: WireOp, seq: int, segment_id: int, offsets: Sequence[int], lengths: Sequence[int]
) -> bytes:
    """Header and table of one request (a write's payload is sent after it, from memory)."""
    num = len(offsets)
    header = REQUEST.pack(MAGIC, VERSION, op, seq, segment_id, num, 0, sum(lengths))
    table = [0] * (2 * num)
    table[0::2] = offsets
    table[1::2] = lengths
    return header + struct.pack(f"<{2 * num}Q", *table)


def decode_request(data: bytes | bytearray | memoryview) -> Request:
    magic, version, op, seq, segment_id, num_entries, _, num_bytes = REQUEST.unpack(data)
    _check_magic(magic, version)
    if op not in (WireOp.READ, WireOp.WRITE):
        raise ProtocolError(f"unknown op {op}")
    if not 0 < num_entries <= MAX_ENTRIES:
        raise ProtocolError(f"request of {num_entries} entries (1 to {MAX_ENTRIES})")
    if num_bytes > MAX_SLICE_BYTES:
        raise ProtocolError(f"request of {num_bytes} bytes exceeds {MAX_SLICE_BYTES}")
    return Request(WireOp(op), seq, segment_id, num_entries, num_bytes)


def decode_table(
    data: bytes | bytearray | memoryview, request: Request
) -> tuple[list[int], list[int]]:
    """(offsets, lengths) of a request's table; ProtocolError unless the lengths add up to
    the header's byte count (the stream could not be followed otherwise)."""
    if len(data) != ENTRY.size * request.num_entries:
        raise ProtocolError("a request's table does not match its header")
    numbers = struct.unpack(f"<{2 * request.num_entries}Q", data)
    offsets, lengths = list(numbers[0::2]), list(numbers[1::2])
    if sum(lengths) != request.num_bytes:
        raise ProtocolError("a request's table does not match its header")
    return offsets, lengths


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


def recv_into_buffers(sock: socket.socket, views: list[memoryview], deadline: Deadline) -> None:
    """Fill every view in order with scattering recvmsg_into: a group's entries land straight
    in their memory, several per system call; EOFError if the peer closes first."""
    views = [view for view in views if view.nbytes]
    index = 0
    while index < len(views):
        _arm(sock, deadline)
        received = sock.recvmsg_into(views[index : index + IOV_MAX])[0]
        if received == 0:
            raise EOFError("peer closed the connection")
        index = _advance(views, index, received)


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
        index = _advance(views, index, sock.sendmsg(views[index : index + IOV_MAX]))


def _advance(views: list[memoryview], index: int, num_bytes: int) -> int:
    """Past `num_bytes` moved from views[index:]: the index of the first view not yet done,
    that view cut to its remaining part."""
    while num_bytes:
        size = views[index].nbytes
        if num_bytes < size:
            views[index] = views[index][num_bytes:]
            break
        num_bytes -= size
        index += 1
    return index
