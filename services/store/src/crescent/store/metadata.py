"""Block metadata in etcd (blocks/<model>/<hash>/<node>), written in batched transactions under
the store's lease, so a dead store's blocks vanish with it and a busy store does not issue
one etcd round trip per block.

Changes to one key within a batch collapse to the last one; changes nobody waits for are held
up to `interval_s` to batch more. `sync()` returns once everything queued before it is in
etcd, and writes at once: the store answers a commit only after that, so a block the caller was
told is stored is also findable, without the commit paying for the batching delay.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aetcd

from crescent.common.codec import encode
from crescent.common.etcd import LeasedKeys
from crescent.common.naming import Keys
from crescent.common.store_messages import BlockMeta

log = logging.getLogger(__name__)

MAX_TXN_OPS = 128  # etcd's default --max-txn-ops


class MetadataWriter:
    def __init__(
        self,
        client: aetcd.Client,
        leased: LeasedKeys,
        keys: Keys,
        node: str,
        interval_s: float = 0.005,
    ) -> None:
        self._client = client
        self._leased = leased
        self._keys = keys
        self._node = node
        self._interval_s = interval_s
        self._pending: dict[str, bytes | None] = {}  # key → value, None = delete
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()  # someone waits in sync(): write now, do not batch longer
        self._written = asyncio.Condition()
        self._generation = 0  # batches queued so far
        self._flushed = 0  # batches in etcd so far
        self.num_transactions = 0

    def put(self, model: str, block_hash: bytes, meta: BlockMeta) -> None:
        self._pending[self._keys.block(model, block_hash, self._node)] = encode(meta)
        self._wake.set()

    def delete(self, model: str, block_hash: bytes) -> None:
        self._pending[self._keys.block(model, block_hash, self._node)] = None
        self._wake.set()

    def put_all(self, entries: Callable[[], list[tuple[str, bytes, BlockMeta]]]) -> Callable:
        """A lease-renewal callback that queues every block again (their keys died with the lease)."""

        async def renew() -> None:
            for model, block_hash, meta in entries():
                self.put(model, block_hash, meta)
            await self.sync()

        return renew

    async def sync(self, timeout_s: float = 10.0) -> None:
        target = self._generation + (1 if self._pending else 0)
        if self._pending:
            self._urgent.set()
        async with self._written:
            await asyncio.wait_for(
                self._written.wait_for(lambda: self._flushed >= target), timeout_s
            )

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            if not self._urgent.is_set():
                try:
                    await asyncio.wait_for(self._urgent.wait(), self._interval_s)
                except TimeoutError:
                    pass
            self._wake.clear()
            self._urgent.clear()
            batch, self._pending = self._pending, {}
            self._generation += 1
            generation = self._generation
            await self._write(batch)
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
        ops = [
            self._client.transactions.delete(key.encode())
            if value is None
            else self._client.transactions.put(key.encode(), value, lease=self._leased.lease)
            for key, value in items
        ]
        while True:
            try:
                await self._client.transaction(compare=[], success=ops, failure=[])
                self.num_transactions += 1
                return
            except (TimeoutError, aetcd.exceptions.ClientError, OSError) as exc:
                log.warning("block metadata write failed; retrying", extra={"error": repr(exc)})
                await asyncio.sleep(0.5)
