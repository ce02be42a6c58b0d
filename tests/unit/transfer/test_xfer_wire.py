"""The tcp transport's header codec and blocking socket helpers."""

from __future__ import annotations

import socket
import threading

import pytest

from crescent.transfer import Deadline, ProtocolError
from crescent.transfer.transports.tcp_wire import (
    ENTRY,
    MAX_ENTRIES,
    MAX_SLICE_BYTES,
    REPLY,
    REQUEST,
    Reply,
    Request,
    Status,
    WireOp,
    decode_reply,
    decode_request,
    decode_table,
    discard,
    encode_reply,
    encode_request,
    recv_into_buffers,
    recv_into_exact,
    send_buffers,
)


def test_headers_are_small_and_fixed() -> None:
    assert REQUEST.size == 28
    assert REPLY.size == 16


def test_request_round_trips_with_its_table() -> None:
    offsets, lengths = [2**40, 0, 4096], [4 << 20, 1, 65536]
    data = encode_request(WireOp.WRITE, 7, 3, offsets, lengths)
    assert len(data) == REQUEST.size + 3 * ENTRY.size
    request = decode_request(data[: REQUEST.size])
    assert request == Request(WireOp.WRITE, 7, 3, 3, sum(lengths))
    assert decode_table(data[REQUEST.size :], request) == (offsets, lengths)


def test_a_table_that_does_not_add_up_is_a_protocol_error() -> None:
    data = encode_request(WireOp.READ, 1, 1, [0, 10], [10, 10])
    request = decode_request(data[: REQUEST.size])
    forged = Request(request.op, request.seq, request.segment_id, 2, 21)
    with pytest.raises(ProtocolError):
        decode_table(data[REQUEST.size :], forged)


def test_reply_round_trips() -> None:
    data = encode_reply(Status.OUT_OF_BOUNDS, 2**32 - 1, 12)
    assert decode_reply(data) == Reply(Status.OUT_OF_BOUNDS, 2**32 - 1, 12)


@pytest.mark.parametrize(
    "data",
    [
        b"\x00" * REQUEST.size,  # bad magic
        REQUEST.pack(0xC7E5, 9, 1, 0, 0, 1, 0, 0),  # bad version
        REQUEST.pack(0xC7E5, 2, 5, 0, 0, 1, 0, 0),  # unknown op
        REQUEST.pack(0xC7E5, 2, 1, 0, 0, 0, 0, 0),  # no entries
        REQUEST.pack(0xC7E5, 2, 1, 0, 0, MAX_ENTRIES + 1, 0, 0),  # absurd number of entries
        REQUEST.pack(0xC7E5, 2, 1, 0, 0, 1, 0, MAX_SLICE_BYTES + 1),  # absurd length
    ],
)
def test_bad_requests_are_protocol_errors(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_request(data)


def test_unknown_status_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        decode_reply(REPLY.pack(0xC7E5, 2, 99, 0, 0))


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


def test_recv_into_buffers_scatters_a_stream_over_many_views() -> None:
    left, right = socket.socketpair()
    payload = bytes(range(256)) * 40  # 10,240 bytes
    memory = bytearray(12_000)
    view = memoryview(memory)
    # 1,100 views (more than one recvmsg call takes), of 9 or 10 bytes, with gaps between
    views, position, cuts = [], 0, []
    while sum(cuts) < len(payload):
        size = min(9 + len(cuts) % 2, len(payload) - sum(cuts))
        views.append(view[position : position + size])
        cuts.append(size)
        position += size + (1 if len(cuts) % 3 == 0 else 0)
    sender = threading.Thread(target=left.sendall, args=(payload,))
    sender.start()
    recv_into_buffers(right, views, Deadline.after(5))
    sender.join()
    assert len(views) > 1024
    assert b"".join(bytes(v) for v in views) == payload
    left.close()
    right.close()
