"""The rdma transport: one-sided RDMA WRITE / READ over RC queue pairs (pyverbs).

Every registered host segment is registered as a memory region (MR); its address and
rkey go into the descriptor, so a peer moves bytes without the owner's CPU. An RC queue
pair needs a partner QP on the owner's side: the client opens a small tcp handshake
connection to the owner (address in the descriptor), sends its QP number, PSN and
address, and gets the owner's back. The handshake connection stays open for the QP's
life, so the owner frees the QP when the client goes away.

Slices of a batch go through the same lanes as tcp (one QP per lane); a QP whose work
completes in error (the peer died: retries exhausted) is dropped and its slices retried
on another QP; a peer that refuses the handshake fails its entries with PeerUnreachable.

pyverbs is imported lazily: this module loads on machines without RDMA, where
`unavailable_reason()` says why the transport cannot run.
"""

from __future__ import annotations

import asyncio
import functools
import select
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from crescent.transfer.batch import Deadline, Op
from crescent.transfer.config import TransportKind
from crescent.transfer.descriptor import Endpoint, RdmaEndpoint, SegmentDescriptor
from crescent.transfer.errors import ProtocolError, TransportUnavailable
from crescent.transfer.groups import EntryGroup
from crescent.transfer.plan import Slice
from crescent.transfer.segment import MemoryKind, Segment
from crescent.transfer.transports.base import (
    Failures,
    Transport,
    TransportContext,
    WorkItem,
    failures_of,
    work_items,
)
from crescent.transfer.transports.lanes import (
    Broken,
    ConnectionPool,
    LanePlan,
    LaneSettings,
    PeerJob,
    execute_by_peer,
)
from crescent.transfer.transports.rdma_verbs import (
    QUEUE_DEPTH,
    HandshakeServer,
    RdmaDevice,
    recv_info,
    send_info,
    unavailable_reason,
)

OWNER_CHECK_S = 0.005
IDLE_POLL_S = 0.00005


class RdmaConnection:
    """A connected RC queue pair, used by one lane at a time."""

    def __init__(self, sock: socket.socket, qp: Any, cq: Any, peer: str, mrs: dict[str, Any]):
        self.sock = sock
        self.qp = qp
        self.cq = cq
        self.peer = peer
        self._mrs = mrs
        self._is_aborted = threading.Event()

    @classmethod
    def connect(
        cls,
        device: RdmaDevice,
        mrs: dict[str, Any],
        host: str,
        port: int,
        deadline: Deadline,
        connect_timeout: float,
    ) -> RdmaConnection:
        timeout = min(connect_timeout, deadline.remaining())
        if timeout <= 0:
            raise TimeoutError("deadline passed before connecting")
        sock = socket.create_connection((host, port), timeout=timeout)
        qp, cq, psn = device.new_qp()
        try:
            send_info(sock, device.info(qp, psn))
            device.connect_qp(qp, psn, recv_info(sock))
        except (EOFError, ProtocolError) as exc:
            qp.close()
            cq.close()
            sock.close()
            raise ConnectionError(f"rdma handshake with {host}:{port} failed: {exc}") from exc
        return cls(sock, qp, cq, f"{host}:{port}", mrs)

    def run_group(self, job: PeerJob, group: list[Slice]) -> None:
        import pyverbs.enums as e
        import pyverbs.wr

        try:
            for position, piece in enumerate(group):
                item = job.items[piece.item]
                endpoint = item.remote.endpoint(RdmaEndpoint)
                assert endpoint is not None, "routed to rdma without an rdma endpoint"
                local_mr = self._mrs[item.local.name]
                sge = pyverbs.wr.SGE(
                    item.local.address + piece.local_offset, piece.length, local_mr.lkey
                )
                opcode = e.IBV_WR_RDMA_WRITE if piece.op is Op.WRITE else e.IBV_WR_RDMA_READ
                wr = pyverbs.wr.SendWR(
                    wr_id=position,
                    opcode=opcode,
                    num_sge=1,
                    sg=[sge],
                    send_flags=e.IBV_SEND_SIGNALED,
                )
                wr.set_wr_rdma(endpoint.rkey, endpoint.addr + piece.remote_offset)
                self.qp.post_send(wr)
        except Exception as exc:  # pyverbs errors: the QP is unusable, retry all elsewhere
            raise Broken(0, exc) from exc
        self._wait_for(group, job.deadline)

    def _wait_for(self, group: list[Slice], deadline: Deadline) -> None:
        """Poll completions of the posted group. RC completes in order, so the number of
        successes before the first error is how many slices finished.

        A dead owner shows up as a completion error once the QP's retries run out (about
        half a second), or sooner as the end of its handshake connection, which is
        checked every few milliseconds.
        """
        import pyverbs.enums as e

        num_done = 0
        next_check = time.monotonic()
        while num_done < len(group):
            if self._is_aborted.is_set():
                raise Broken(num_done, ConnectionAbortedError("aborted"))
            if deadline.is_expired():
                raise Broken(num_done, TimeoutError("deadline passed"))
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + OWNER_CHECK_S
                if select.select([self.sock], [], [], 0)[0]:
                    raise Broken(num_done, ConnectionError("owner closed the handshake"))
            num_polled, completions = self.cq.poll(num_entries=len(group) - num_done)
            if num_polled == 0:
                time.sleep(IDLE_POLL_S)  # let other threads (and the event loop) run
            for completion in completions[:num_polled]:
                if completion.status != e.IBV_WC_SUCCESS:
                    raise Broken(
                        num_done, ConnectionError(f"work completion status {completion.status}")
                    )
                num_done += 1

    def abort(self) -> None:
        self._is_aborted.set()

    def close(self) -> None:
        self.qp.close()
        self.cq.close()
        self.sock.close()


