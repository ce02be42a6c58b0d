"""The store, as vLLM's synchronous connector code sees it: a StoreClient on its own event
loop thread, and block operations at the granularity the connector needs (pin once, read one
layer of many blocks, allocate, write one layer, commit).

vLLM builds its connector once per role. The worker side moves bytes, so its bridge holds the
data plane (a NATS connection, an etcd client, a staging segment); the scheduler side only
asks this node's store how much of a prompt it holds, so its bridge is a NATS connection
alone. Where both roles live in one process (vLLM without engine-core multiprocessing) they
share the worker's bridge (SharedBridges); where they do not (the default: the worker runs in
a process of its own), the scheduler's process opens no etcd client and no data plane.

vLLM calls its connector from the engine-core process's threads, which run no asyncio loop
of ours, so every call here hands a coroutine to the bridge loop and waits for it with a
deadline; nothing waits forever.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import uvloop

from crescent.common.bus import Bus
from crescent.common.errors import RecoverableError
from crescent.common.etcd import connect_etcd
from crescent.common.naming import Subjects
from crescent.common.store_messages import (
    AbortBlocks,
    AllocBlocks,
    BlockSlots,
    CommitBlocks,
    Done,
    EvictBlocks,
    EvictReply,
    LookupBlocks,
    LookupReply,
    PinBlocks,
    PinnedBlocks,
    UnpinBlocks,
)
from crescent.storeclient.client import ClientConfig, StoreClient
from crescent.transfer import Op, TransferConfig, parse_transports

log = logging.getLogger(__name__)
T = TypeVar("T")

CLIENT_CLOSE_S = 5.0  # the store client's close (its data plane's threads) may take this long
CONNECTIONS_CLOSE_S = 5.0  # then the NATS drain and the etcd close


class KvStoreError(RecoverableError):
    """A store operation of the connector failed or missed its deadline: the blocks involved
    are recomputed (loads) or simply not stored (saves)."""


@dataclass(frozen=True)
class BridgeConfig:
    nats_url: str
    etcd_url: str
    cluster: str
    node: str
    name: str
    timeout_s: float = 10.0
    staging_bytes: int = 16 << 20
    use_mapping: bool = True  # False: even same-host stores go over the data plane
    transports: str = ""  # the data plane's transports ("tcp", "shm,tcp"; "" = all that run here)
    has_data_plane: bool = (
        True  # False: control requests only (a NATS connection, no etcd, no bytes)
    )

    @property
    def connection_name(self) -> str:
        """The NATS connection's name: `name`, with `-lookup` for a control-only bridge."""
        return self.name if self.has_data_plane else f"{self.name}-lookup"


