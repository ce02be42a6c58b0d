"""Block metadata in etcd (blocks/<model>/<hash>/<node>), written in batched transactions under
the store's lease, so a dead store's blocks vanish with it and a busy store does not issue
one etcd round trip per block.

The store answers a commit once its own pool serves the block; the block's key follows here,
published within about one etcd write of the commit (the conductor's index follows etcd through
a watch, so a block it does not see yet is only a missed cache hit). Changes to one key within a
batch collapse to the last one, and batches are written one after another, so a delete queued
after a put of the same key (an evict right after a commit) always wins. Changes nobody waits
for are held up to `interval_s` to batch more; `sync()` returns once everything queued before
it is in etcd, and writes at once (an evict, or a commit asked to wait for its keys).

How far etcd trails is on /metrics: the keys not written yet (a gauge) and each batch's lag
from its oldest change (a histogram and the last value). The backlog is bounded: a commit that
finds `max_pending_keys` or more keys unwritten first waits for them (`make_room`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aetcd
import grpc

from crescent.common.codec import encode
from crescent.common.errors import RecoverableError
from crescent.common.etcd import RPC_TIMEOUT_S, LeasedKeys
from crescent.common.naming import Keys
from crescent.common.store_messages import BlockMeta
from crescent.store import metrics
from crescent.store.etcd_txn import txn_request

log = logging.getLogger(__name__)

MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
MAX_PENDING_KEYS = 65536  # unwritten keys past which a commit waits for etcd


class MetadataNotWritten(RecoverableError, TimeoutError):
    """Block metadata did not reach etcd within a deadline (etcd down or slow). Also a
    TimeoutError: the lease's renewal, which waits for the keys it queues again, treats it as
    the etcd timeout it is."""

    def __init__(self, num_keys: int, timeout_s: float) -> None:
        super().__init__(
            f"{num_keys} block metadata keys not written to etcd within {timeout_s:.1f}s"
        )
        self.num_keys = num_keys
        self.timeout_s = timeout_s


class MetadataWriter:
    def __init__(
        self,
        client: aetcd.Client,
        leased: LeasedKeys,
        keys: Keys,
        node: str,
        interval_s: float = 0.005,
        max_pending_keys: int = MAX_PENDING_KEYS,
    ) -> None:
        self._client = client
        self._leased = leased
        self._keys = keys
        self._node = node
        self._interval_s = interval_s
        self._max_pending_keys = max_pending_keys
        self._pending: dict[str, bytes | None] = {}  # key → value, None = delete
        self._pending_since = 0.0  # monotonic time of the oldest change in _pending
        self._num_writing = 0  # keys of the batch being written
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()  # someone waits in sync(): write now, do not batch longer
        self._written = asyncio.Condition()
        self._generation = 0  # batches queued so far
        self._flushed = 0  # batches in etcd so far
        self.num_transactions = 0
        # Read when /metrics is scraped, not set per key on the commit's path.
        metrics.METADATA_PENDING_KEYS.set_function(lambda: self.num_unwritten)

    @property
    def num_unwritten(self) -> int:
        """Keys queued or being written, not yet in etcd."""
        return len(self._pending) + self._num_writing

    def put(self, model: str, block_hash: bytes, meta: BlockMeta) -> None:
        self._queue(self._keys.block(model, block_hash, self._node), encode(meta))

    def delete(self, model: str, block_hash: bytes) -> None:
        self._queue(self._keys.block(model, block_hash, self._node), None)

    def _queue(self, key: str, value: bytes | None) -> None:
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending[key] = value
        self._wake.set()

    def put_all(self, entries: Callable[[], list[tuple[str, bytes, BlockMeta]]]) -> Callable:
        """A lease-renewal callback that queues every block again (their keys died with the
        lease)."""

        async def renew() -> None:
            for model, block_hash, meta in entries():
                self.put(model, block_hash, meta)
            await self.sync()

        return renew

    async def sync(self, timeout_s: float = 10.0) -> None:
        """Return once every change queued before this call is in etcd; raise
        MetadataNotWritten after `timeout_s`."""
        target = self._generation + (1 if self._pending else 0)
        if self._pending:
            self._urgent.set()
        try:
            async with self._written:
                async with asyncio.timeout(timeout_s):
                    await self._written.wait_for(lambda: self._flushed >= target)
        except TimeoutError:
            raise MetadataNotWritten(self.num_unwritten, timeout_s) from None

    async def make_room(self, timeout_s: float = 10.0) -> None:
        """Bound the backlog: wait for etcd while `max_pending_keys` or more keys are unwritten."""
        if self.num_unwritten >= self._max_pending_keys:
            log.warning(
                "block metadata backlog full; waiting for etcd",
                extra={"num_keys": self.num_unwritten},
            )
            await self.sync(timeout_s)

    async def flush(self, timeout_s: float) -> bool:
        """Write what is queued, within `timeout_s` (a store's shutdown, before its lease is
        revoked); False, with the reason logged, if etcd did not take it in time."""
        try:
            await self.sync(timeout_s)
        except MetadataNotWritten as exc:
            log.warning(
                "block metadata not flushed before shutdown; the lease's revoke or expiry "
                "removes the keys already written",
                extra={"num_keys": exc.num_keys, "timeout_s": timeout_s},
            )
            return False
        return True

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            if not self._urgent.is_set():
                try:
                    async with asyncio.timeout(self._interval_s):
                        await self._urgent.wait()
                except TimeoutError:
                    pass
            self._wake.clear()
            self._urgent.clear()
            batch, self._pending = self._pending, {}
            oldest = self._pending_since
            self._num_writing = len(batch)
            self._generation += 1
            generation = self._generation
            await self._write(batch)
            self._num_writing = 0
            lag_s = time.monotonic() - oldest
            metrics.METADATA_LAG.observe(lag_s)
            metrics.METADATA_LAST_LAG.set(lag_s)
            async with self._written:
                self._flushed = generation
                self._written.notify_all()

    async def _write(self, batch: dict[str, bytes | None]) -> None:
        """Write a batch as transactions of at most MAX_TXN_OPS, all in flight at once (a key
        appears once in a batch, so their order does not matter): a commit of many blocks
        waits for one etcd round trip, not one per MAX_TXN_OPS blocks."""
        items = list(batch.items())
        await asyncio.gather(
            *(
                self._write_transaction(items[start : start + MAX_TXN_OPS])
                for start in range(0, len(items), MAX_TXN_OPS)
            )
        )

    async def _write_transaction(self, items: list[tuple[str, bytes | None]]) -> None:
        """One transaction, sent as a prebuilt request on aetcd's KV stub (see etcd_txn: the
        per-key op objects of aetcd's `transaction` cost several times the rest of a commit)."""
        while True:
            lease = self._leased.lease  # read on each try: a renewed lease replaces a lost one
            request = txn_request(
                ((key.encode(), value) for key, value in items), lease.id if lease else 0
            )
            try:
                await self._client.connect()  # a no-op once connected, as in aetcd's own calls
                await self._client.kvstub.Txn(
                    request, timeout=RPC_TIMEOUT_S, metadata=self._client.metadata
                )
                self.num_transactions += 1
                return
            except (
                TimeoutError,
                aetcd.exceptions.ClientError,
                grpc.aio.AioRpcError,
                OSError,
            ) as exc:
                log.warning("block metadata write failed; retrying", extra={"error": repr(exc)})
                await asyncio.sleep(0.5)
