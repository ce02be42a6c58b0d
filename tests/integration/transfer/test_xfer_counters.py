"""Per-transport counters of a TransferEngine: the transport a batch names is the one whose
counter moved, on the client (its batches) and, for tcp, on the serving side too."""

from __future__ import annotations

import numpy as np
import pytest

from crescent.transfer import (
    DictResolver,
    Op,
    TransferConfig,
    TransferEngine,
    TransferEntry,
    TransportKind,
)

MiB = 1 << 20


@pytest.mark.parametrize("kind", [TransportKind.SHM, TransportKind.TCP])
async def test_counters_name_the_transport_that_moved_the_bytes(
    kind, engine_factory, segment_factory
):
    served = segment_factory("served", 4 * MiB)
    server = TransferEngine(DictResolver(), TransferConfig(node="server"))
    await server.start()
    try:
        server.register(served)
        client = await engine_factory(
            DictResolver({"served": server.descriptor("served")}), transports=(kind,)
        )
        local = segment_factory("local", 4 * MiB)
        client.register(local)
        local.array()[:] = np.random.default_rng(1).integers(0, 255, 4 * MiB, dtype=np.uint8)
        writes = [
            TransferEntry(Op.WRITE, "local", o, "served", o, MiB) for o in range(0, 3 * MiB, MiB)
        ]
        (await client.transfer(writes, timeout=10)).raise_for_errors()
        read = [TransferEntry(Op.READ, "local", 3 * MiB, "served", 0, 64 << 10)]
        (await client.transfer(read, timeout=10)).raise_for_errors()
        out_of_bounds = [TransferEntry(Op.READ, "local", 0, "served", 4 * MiB - 1, 2)]
        assert not (await client.transfer(out_of_bounds, timeout=10)).is_ok

        counters = client.counters()
        assert set(counters) == {kind}
        assert (counters[kind].num_bytes, counters[kind].num_transfers) == (3 * MiB + (64 << 10), 4)
        served_bytes = server.counters()[TransportKind.TCP].num_served_bytes
        assert served_bytes == (3 * MiB + (64 << 10) if kind is TransportKind.TCP else 0)
        assert np.array_equal(served.array()[: 3 * MiB], local.array()[: 3 * MiB])
    finally:
        await server.close()


async def test_the_default_engine_counts_shm_for_a_same_host_peer(engine_factory, segment_factory):
    """Where no transport is named, a same-host peer is reached over shm, and says so."""
    served = segment_factory("served", MiB)
    server = TransferEngine(DictResolver(), TransferConfig(node="server"))
    await server.start()
    try:
        server.register(served)
        client = await engine_factory(DictResolver({"served": server.descriptor("served")}))
        local = segment_factory("local", MiB)
        client.register(local)
        (
            await client.transfer(
                [TransferEntry(Op.WRITE, "local", 0, "served", 0, MiB)], timeout=10
            )
        ).raise_for_errors()
        moved = {kind: c.num_bytes for kind, c in client.counters().items()}
        assert moved[TransportKind.SHM] == MiB and moved[TransportKind.TCP] == 0
    finally:
        await server.close()