class StoreBridge:
    """Owns a thread running an event loop with a Bus and, with a data plane, an etcd client and
    a StoreClient."""

    def __init__(self, config: BridgeConfig) -> None:
        self.config = config
        self._loop = uvloop.new_event_loop()  # the services' loop (crescent.common.service)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"crescent-kv {config.connection_name}", daemon=True
        )
        self.bus: Bus | None = None
        self._etcd = None
        self.client: StoreClient | None = None
        self._started = threading.Event()  # set once start() has connected or failed
        self._start_error: KvStoreError | None = None
        self._start_timeout_s = config.timeout_s + 10

    def start(self) -> None:
        self._thread.start()
        try:
            self.call(self._connect(), self._start_timeout_s)
        except KvStoreError as exc:
            self._start_error = exc
            raise
        finally:
            self._started.set()

    def wait_started(self) -> None:
        """Wait for another thread's `start` of this bridge; its error, if it failed."""
        if not self._started.wait(self._start_timeout_s):
            raise KvStoreError(
                f"store bridge {self.config.connection_name} not connected within "
                f"{self._start_timeout_s}s"
            )
        if self._start_error is not None:
            raise self._start_error

    async def _connect(self) -> None:
        config = self.config
        self.bus = await Bus.connect(config.nats_url, config.connection_name, config.timeout_s)
        if not config.has_data_plane:
            return
        self._etcd = await connect_etcd(config.etcd_url, config.timeout_s)
        transfer = TransferConfig(node=config.node, transports=parse_transports(config.transports))
        client_config = ClientConfig(
            node=config.node,
            timeout_s=config.timeout_s,
            staging_bytes=config.staging_bytes,
            use_mapping=config.use_mapping,
            transfer=transfer,
        )
        self.client = StoreClient(self.bus, self._etcd, config.cluster, client_config)
        await self.client.start()

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        try:
            self.call(self._disconnect(), CLIENT_CLOSE_S + CONNECTIONS_CLOSE_S)
        except Exception as exc:  # closing is best effort: the process is going away
            log.warning("store bridge close failed", extra={"error": repr(exc)})
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    async def _disconnect(self) -> None:
        """Close the store client, then the NATS and etcd connections, these also when the
        client's close failed or ran out of time: a connection left open outlives the bridge
        on the NATS server."""
        try:
            if self.client is not None:
                async with asyncio.timeout(CLIENT_CLOSE_S):
                    await self.client.close()
        finally:
            if self.bus is not None:
                await self.bus.drain(timeout_s=CONNECTIONS_CLOSE_S / 3)  # two waits, then etcd
            if self._etcd is not None:
                await self._etcd.close()

    def submit(self, coro: Awaitable[T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, coro: Awaitable[T], timeout_s: float | None = None) -> T:
        """Run `coro` on the bridge loop and wait for it; errors become KvStoreError."""
        future = self.submit(coro)
        try:
            return future.result(timeout_s or self.config.timeout_s)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise KvStoreError(
                f"store operation missed its {timeout_s or self.config.timeout_s}s deadline"
            ) from exc
        except KvStoreError:
            raise
        except Exception as exc:
            raise KvStoreError(f"store operation failed: {exc!r}") from exc


class SharedBridges:
    """One started StoreBridge per process and configuration, shared by its users and closed by
    the last. vLLM builds CrescentConnector once per role (scheduler, worker), each on its own;
    where both roles run in one process only the process can see that they want the same
    connections. Class state for that reason alone; the registry lock is never held while a
    bridge connects."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _bridges: ClassVar[dict[BridgeConfig, StoreBridge]] = {}
    _num_users: ClassVar[dict[BridgeConfig, int]] = {}

    @classmethod
    def acquire(cls, config: BridgeConfig) -> StoreBridge:
        """The process's bridge for `config`, started (connected) before it is returned. A
        control-only config is served by a bridge with a data plane where there is one."""
        with cls._lock:
            bridge = cls._bridges.get(config)
            if bridge is None and not config.has_data_plane:
                bridge = cls._bridges.get(dataclasses.replace(config, has_data_plane=True))
            is_new = bridge is None
            if is_new:
                bridge = cls._bridges[config] = StoreBridge(config)
            cls._num_users[bridge.config] = cls._num_users.get(bridge.config, 0) + 1
        try:
            if is_new:
                bridge.start()
            else:
                bridge.wait_started()
        except BaseException:
            cls.release(bridge)
            raise
        return bridge

    @classmethod
    def release(cls, bridge: StoreBridge) -> None:
        """One user is done with `bridge`; the last one closes it."""
        with cls._lock:
            config = bridge.config
            cls._num_users[config] -= 1
            is_last = cls._num_users[config] == 0
            if is_last:
                del cls._num_users[config]
                del cls._bridges[config]
        if is_last:
            bridge.close()


class BlockOps:
    """Block-level store operations for the connector (coroutines on the bridge loop).

    Control requests go to a node's store over the bridge's NATS connection; moving bytes needs
    the bridge's StoreClient (a bridge with a data plane). These work one level below the
    client's whole-block put_blocks/get_blocks, because the connector pins once and then reads
    or writes one layer at a time while the model computes the next.
    """

    def __init__(self, bridge: StoreBridge, cluster: str, model: str, timeout_s: float) -> None:
        self.bridge = bridge
        self.subjects = Subjects(cluster)
        self.model = model
        self.timeout_s = timeout_s

    @property
    def client(self) -> StoreClient:
        if self.bridge.client is None:
            raise KvStoreError(f"bridge {self.bridge.config.connection_name} has no data plane")
        return self.bridge.client

    async def ctl(self, node: str, request, reply_type):
        """One request to `node`'s store (store.<node>.ctl)."""
        return await self.bridge.bus.request(
            self.subjects.store_ctl(node), request, reply_type, self.timeout_s
        )

    async def lookup(self, node: str, hashes: Sequence[bytes], wait_writing_s: float = 0.0) -> int:
        """How many leading blocks of `hashes` the store on `node` holds, waiting up to
        `wait_writing_s` for those of them still being written."""
        request = LookupBlocks(model=self.model, hashes=list(hashes), wait_writing_s=wait_writing_s)
        return len((await self.ctl(node, request, LookupReply)).tiers)

    @property
    def pin_ttl_s(self) -> float:
        """How long a pin holds its blocks in place unless unpinned (the store's clock starts
        when the pin arrives)."""
        return 4 * self.timeout_s

    async def pin(self, node: str, hashes: Sequence[bytes]) -> PinnedBlocks:
        request = PinBlocks(model=self.model, hashes=list(hashes), ttl_s=self.pin_ttl_s)
        return await self.ctl(node, request, PinnedBlocks)

    async def unpin(self, node: str, hashes: Sequence[bytes]) -> None:
        if hashes:
            await self.ctl(node, UnpinBlocks(model=self.model, hashes=list(hashes)), Done)

    async def read(
        self, segment: str, offsets: Sequence[int], buffers: Sequence[memoryview]
    ) -> None:
        await self.client.move(Op.READ, segment, offsets, buffers)

    async def alloc(self, node: str, hashes: Sequence[bytes]) -> BlockSlots:
        request = AllocBlocks(model=self.model, hashes=list(hashes), ttl_s=4 * self.timeout_s)
        return await self.ctl(node, request, BlockSlots)

    def mapped(self, segment: str) -> memoryview | None:
        """The store segment's memory, when it lives on this host (then bytes are copied in
        place, in the caller's thread); None for a store reached over the data plane."""
        mapping = self.client.mapping(segment)
        return mapping.view if mapping is not None else None

    async def write(
        self, segment: str, offsets: Sequence[int], buffers: Sequence[memoryview]
    ) -> None:
        await self.client.move(Op.WRITE, segment, offsets, buffers)

    async def commit(self, node: str, hashes: Sequence[bytes]) -> None:
        """Make written blocks readable: returns once the store itself serves them; their keys
        reach etcd (the conductor's index) after, within the store's metadata lag."""
        if hashes:
            await self.ctl(node, CommitBlocks(model=self.model, hashes=list(hashes)), Done)

    async def evict(self, node: str, hashes: Sequence[bytes]) -> None:
        await self.ctl(node, EvictBlocks(model=self.model, hashes=list(hashes)), EvictReply)

    async def abort(self, node: str, hashes: Sequence[bytes]) -> None:
        if hashes:
            await self.ctl(node, AbortBlocks(model=self.model, hashes=list(hashes)), Done)
