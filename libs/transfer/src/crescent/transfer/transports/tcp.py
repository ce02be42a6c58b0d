"""The tcp transport: reaches any peer with a tcp endpoint.

Serving: a TcpServer on the engine's (host, port). Client: per peer a pool of
connections; a batch's slices for that peer go in one queue that up to
`num_connections` lanes (threads, one connection each) work at once, so slices stripe
across connections; each group a lane takes travels as one request (tcp_client.py). A
connection that breaks mid-group hands its unfinished slices back to the queue and reconnects;
a peer that refuses connections fails its entries with PeerUnreachable.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence

from crescent.transfer.batch import Deadline
from crescent.transfer.config import TransportKind
from crescent.transfer.descriptor import Endpoint, SegmentDescriptor, TcpEndpoint
from crescent.transfer.groups import EntryGroup
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
    ConnectionPool,
    LanePlan,
    LaneSettings,
    execute_by_peer,
)
from crescent.transfer.transports.tcp_client import TcpConnection
from crescent.transfer.transports.tcp_server import TcpServer


class TcpTransport(Transport):
    kind = TransportKind.TCP

    def __init__(self, context: TransportContext) -> None:
        super().__init__(context)
        self._server: TcpServer | None = None
        self._pools: dict[tuple[str, int], ConnectionPool[TcpConnection]] = {}
        self.num_retries = 0
        self._num_served_before_close = 0

    async def start(self) -> None:
        config = self.context.config
        self._server = TcpServer(
            self.context.registry,
            config.tcp_host,
            config.tcp_port,
            config.server_io_timeout,
            config.server_idle_timeout,
        )
        self._server.start()

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        if self._server is not None:
            server, self._server = self._server, None
            self._num_served_before_close = server.num_served_bytes
            await asyncio.to_thread(server.close, self.context.config.close_timeout)

    @property
    def num_served_bytes(self) -> int:
        return (
            self._server.num_served_bytes
            if self._server is not None
            else self._num_served_before_close
        )

    @property
    def num_served_requests(self) -> int:
        """Requests the server accepted (each moves a group of entries); 0 once closed."""
        return self._server.num_served_requests if self._server is not None else 0

    @property
    def address(self) -> tuple[str, int]:
        """(advertised host, port) of the server."""
        if self._server is None:
            raise RuntimeError("tcp transport is not started")
        host = self.context.config.tcp_advertise_host or self._server.host
        return host, self._server.port

    def expose(self, segment: Segment, segment_id: int) -> Endpoint | None:
        if segment.memory_kind is not MemoryKind.HOST:
            return None
        host, port = self.address
        return TcpEndpoint(host, port, segment_id)

    def can_reach(self, descriptor: SegmentDescriptor) -> bool:
        return descriptor.endpoint(TcpEndpoint) is not None

    def pool(self, host: str, port: int) -> ConnectionPool[TcpConnection]:
        """The connection pool to one peer (created on first use)."""
        key = (host, port)
        pool = self._pools.get(key)
        if pool is None:
            config = self.context.config
            peer = f"{host}:{port}"
            connect = functools.partial(
                _connect, host=host, port=port, peer=peer, connect_timeout=config.connect_timeout
            )
            pool = ConnectionPool(peer, connect, max_idle=config.num_connections)
            self._pools[key] = pool
        return pool

    async def execute(self, groups: Sequence[EntryGroup], deadline: Deadline) -> Failures:
        config = self.context.config
        items, indices = work_items(groups)
        plan = LanePlan(
            peer_of=_peer_of,
            pool_of=self.pool,
            settings=LaneSettings(
                config.max_group_slices, config.slice_bytes, config.max_reconnects
            ),
            num_connections=config.num_connections,
            slice_bytes=config.slice_bytes,
        )
        outcomes, num_retries = await execute_by_peer(items, deadline, plan, self.context.executor)
        self.num_retries += num_retries
        return failures_of(indices, outcomes)


def _peer_of(item: WorkItem) -> tuple[str, int]:
    endpoint = item.remote.endpoint(TcpEndpoint)
    assert endpoint is not None, "routed to tcp without a tcp endpoint"
    return endpoint.host, endpoint.port


def _connect(
    deadline: Deadline, *, host: str, port: int, peer: str, connect_timeout: float
) -> TcpConnection:
    return TcpConnection.connect(host, port, peer, deadline, connect_timeout)
