"""The client side of the tcp transport: one connection running groups of slices.

A group is one request per remote segment it touches (usually one): a header, the table of
its slices' ranges and, for a write, their bytes straight from registered memory, all in
gathering sendmsg calls; then the replies are read in order (a read's bytes scattered
straight into registered memory by recvmsg_into). Groups are one op only (see
SliceQueue.take), so neither side can block on a full socket buffer while the other does too.
"""

from __future__ import annotations

import itertools
import socket

from crescent.transfer.batch import Deadline, Op
from crescent.transfer.descriptor import TcpEndpoint
from crescent.transfer.errors import (
    OutOfBounds,
    ProtocolError,
    RemoteError,
    SegmentNotFound,
    TransferError,
)
from crescent.transfer.plan import Slice
from crescent.transfer.transports.lanes import Broken, PeerJob
from crescent.transfer.transports.tcp_server import tune_socket
from crescent.transfer.transports.tcp_wire import (
    MAX_MESSAGE_BYTES,
    REPLY,
    Reply,
    Status,
    WireOp,
    decode_reply,
    encode_request,
    recv_exact,
    recv_into_buffers,
    recv_into_exact,
    send_buffers,
)

_WIRE_OPS = {Op.READ: WireOp.READ, Op.WRITE: WireOp.WRITE}


class TcpConnection:
    """One socket to a peer's TcpServer, used by one lane at a time."""

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self._seqs = itertools.count(1)
        self._reply = memoryview(bytearray(REPLY.size))

    @classmethod
    def connect(
        cls, host: str, port: int, peer: str, deadline: Deadline, connect_timeout: float
    ) -> TcpConnection:
        timeout = min(connect_timeout, deadline.remaining())
        if timeout <= 0:
            raise TimeoutError("deadline passed before connecting")
        sock = socket.create_connection((host, port), timeout=timeout)
        tune_socket(sock)
        return cls(sock, peer)

    def run_group(self, job: PeerJob, group: list[Slice]) -> None:
        op = group[0].op
        wire_op = _WIRE_OPS[op]
        buffers: list[bytes | memoryview] = []
        requests: list[tuple[int, list[Slice]]] = []
        for pieces in _by_segment(job, group):
            seq = next(self._seqs) & 0xFFFFFFFF
            requests.append((seq, pieces))
            endpoint = job.items[pieces[0].item].remote.endpoint(TcpEndpoint)
            assert endpoint is not None, "routed to tcp without a tcp endpoint"
            offsets = [piece.remote_offset for piece in pieces]
            lengths = [piece.length for piece in pieces]
            buffers.append(encode_request(wire_op, seq, endpoint.segment_id, offsets, lengths))
            if op is Op.WRITE:
                buffers.extend(_local_views(job, pieces))
        num_done = 0
        try:
            send_buffers(self.sock, buffers, job.deadline)
            for seq, pieces in requests:
                reply = self._read_reply(seq, job.deadline)
                if reply.status is not Status.OK:
                    message = self._read_message(reply, job.deadline)
                    for piece in pieces:
                        job.fail(piece.item, self._refusal(job, piece, reply.status, message))
                elif op is Op.READ:
                    num_bytes = sum(piece.length for piece in pieces)
                    if reply.length != num_bytes:
                        raise ProtocolError(
                            f"read reply of {reply.length} bytes, asked {num_bytes}"
                        )
                    recv_into_buffers(self.sock, _local_views(job, pieces), job.deadline)
                num_done += len(pieces)
        except (OSError, EOFError, ProtocolError) as exc:
            raise Broken(num_done, exc) from exc

    def _read_reply(self, seq: int, deadline: Deadline) -> Reply:
        recv_into_exact(self.sock, self._reply, deadline)
        reply = decode_reply(self._reply)
        if reply.seq != seq:
            raise ProtocolError(f"reply for request {reply.seq}, expected {seq}")
        return reply

    def _read_message(self, reply: Reply, deadline: Deadline) -> str:
        if reply.length > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"error message of {reply.length} bytes")
        return recv_exact(self.sock, reply.length, deadline).decode(errors="replace")

    def _refusal(self, job: PeerJob, piece: Slice, status: Status, message: str) -> TransferError:
        segment = job.items[piece.item].remote
        if status is Status.UNKNOWN_SEGMENT:
            return SegmentNotFound(segment.name, self.peer)
        if status is Status.OUT_OF_BOUNDS:
            return OutOfBounds(segment.name, piece.remote_offset, piece.length, segment.size)
        return RemoteError(self.peer, segment.name, message)

    def abort(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


def _by_segment(job: PeerJob, group: list[Slice]) -> list[list[Slice]]:
    """The group cut where the remote segment changes: one request per piece."""
    parts: list[list[Slice]] = []
    segment = None
    for piece in group:
        remote = job.items[piece.item].remote
        if remote is not segment:
            parts.append([])
            segment = remote
        parts[-1].append(piece)
    return parts


def _local_views(job: PeerJob, pieces: list[Slice]) -> list[memoryview]:
    """The local memory of the pieces, in order, pieces that lie back to back in one segment
    as one view: blocks cut from one array go out (or come in) as one buffer of the
    gathering (scattering) system call instead of one each, which costs the kernel and
    Python per buffer per call."""
    views: list[memoryview] = []
    segment, start, end = None, 0, 0
    for piece in pieces:
        local = job.items[piece.item].local
        if local is segment and piece.local_offset == end:
            end += piece.length
            continue
        if segment is not None:
            views.append(segment.view()[start:end])
        segment, start, end = local, piece.local_offset, piece.local_offset + piece.length
    if segment is not None:
        views.append(segment.view()[start:end])
    return views
