"""pyverbs plumbing for the rdma transport: the device, RC queue pairs, and the small tcp
handshake that pairs a client's QP with a fresh QP on the owner's side.

pyverbs is imported inside functions only, so this module loads on machines without it.
"""

from __future__ import annotations

import logging
import random
import socket
import struct
import threading
from typing import Any

import msgspec

from crescent.transfer.batch import Deadline
from crescent.transfer.errors import ProtocolError
from crescent.transfer.segment import Segment

log = logging.getLogger(__name__)

QUEUE_DEPTH = 128
MAX_RD_ATOMIC = 16
POLL_S = 0.5
_LENGTH = struct.Struct("<I")


def unavailable_reason(device: str | None = None) -> str | None:
    """Why the rdma transport cannot run here, or None if it can."""
    try:
        import pyverbs.device
    except ImportError:
        return "pyverbs not installed"
    try:
        names = [dev.name.decode() for dev in pyverbs.device.get_device_list()]
    except Exception as exc:  # pyverbs raises its own error types for driver trouble
        return f"cannot list RDMA devices: {exc}"
    if not names:
        return "no RDMA device"
    if device is not None and device not in names:
        return f"no RDMA device named {device} (have {', '.join(names)})"
    return None


class QpInfo(msgspec.Struct, frozen=True):
    """What each side of an RC queue pair must know of the other."""

    qp_num: int
    psn: int
    lid: int
    gid: str


class RdmaDevice:
    """An opened RDMA device: context, protection domain, and the port we use."""

    def __init__(self, name: str | None, port_num: int, gid_index: int) -> None:
        import pyverbs.device
        import pyverbs.pd

        if name is None:
            name = pyverbs.device.get_device_list()[0].name.decode()
        self.name = name
        self.port_num = port_num
        self.gid_index = gid_index
        self.ctx = pyverbs.device.Context(name=name)
        self.pd = pyverbs.pd.PD(self.ctx)
        self.port_attr = self.ctx.query_port(port_num)
        self.gid = str(self.ctx.query_gid(port_num, gid_index))

    def register(self, segment: Segment) -> Any:
        import pyverbs.enums as e
        import pyverbs.mr

        access = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        return pyverbs.mr.MR(self.pd, segment.size, access, address=segment.address)

    def new_qp(self) -> tuple[Any, Any, int]:
        """A fresh RC queue pair in INIT state, its completion queue, and its PSN."""
        import pyverbs.cq
        import pyverbs.enums as e
        import pyverbs.qp

        cq = pyverbs.cq.CQ(self.ctx, QUEUE_DEPTH, None, None, 0)
        cap = pyverbs.qp.QPCap(
            max_send_wr=QUEUE_DEPTH, max_recv_wr=1, max_send_sge=1, max_recv_sge=1
        )
        init = pyverbs.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)
        attr = pyverbs.qp.QPAttr(port_num=self.port_num)
        attr.qp_access_flags = (
            e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
        )
        qp = pyverbs.qp.QP(self.pd, init, attr)
        return qp, cq, random.getrandbits(24)

    def info(self, qp: Any, psn: int) -> QpInfo:
        return QpInfo(qp.qp_num, psn, self.port_attr.lid, self.gid)

    def connect_qp(self, qp: Any, psn: int, remote: QpInfo) -> None:
        """Move the QP to ready-to-send toward the remote QP."""
        import pyverbs.addr
        import pyverbs.qp

        attr = pyverbs.qp.QPAttr(port_num=self.port_num)
        attr.path_mtu = self.port_attr.active_mtu
        attr.dest_qp_num = remote.qp_num
        attr.rq_psn = remote.psn
        attr.sq_psn = psn
        attr.max_dest_rd_atomic = MAX_RD_ATOMIC
        attr.max_rd_atomic = MAX_RD_ATOMIC
        attr.min_rnr_timer = 12
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        route = pyverbs.addr.GlobalRoute(
            dgid=pyverbs.addr.GID(remote.gid), sgid_index=self.gid_index
        )
        attr.ah_attr = pyverbs.addr.AHAttr(
            port_num=self.port_num, is_global=1, gr=route, dlid=remote.lid
        )
        qp.to_rts(attr)

    def close(self) -> None:
        self.pd.close()
        self.ctx.close()


def send_info(sock: socket.socket, info: QpInfo) -> None:
    body = msgspec.msgpack.encode(info)
    sock.sendall(_LENGTH.pack(len(body)) + body)


def recv_info(sock: socket.socket) -> QpInfo:
    (length,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    if length > 4096:
        raise ProtocolError(f"handshake message of {length} bytes")
    try:
        return msgspec.msgpack.decode(_recv_exact(sock, length), type=QpInfo)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"bad handshake: {exc}") from None


def _recv_exact(sock: socket.socket, num_bytes: int) -> bytes:
    data = bytearray()
    while len(data) < num_bytes:
        chunk = sock.recv(num_bytes - len(data))
        if not chunk:
            raise EOFError("peer closed the handshake connection")
        data += chunk
    return bytes(data)


class HandshakeServer:
    """Creates the owner's half of each client's RC queue pair and keeps it while the
    client's handshake connection stays open."""

    def __init__(self, device: RdmaDevice, host: str) -> None:
        self._device = device
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(POLL_S)
        self.host, self.port = self._listener.getsockname()[:2]
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    def close(self, timeout: float) -> None:
        deadline = Deadline.after(timeout)
        self._stopping.set()
        self._acceptor.join(deadline.remaining())
        self._listener.close()
        for thread in self._threads:
            thread.join(deadline.remaining())

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, sock: socket.socket) -> None:
        qp = cq = None
        try:
            sock.settimeout(POLL_S * 4)
            remote = recv_info(sock)
            qp, cq, psn = self._device.new_qp()
            self._device.connect_qp(qp, psn, remote)
            send_info(sock, self._device.info(qp, psn))
            sock.settimeout(POLL_S)
            while not self._stopping.is_set():
                try:
                    if not sock.recv(1):
                        return
                except TimeoutError:
                    continue
        except (OSError, EOFError, ProtocolError) as exc:
            log.info("rdma handshake connection ended: %r", exc)
        finally:
            if qp is not None:
                qp.close()
                cq.close()
            sock.close()
