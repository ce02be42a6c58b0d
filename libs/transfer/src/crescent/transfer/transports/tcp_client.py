"""The client side of the tcp transport: one connection running groups of slices.

A group is pipelined: every request of the group (with write payloads, straight from
registered memory) leaves in gathering sendmsg calls, then the replies are read in order
(read payloads straight into registered memory with recv_into). Groups are one op only
(see SliceQueue.take), so neither side can block on a full socket buffer while the other
does too.
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
        seqs = []
        for piece in group:
            item = job.items[piece.item]
            endpoint = item.remote.endpoint(TcpEndpoint)
            assert endpoint is not None, "routed to tcp without a tcp endpoint"
            seq = next(self._seqs) & 0xFFFFFFFF
            seqs.append(seq)
            buffers.append(
                encode_request(wire_op, seq, endpoint.segment_id, piece.remote_offset, piece.length)
            )
            if op is Op.WRITE:
                buffers.append(_local_view(job, piece))
        num_done = 0
        try:
            send_buffers(self.sock, buffers, job.deadline)
            for piece, seq in zip(group, seqs, strict=True):
                reply = self._read_reply(seq, job.deadline)
                if reply.status is not Status.OK:
                    message = self._read_message(reply, job.deadline)
                    job.fail(piece.item, self._refusal(job, piece, reply.status, message))
                elif op is Op.READ:
                    if reply.length != piece.length:
                        raise ProtocolError(
                            f"read reply of {reply.length} bytes, asked {piece.length}"
                        )
                    recv_into_exact(self.sock, _local_view(job, piece), job.deadline)
                num_done += 1
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


def _local_view(job: PeerJob, piece: Slice) -> memoryview:
    view = job.items[piece.item].local.view()
    return view[piece.local_offset : piece.local_offset + piece.length]
