"""Entries whose local side is a caller's buffer (registered with the engine only, never
served) move bytes over tcp and shm like a registered segment's."""

from __future__ import annotations

import numpy as np
import pytest

from crescent.transfer import (
    DictResolver,
    Op,
    SegmentNotFound,
    TransferConfig,
    TransferEngine,
    TransferEntry,
    TransportKind,
)
from crescent.transfer.buffers import BufferSegment

BLOCK = 64 << 10


@pytest.mark.parametrize("kind", [TransportKind.SHM, TransportKind.TCP])
async def test_a_callers_buffer_is_written_and_read_in_place(kind, engine_factory, segment_factory):
    served = segment_factory("served", 16 * BLOCK)
    server = TransferEngine(DictResolver(), TransferConfig(node="server"))
    await server.start()
    try:
        server.register(served)
        client = await engine_factory(
            DictResolver({"served": server.descriptor("served")}), transports=(kind,)
        )
        assert client.moves_local_buffers(server.descriptor("served"))
        source = np.random.default_rng(3).integers(0, 255, 4 * BLOCK, dtype=np.uint8)
        client.register_local(BufferSegment("source", memoryview(source)))
        slots = [9, 2, 14, 5]  # scattered on the store's side, back to back on ours
        writes = [
            TransferEntry(Op.WRITE, "source", i * BLOCK, "served", slot * BLOCK, BLOCK)
            for i, slot in enumerate(slots)
        ]
        (await client.transfer(writes, timeout=10)).raise_for_errors()
        for i, slot in enumerate(slots):
            assert np.array_equal(
                served.array()[slot * BLOCK : (slot + 1) * BLOCK],
                source[i * BLOCK : (i + 1) * BLOCK],
            )
        target = np.zeros(4 * BLOCK, dtype=np.uint8)
        client.register_local(BufferSegment("target", memoryview(target)))
        reads = [
            TransferEntry(Op.READ, "target", i * BLOCK, "served", slot * BLOCK, BLOCK)
            for i, slot in enumerate(slots)
        ]
        (await client.transfer(reads, timeout=10)).raise_for_errors()
        assert np.array_equal(target, source)
        client.unregister_local("source")
        client.unregister_local("target")
        with pytest.raises(SegmentNotFound):
            client.unregister_local("target")
        assert {k: c.num_bytes for k, c in client.counters().items()} == {kind: 8 * BLOCK}
    finally:
        await server.close()
