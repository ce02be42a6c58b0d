"""The tcp transport moves a group of entries as one request: many small entries at scattered
offsets land byte-exact in a handful of requests, the counters say tcp moved them, and a link
that breaks mid-batch fails the batch's unfinished entries with a clear error."""

from __future__ import annotations

import msgspec
import numpy as np

from crescent.transfer import (
    DictResolver,
    Op,
    PeerUnreachable,
    TcpEndpoint,
    TransferConfig,
    TransferEngine,
    TransferEntry,
    TransportKind,
)

KiB = 1 << 10
NUM = 256
SLOT = 8 * KiB


async def _tcp_server(segment_factory, *names: str) -> TransferEngine:
    server = TransferEngine(
        DictResolver(), TransferConfig(node="server", transports=(TransportKind.TCP,))
    )
    await server.start()
    for name in names:
        server.register(segment_factory(name, NUM * SLOT))
    return server


async def test_many_small_scattered_entries_land_exactly_in_a_few_requests(
    engine_factory, segment_factory
) -> None:
    server = await _tcp_server(segment_factory, "served-a", "served-b")
    try:
        resolver = DictResolver({d.name: d for d in server.descriptors()})
        client = await engine_factory(resolver, transports=(TransportKind.TCP,))
        local = segment_factory("local", 2 * NUM * SLOT)
        client.register(local)
        memory = local.array()
        memory[:] = np.random.default_rng(3).integers(0, 255, memory.size, dtype=np.uint8)
        slots = [int(s) for s in np.random.default_rng(4).permutation(NUM)]
        lengths = [4 * KiB if i % 2 else 4 * KiB - 3 for i in range(NUM)]  # odd sizes too
        remotes = ["served-a" if i < NUM // 2 else "served-b" for i in range(NUM)]
        writes = [
            TransferEntry(Op.WRITE, "local", i * SLOT, remotes[i], slots[i] * SLOT, lengths[i])
            for i in range(NUM)
        ]
        (await client.transfer(writes, timeout=10)).raise_for_errors()
        back = NUM * SLOT  # read everything into the local segment's second half
        reads = [
            TransferEntry(
                Op.READ, "local", back + i * SLOT, remotes[i], slots[i] * SLOT, lengths[i]
            )
            for i in range(NUM)
        ]
        (await client.transfer(reads, timeout=10)).raise_for_errors()
        for i in range(NUM):
            sent = memory[i * SLOT : i * SLOT + lengths[i]]
            assert np.array_equal(memory[back + i * SLOT : back + i * SLOT + lengths[i]], sent)
        tcp = server.transport(TransportKind.TCP)
        # Two batches of 256 entries on two segments: without batching, 512 requests.
        assert tcp.num_served_requests <= 2 * 2 * client.config.num_connections
        counters = client.counters()
        assert set(counters) == {TransportKind.TCP}
        assert counters[TransportKind.TCP].num_bytes == 2 * sum(lengths)
        assert counters[TransportKind.TCP].num_transfers == 2 * NUM
        assert tcp.num_served_bytes == 2 * sum(lengths)
    finally:
        await server.close()


async def test_a_link_cut_mid_batch_fails_the_batch_clearly(
    engine_factory, segment_factory, cutting_proxy
) -> None:
    server = await _tcp_server(segment_factory, "served")
    try:
        descriptor = server.descriptor("served")
        endpoint = descriptor.endpoint(TcpEndpoint)
        proxy = cutting_proxy(endpoint.host, endpoint.port, 256 * KiB)
        via_proxy = msgspec.structs.replace(
            descriptor, endpoints=(TcpEndpoint("127.0.0.1", proxy.port, endpoint.segment_id),)
        )
        client = await engine_factory(
            DictResolver({"served": via_proxy}), transports=(TransportKind.TCP,)
        )
        local = segment_factory("local", NUM * SLOT)
        client.register(local)
        writes = [
            TransferEntry(Op.WRITE, "local", i * SLOT, "served", i * SLOT, SLOT) for i in range(NUM)
        ]
        result = await client.transfer(writes, timeout=10)
        assert result.num_failed == NUM  # 2 MiB in one group: no group gets through
        for _, error in result.failed():
            assert isinstance(error, PeerUnreachable)
            assert error.peer == f"127.0.0.1:{proxy.port}" and error.segment == "served"
            assert "connection lost" in error.cause
        assert proxy.num_cuts > client.config.max_reconnects
        assert client.counters()[TransportKind.TCP].num_bytes == 0
    finally:
        await server.close()
