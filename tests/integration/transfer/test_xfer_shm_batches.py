"""Many small shm entries: back to back (one run), scattered on one side (one numpy row copy),
scattered on both or unaligned (chunk by chunk): every layout moves exactly its bytes, in
both directions, and the planner picks the one-call paths where they apply."""

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
from crescent.transfer.groups import EntryGroup
from crescent.transfer.segment import ShmMapping
from crescent.transfer.transports.shm_plan import RowCopy, plan_runs

KiB = 1 << 10
NUM = 64
SIZE = 4 * KiB


def _layout(name: str) -> tuple[list[int], list[int], int]:
    """(local offsets, remote offsets, length) of NUM entries."""
    order = [int(i) for i in np.random.default_rng(7).permutation(NUM)]
    contiguous = [i * SIZE for i in range(NUM)]
    scattered = [i * SIZE for i in order]
    return {
        "back-to-back": (contiguous, contiguous, SIZE),
        "remote-scattered": (contiguous, scattered, SIZE),
        "local-scattered": (scattered, contiguous, SIZE),
        "both-scattered": (scattered, [i * SIZE for i in reversed(order)], SIZE),
        "unaligned": (
            contiguous,
            [o + 1 if i % 2 else o for i, o in enumerate(scattered)],
            SIZE - 1,
        ),
    }[name]


@pytest.fixture
async def engines(engine_factory, segment_factory):
    served = segment_factory("served", 2 * NUM * SIZE)
    server = TransferEngine(DictResolver(), TransferConfig(node="server"))
    await server.start()
    server.register(served)
    client = await engine_factory(
        DictResolver({"served": server.descriptor("served")}), transports=(TransportKind.SHM,)
    )
    local = segment_factory("local", 2 * NUM * SIZE)
    client.register(local)
    yield client, local, served, server.descriptor("served")
    await server.close()


@pytest.mark.parametrize(
    "name", ["back-to-back", "remote-scattered", "local-scattered", "both-scattered", "unaligned"]
)
async def test_every_layout_moves_exactly_its_bytes_both_ways(name, engines):
    client, local, served, _ = engines
    local_offsets, remote_offsets, length = _layout(name)
    memory = local.array()
    memory[:] = np.random.default_rng(1).integers(0, 255, memory.size, dtype=np.uint8)
    writes = [
        TransferEntry(Op.WRITE, "local", lo, "served", ro, length)
        for lo, ro in zip(local_offsets, remote_offsets)
    ]
    (await client.transfer(writes, timeout=10)).raise_for_errors()
    for lo, ro in zip(local_offsets, remote_offsets):
        assert np.array_equal(served.array()[ro : ro + length], memory[lo : lo + length])
    back = NUM * SIZE  # read into the local segment's second half, at the same layout
    reads = [
        TransferEntry(Op.READ, "local", back + lo, "served", ro, length)
        for lo, ro in zip(local_offsets, remote_offsets)
    ]
    (await client.transfer(reads, timeout=10)).raise_for_errors()
    for lo in local_offsets:
        assert np.array_equal(memory[back + lo : back + lo + length], memory[lo : lo + length])


@pytest.mark.parametrize(
    ("name", "one_call"),
    [
        ("back-to-back", True),
        ("remote-scattered", True),
        ("local-scattered", True),
        ("both-scattered", False),
        ("unaligned", False),
    ],
)
async def test_batches_of_small_entries_are_one_call_where_one_side_is_contiguous(
    name, one_call, engines
):
    _, local, served, remote = engines
    local_offsets, remote_offsets, length = _layout(name)
    group = EntryGroup(
        Op.WRITE,
        local,
        remote,
        range(NUM),
        local_offsets,
        remote_offsets,
        [length] * NUM,
    )
    mapping = ShmMapping(served.shm_name, served.size, served.device, served.inode)
    try:
        assert (RowCopy.of(group, mapping) is not None) is one_call
        assert (len(plan_runs(group, mapping)) == 1) is (name == "back-to-back")
    finally:
        mapping.close()
