"""The emulated engine's KV traffic: with no model there are no real keys and values, but the
blocks still exist — of the store's real size, under the prompt's real chained hashes — so
cache hits, transfers and replicas behave in an emulated cluster as they would with a model.

A prompt's leading blocks held by this node's store count as cached (their prefill time is
saved). After computing, the prompt's blocks are saved to every target node's store the way
the vLLM connector saves them (engine/vllm/saver.py): the first token waits for the stores to
have allocated them, and they are written and committed beside the request path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from crescent.common.errors import RecoverableError
from crescent.common.hashing import block_hashes
from crescent.common.store_messages import BlockSlots
from crescent.storeclient.client import StoreClient

log = logging.getLogger(__name__)


class EmulatedKv:
    def __init__(self, client: StoreClient, model: str, block_size: int, node: str) -> None:
        self.client = client
        self.model = model
        self.block_size = block_size
        self.node = node
        self._payloads: dict[int, bytes] = {}
        self._fills: set[asyncio.Task[None]] = set()  # writes and commits beside the requests

    def hashes(self, token_ids: Sequence[int]) -> list[bytes]:
        return block_hashes(token_ids, self.block_size, self.model)

    async def num_cached_tokens(self, hashes: Sequence[bytes]) -> int:
        """Tokens of the prompt's prefix this node's store holds; 0 when it cannot say."""
        try:
            return len(await self.client.lookup(self.model, self.node, hashes)) * self.block_size
        except RecoverableError as exc:
            log.warning(
                "store lookup failed; computing the whole prompt", extra={"error": str(exc)}
            )
            return 0

    async def save(self, hashes: Sequence[bytes], nodes: Sequence[str]) -> None:
        """Allocate the prompt's blocks (dummy bytes of the store's block size) in each node's
        store, all at once; returns once every store has answered, their writes and commits
        under way beside it (`finish_saves` waits for them)."""
        allocations = await asyncio.gather(*(self._allocate(hashes, node) for node in nodes))
        for node, slots in zip(nodes, allocations):
            if slots is not None and slots.allocated:
                fill = asyncio.create_task(self._fill(node, slots), name=f"save to {node}")
                self._fills.add(fill)
                fill.add_done_callback(self._fills.discard)

    async def _allocate(self, hashes: Sequence[bytes], node: str) -> BlockSlots | None:
        try:
            return await self.client.allocate(self.model, node, hashes)
        except RecoverableError as exc:
            log.warning("saving emulated KV failed", extra={"node": node, "error": str(exc)})
            return None

    async def _fill(self, node: str, slots: BlockSlots) -> None:
        payload = self._payloads.setdefault(slots.block_bytes, bytes(slots.block_bytes))
        try:
            await self.client.fill(self.model, node, slots, dict.fromkeys(slots.allocated, payload))
        except RecoverableError as exc:
            log.warning("saving emulated KV failed", extra={"node": node, "error": str(exc)})
        except Exception:  # nobody awaits a save: what it raises is logged here or lost
            log.exception("saving emulated KV failed", extra={"node": node})

    async def finish_saves(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the saves under way (before the store client closes);
        those left are cancelled, their blocks' allocations running out with their ttl."""
        if not self._fills:
            return
        _, left = await asyncio.wait(set(self._fills), timeout=timeout_s)
        for fill in left:
            fill.cancel()
        if left:
            log.warning("saves left unfinished at shutdown", extra={"num_saves": len(left)})
