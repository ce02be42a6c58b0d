"""Many small shm entries: back to back (one run), scattered on one side (one numpy row copy),
scattered on both or unaligned (chunk by chunk): every layout moves exactly its bytes, in
both directions, and the planner picks the one-call paths where they apply."""

from __future__ import annotations

import threading

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
from crescent.transfer.transports import shm as shm_transport
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


@pytest.mark.parametrize("name", ["back-to-back", "remote-scattered", "local-scattered"])
def test_a_row_copy_split_in_parts_moves_each_entry_once(name, segment_factory):
    local = segment_factory("local", NUM * SIZE)
    served = segment_factory("served", NUM * SIZE)
    local.array()[:] = np.random.default_rng(2).integers(0, 255, NUM * SIZE, dtype=np.uint8)
    local_offsets, remote_offsets, length = _layout(name)
    group = EntryGroup(
        Op.WRITE, local, served, range(NUM), local_offsets, remote_offsets, [length] * NUM
    )
    mapping = ShmMapping(served.shm_name, served.size, served.device, served.inode)
    try:
        for part in RowCopy.of(group, mapping).split(3):
            part.run()
    finally:
        mapping.close()
    for lo, ro in zip(local_offsets, remote_offsets):
        assert np.array_equal(served.array()[ro : ro + length], local.array()[lo : lo + length])


@pytest.mark.parametrize(
    ("name", "copy_name"),
    [("remote-scattered", "RowCopy.run"), ("back-to-back-runs", "_Copier.run")],
)
@pytest.mark.parametrize("is_inline", [True, False], ids=["loop-sized", "larger"])
async def test_a_large_batch_is_copied_by_two_threads_at_once(
    name, copy_name, is_inline, engine_factory, segment_factory, monkeypatch
):
    """A batch of at least `shm_parallel_bytes` is split in `shm_copy_threads` parts copied at
    once: two threads move DRAM about twice as fast as one (bench/README.md, transfer). A batch
    small enough for the event loop has one part copied there, beside one copy thread, since
    waking a second parked thread costs more than it saves; a larger one leaves the loop free
    and uses the copy threads only."""
    served = segment_factory("served", NUM * SIZE)
    server = TransferEngine(DictResolver(), TransferConfig(node="server"))
    await server.start()
    server.register(served)
    client = await engine_factory(
        DictResolver({"served": server.descriptor("served")}),
        transports=(TransportKind.SHM,),
        shm_parallel_bytes=NUM * SIZE,
        shm_parallel_entry_bytes=NUM * SIZE,
        shm_copy_threads=2,
        shm_inline_bytes=NUM * SIZE if is_inline else NUM * SIZE - 1,
    )
    local = segment_factory("local", NUM * SIZE)
    client.register(local)
    local.array()[:] = np.random.default_rng(3).integers(0, 255, NUM * SIZE, dtype=np.uint8)
    if name == "back-to-back-runs":  # one entry: a run, not a row copy
        entries = [TransferEntry(Op.WRITE, "local", 0, "served", 0, NUM * SIZE)]
    else:
        local_offsets, remote_offsets, length = _layout(name)
        entries = [
            TransferEntry(Op.WRITE, "local", lo, "served", ro, length)
            for lo, ro in zip(local_offsets, remote_offsets)
        ]
    threads = []
    barrier = threading.Barrier(2, timeout=10)  # broken if one thread copies both parts
    owner, method = copy_name.split(".")
    cls = RowCopy if owner == "RowCopy" else shm_transport._Copier
    original = getattr(cls, method)

    def spy(self, *args):
        threads.append(threading.get_ident())
        barrier.wait()
        return original(self, *args)

    monkeypatch.setattr(cls, method, spy)
    try:
        (await client.transfer(entries, timeout=10)).raise_for_errors()
    finally:
        await server.close()
    for entry in entries:
        start, stop = entry.remote_offset, entry.remote_offset + entry.length
        local_stop = entry.local_offset + entry.length
        assert np.array_equal(
            served.array()[start:stop], local.array()[entry.local_offset : local_stop]
        )
    assert len(set(threads)) == 2
    assert (threading.get_ident() in threads) is is_inline
