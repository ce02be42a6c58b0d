"""The tcp transport's header codec and blocking socket helpers."""

from __future__ import annotations

import socket
import threading

import pytest

from crescent.transfer import Deadline, ProtocolError
from crescent.transfer.transports.tcp_wire import (
    MAX_SLICE_BYTES,
    REPLY,
    REQUEST,
    Reply,
    Request,
    Status,
    WireOp,
    decode_reply,
    decode_request,
    discard,
    encode_reply,
    encode_request,
    recv_into_exact,
    send_buffers,
)


def test_headers_are_small_and_fixed() -> None:
    assert REQUEST.size == 28
    assert REPLY.size == 16


def test_request_round_trips() -> None:
    data = encode_request(WireOp.WRITE, 7, 3, 2**40, 4 << 20)
    assert len(data) == REQUEST.size
    assert decode_request(data) == Request(WireOp.WRITE, 7, 3, 2**40, 4 << 20)


def test_reply_round_trips() -> None:
    data = encode_reply(Status.OUT_OF_BOUNDS, 2**32 - 1, 12)
    assert decode_reply(data) == Reply(Status.OUT_OF_BOUNDS, 2**32 - 1, 12)


@pytest.mark.parametrize(
    "data",
    [
        b"\x00" * REQUEST.size,  # bad magic
        REQUEST.pack(0xC7E5, 9, 1, 0, 0, 0, 0),  # bad version
        REQUEST.pack(0xC7E5, 1, 5, 0, 0, 0, 0),  # unknown op
        REQUEST.pack(0xC7E5, 1, 1, 0, 0, 0, MAX_SLICE_BYTES + 1),  # absurd length
    ],
)
def test_bad_requests_are_protocol_errors(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_request(data)


def test_unknown_status_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        decode_reply(REPLY.pack(0xC7E5, 1, 99, 0, 0))


def test_send_buffers_and_recv_into_exact_move_every_byte() -> None:
    left, right = socket.socketpair()
    payload = bytes(range(256)) * 40_000  # larger than socket buffers: partial sends
    received = bytearray(len(payload) + 3)
    deadline = Deadline.after(10)

    def reader() -> None:
        recv_into_exact(right, memoryview(received), deadline)

    thread = threading.Thread(target=reader)
    thread.start()
    send_buffers(left, [b"ab", b"", memoryview(payload), b"c"], deadline)
    thread.join(10)
    assert bytes(received) == b"ab" + payload + b"c"
    left.close()
    right.close()


def test_recv_into_exact_raises_eof_when_peer_closes() -> None:
    left, right = socket.socketpair()
    left.sendall(b"abc")
    left.close()
    with pytest.raises(EOFError):
        recv_into_exact(right, memoryview(bytearray(10)), Deadline.after(5))
    right.close()


def test_recv_into_exact_honours_the_deadline() -> None:
    left, right = socket.socketpair()
    with pytest.raises(TimeoutError):
        recv_into_exact(right, memoryview(bytearray(10)), Deadline.after(0.05))
    left.close()
    right.close()


def test_discard_reads_and_drops() -> None:
    left, right = socket.socketpair()
    left.sendall(b"x" * 5000 + b"tail")
    discard(right, 5000, memoryview(bytearray(1024)), Deadline.after(5))
    assert right.recv(4) == b"tail"
    left.close()
    right.close()
