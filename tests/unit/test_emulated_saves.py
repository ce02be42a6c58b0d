"""The emulated prefill saves a prompt's blocks as the vLLM connector does: its first token
waits for every target store's allocation, not for the writes and commits, which finish beside
the request path; shutting down waits for them, up to a deadline (pure logic: a recording stub
for the store client)."""

from __future__ import annotations

import asyncio

from crescent.common.errors import RecoverableError
from crescent.common.store_messages import BlockSlots
from crescent.engine.emulated_kv import EmulatedKv

HASHES = [b"h0", b"h1"]


class _Client:
    """Allocations answer at once (or fail on `down` nodes); fills wait for `commit`."""

    def __init__(self, down: frozenset[str] = frozenset()) -> None:
        self.down = down
        self.commit = asyncio.Event()
        self.allocated: list[str] = []
        self.committed: list[str] = []

    async def allocate(self, model: str, node: str, hashes: list[bytes]) -> BlockSlots:
        if node in self.down:
            raise RecoverableError(f"{node} does not answer")
        self.allocated.append(node)
        return BlockSlots(segment=node, block_bytes=8, allocated=list(hashes), offsets=[0, 8])

    async def fill(self, model: str, node: str, slots: BlockSlots, blocks: dict) -> None:
        assert set(blocks) == set(slots.allocated) and all(len(b) == 8 for b in blocks.values())
        await self.commit.wait()
        self.committed.append(node)


async def test_the_first_token_waits_for_the_allocations_not_the_commits():
    client = _Client()
    kv = EmulatedKv(client, "m", 64, "A")
    await asyncio.wait_for(kv.save(HASHES, ["B", "A"]), 5)
    assert sorted(client.allocated) == ["A", "B"] and client.committed == []
    client.commit.set()
    await kv.finish_saves(timeout_s=5)
    assert sorted(client.committed) == ["A", "B"]


async def test_a_store_that_cannot_allocate_gets_no_blocks_and_holds_up_no_other():
    client = _Client(down=frozenset({"B"}))
    kv = EmulatedKv(client, "m", 64, "A")
    await kv.save(HASHES, ["B", "A"])
    client.commit.set()
    await kv.finish_saves(timeout_s=5)
    assert client.committed == ["A"]


async def test_saves_unfinished_at_the_shutdown_deadline_are_cancelled():
    kv = EmulatedKv(_Client(), "m", 64, "A")
    await kv.save(HASHES, ["A"])
    fills = set(kv._fills)
    await asyncio.wait_for(kv.finish_saves(timeout_s=0.05), 5)
    await asyncio.gather(*fills, return_exceptions=True)
    assert fills and all(fill.cancelled() for fill in fills)
