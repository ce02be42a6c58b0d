"""The emulated engine's KV traffic: with no model there are no real keys and values, but the
blocks still exist — of the store's real size, under the prompt's real chained hashes — so
cache hits, transfers and replicas behave in an emulated cluster as they would with a model.

A prompt's leading blocks held by this node's store count as cached (their prefill time is
saved); after computing, the prompt's blocks are written to every target node's store.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from crescent.common.errors import RecoverableError
from crescent.common.hashing import block_hashes
from crescent.storeclient.client import StoreClient

log = logging.getLogger(__name__)


class EmulatedKv:
    def __init__(self, client: StoreClient, model: str, block_size: int, node: str) -> None:
        self.client = client
        self.model = model
        self.block_size = block_size
        self.node = node
        self._payloads: dict[int, bytes] = {}

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
        """Write the prompt's blocks (dummy bytes of the store's block size) to each node."""
        for node in nodes:
            try:
                block_bytes = await self.client.block_bytes(node)
                payload = self._payloads.setdefault(block_bytes, bytes(block_bytes))
                await self.client.put_blocks(self.model, node, hashes, [payload] * len(hashes))
            except RecoverableError as exc:
                log.warning("saving emulated KV failed", extra={"node": node, "error": str(exc)})
