"""The serving side of the tcp transport: peers read and write this process's registered
segments through it.

One thread per connection with a blocking socket. A request carries many entries of one
segment: a write's bytes are received straight into the segment, scattered over the
entries' ranges by `recvmsg_into` (many ranges per system call), and a read's are sent
straight from it with gathering `sendmsg`. A refused request (unknown segment, a range out of
bounds) gets an error reply, having had any payload read and dropped, and the connection
keeps serving; only a broken stream (bad magic, a table that does not add up, a peer that
stalls mid-payload) closes it.
"""

from __future__ import annotations

import logging
import socket
import threading
from operator import add

from crescent.transfer.batch import Deadline
from crescent.transfer.errors import ProtocolError
from crescent.transfer.registry import SegmentRegistry
from crescent.transfer.segment import MemoryKind
from crescent.transfer.transports.tcp_wire import (
    ENTRY,
    REQUEST,
    Request,
    Status,
    WireOp,
    decode_request,
    decode_table,
    discard,
    encode_reply,
    recv_into_buffers,
    recv_into_exact,
    send_buffers,
)

log = logging.getLogger(__name__)

# How often idle threads look up from their blocking accept / recv to see if we stop.
POLL_S = 0.5
SOCKET_BUFFER_BYTES = 4 << 20


def tune_socket(sock: socket.socket) -> None:
    """Small requests must not wait for Nagle; big buffers keep a 4 MiB slice in flight."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)


class TcpServer:
    """Accepts connections on (host, port) and serves `registry`'s segments on them."""

    def __init__(
        self,
        registry: SegmentRegistry,
        host: str,
        port: int,
        io_timeout: float,
        idle_timeout: float,
    ) -> None:
        self._registry = registry
        self._io_timeout = io_timeout
        self._idle_timeout = idle_timeout
        self._listener = socket.create_server((host, port), backlog=128)
        self._listener.settimeout(POLL_S)
        self.host, self.port = self._listener.getsockname()[:2]
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self.num_served_bytes = 0  # payload bytes of accepted reads and writes (under _lock)
        self.num_served_requests = 0  # accepted requests, each of one or more entries
        self._acceptor = threading.Thread(
            target=self._accept_loop, name=f"crescent-tcp-accept-{self.port}", daemon=True
        )

    def start(self) -> None:
        self._acceptor.start()

    def close(self, timeout: float) -> None:
        """Stop accepting, drop every connection, and wait up to `timeout` for threads."""
        deadline = Deadline.after(timeout)
        self._stopping.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._acceptor.join(deadline.remaining())
        self._listener.close()
        with self._lock:
            connections = dict(self._connections)
        for sock in connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in connections.values():
            thread.join(deadline.remaining())

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stopping.is_set():
                    return
                log.exception("accept failed on port %d", self.port)
                continue
            tune_socket(sock)
            thread = threading.Thread(
                target=self._serve,
                args=(sock, f"{address[0]}:{address[1]}"),
                name=f"crescent-tcp-serve-{address[1]}",
                daemon=True,
            )
            with self._lock:
                self._connections[sock] = thread
            thread.start()

    def _serve(self, sock: socket.socket, peer: str) -> None:
        header = memoryview(bytearray(REQUEST.size))
        scratch = memoryview(bytearray(1 << 20))
        try:
            while not self._stopping.is_set():
                if not self._wait_for_request(sock, header):
                    return
                self._handle(sock, decode_request(header), scratch)
        except (EOFError, ConnectionError):
            log.debug("peer %s closed its connection", peer)
        except (OSError, ProtocolError) as exc:
            if not self._stopping.is_set():
                log.warning("dropping connection from %s: %r", peer, exc)
        finally:
            with self._lock:
                self._connections.pop(sock, None)
            sock.close()

    def _wait_for_request(self, sock: socket.socket, header: memoryview) -> bool:
        """Read the next request header; False once stopping or idle for too long.

        The first byte is awaited in short polls (so close() is noticed); the rest of the
        header must follow within the io timeout.
        """
        idle = Deadline.after(self._idle_timeout)
        while True:
            if self._stopping.is_set() or idle.is_expired():
                return False
            sock.settimeout(POLL_S)
            try:
                num = sock.recv_into(header[:1])
            except TimeoutError:
                continue
            if num == 0:
                raise EOFError("peer closed the connection")
            recv_into_exact(sock, header[1:], Deadline.after(self._io_timeout))
            return True

    def _handle(self, sock: socket.socket, request: Request, scratch: memoryview) -> None:
        deadline = Deadline.after(self._io_timeout)
        table = memoryview(bytearray(ENTRY.size * request.num_entries))
        recv_into_exact(sock, table, deadline)
        offsets, lengths = decode_table(table, request)
        status, message, targets = self._locate(request, offsets, lengths)
        if request.op is WireOp.WRITE:
            if targets is None:
                discard(sock, request.num_bytes, scratch, deadline)
            else:
                recv_into_buffers(sock, targets, deadline)
        if targets is None:
            payload = message.encode()
            send_buffers(sock, [encode_reply(status, request.seq, len(payload)), payload], deadline)
            return
        with self._lock:  # counted before the reply, so a client that has it sees the count
            self.num_served_bytes += request.num_bytes
            self.num_served_requests += 1
        if request.op is WireOp.WRITE:
            send_buffers(sock, [encode_reply(Status.OK, request.seq, 0)], deadline)
        else:
            reply = encode_reply(Status.OK, request.seq, request.num_bytes)
            send_buffers(sock, [reply, *targets], deadline)

    def _locate(
        self, request: Request, offsets: list[int], lengths: list[int]
    ) -> tuple[Status, str, list[memoryview] | None]:
        """The segment memory of each entry of a request (ranges that follow each other
        merged), or why the request is refused."""
        segment = self._registry.by_id(request.segment_id)
        if segment is None or segment.memory_kind is not MemoryKind.HOST:
            return Status.UNKNOWN_SEGMENT, f"no segment with id {request.segment_id}", None
        end = max(map(add, offsets, lengths))
        if end > segment.size:
            return (
                Status.OUT_OF_BOUNDS,
                f"a range ends at {end}, outside segment of size {segment.size}",
                None,
            )
        try:
            view = segment.view()
        except ValueError:
            return Status.UNKNOWN_SEGMENT, f"segment {segment.name!r} is closed", None
        return Status.OK, "", _ranges(view, offsets, lengths)


def _ranges(view: memoryview, offsets: list[int], lengths: list[int]) -> list[memoryview]:
    """Views of the ranges, back-to-back ones as one view (fewer buffers per system call)."""
    ranges = []
    start, end = offsets[0], offsets[0] + lengths[0]
    for offset, length in zip(offsets[1:], lengths[1:], strict=True):
        if offset == end:
            end += length
        else:
            ranges.append(view[start:end])
            start, end = offset, offset + length
    ranges.append(view[start:end])
    return ranges