class RdmaTransport(Transport):
    kind = TransportKind.RDMA
    moves_unregistered_memory = False  # local memory needs its MR, made in expose()

    def __init__(self, context: TransportContext) -> None:
        super().__init__(context)
        self._device: RdmaDevice | None = None
        self._handshake: HandshakeServer | None = None
        self._mrs: dict[str, Any] = {}
        self._pools: dict[tuple[str, int], ConnectionPool[RdmaConnection]] = {}
        self.num_retries = 0

    async def start(self) -> None:
        config = self.context.config
        reason = unavailable_reason(config.rdma_device)
        if reason is not None:
            raise TransportUnavailable("rdma", reason)
        self._device = RdmaDevice(config.rdma_device, config.rdma_port, config.rdma_gid_index)
        self._handshake = HandshakeServer(self._device, config.tcp_host)

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        if self._handshake is not None:
            await asyncio.to_thread(self._handshake.close, self.context.config.close_timeout)
            self._handshake = None
        for mr in self._mrs.values():
            mr.close()
        self._mrs.clear()
        if self._device is not None:
            self._device.close()
            self._device = None

    def expose(self, segment: Segment, segment_id: int) -> Endpoint | None:
        if segment.memory_kind is not MemoryKind.HOST or self._device is None:
            return None
        assert self._handshake is not None
        mr = self._device.register(segment)
        self._mrs[segment.name] = mr
        host = self.context.config.tcp_advertise_host or self._handshake.host
        device = self._device
        return RdmaEndpoint(
            device.name,
            device.port_num,
            device.port_attr.lid,
            device.gid,
            device.gid_index,
            segment.address,
            mr.rkey,
            host,
            self._handshake.port,
        )

    def withdraw(self, segment: Segment) -> None:
        mr = self._mrs.pop(segment.name, None)
        if mr is not None:
            mr.close()

    def can_reach(self, descriptor: SegmentDescriptor) -> bool:
        return self._device is not None and descriptor.endpoint(RdmaEndpoint) is not None

    async def execute(self, groups: Sequence[EntryGroup], deadline: Deadline) -> Failures:
        config = self.context.config
        items, indices = work_items(groups)
        # A QP keeps many slices in flight by itself, so a group may hold several.
        settings = LaneSettings(
            min(config.max_group_slices, QUEUE_DEPTH),
            config.slice_bytes * 16,
            config.max_reconnects,
        )
        plan = LanePlan(
            peer_of=_peer_of,
            pool_of=self._pool,
            settings=settings,
            num_connections=config.num_connections,
            slice_bytes=config.slice_bytes,
        )
        outcomes, num_retries = await execute_by_peer(items, deadline, plan, self.context.executor)
        self.num_retries += num_retries
        return failures_of(indices, outcomes)

    def _pool(self, host: str, port: int) -> ConnectionPool[RdmaConnection]:
        pool = self._pools.get((host, port))
        if pool is None:
            assert self._device is not None
            connect = functools.partial(
                RdmaConnection.connect,
                self._device,
                self._mrs,
                host,
                port,
                connect_timeout=self.context.config.connect_timeout,
            )
            pool = ConnectionPool(f"{host}:{port}", connect, self.context.config.num_connections)
            self._pools[(host, port)] = pool
        return pool


def _peer_of(item: WorkItem) -> tuple[str, int]:
    endpoint = item.remote.endpoint(RdmaEndpoint)
    assert endpoint is not None, "routed to rdma without an rdma endpoint"
    return endpoint.handshake_host, endpoint.handshake_port
