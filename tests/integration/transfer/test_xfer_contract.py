"""The transport contract, run against every transport (rdma is skipped without a device):
the remote segment lives in a peer process, the client engine uses only the transport
under test."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest

from crescent.transfer import (
    BadEntry,
    Op,
    OutOfBounds,
    PeerUnreachable,
    SegmentNotFound,
    TransferEntry,
    TransferTimeout,
    TransportKind,
)

MiB = 1 << 20
SEGMENT_BYTES = 160 * MiB
MAX_ENTRY_BYTES = 64 * MiB
NUM_BATCHES = 1000
BATCH_TIMEOUT_S = 20.0


def noise(rng: np.random.Generator, num_bytes: int) -> np.ndarray:
    """Bytes that differ everywhere, fast (random float64 bit patterns)."""
    return rng.random(num_bytes // 8).view(np.uint8)


def random_batch(rng: np.random.Generator, size: int) -> list[TransferEntry]:
    """1-4 entries of 1 B - 64 MiB (log-uniform), mixed ops, laid out at random, disjoint
    offsets in both segments (overlapping entries of one batch would race)."""
    lengths: list[int] = []
    for _ in range(rng.integers(1, 5)):
        length = int(math.exp(rng.uniform(0, math.log(MAX_ENTRY_BYTES))))
        if sum(lengths) + length > size:
            break
        lengths.append(length)
    ops = [Op.READ if rng.random() < 0.5 else Op.WRITE for _ in lengths]
    local = _disjoint_offsets(rng, lengths, size)
    remote = _disjoint_offsets(rng, lengths, size)
    return [
        TransferEntry(op, "local", lo, "remote", ro, n)
        for op, lo, ro, n in zip(ops, local, remote, lengths, strict=True)
    ]


def _disjoint_offsets(rng: np.random.Generator, lengths: list[int], size: int) -> list[int]:
    order = rng.permutation(len(lengths))
    slack = size - sum(lengths)
    gaps = np.sort(rng.integers(0, slack + 1, len(lengths)))
    offsets = [0] * len(lengths)
    position = 0
    previous_gap = 0
    for rank, index in enumerate(order):
        position += int(gaps[rank]) - previous_gap
        previous_gap = int(gaps[rank])
        offsets[index] = position
        position += lengths[index]
    return offsets


async def test_random_batches_are_byte_exact(
    transport_kind, peer_factory, engine_factory, segment_factory
) -> None:
    peer = peer_factory({"remote": str(SEGMENT_BYTES)})
    engine = await engine_factory(peer.resolver, transports=(transport_kind,))
    local = segment_factory("local", SEGMENT_BYTES)
    engine.register(local)
    rng = np.random.default_rng(20240611)
    memory = local.array()
    memory[:] = noise(rng, SEGMENT_BYTES)
    shadow = np.zeros(SEGMENT_BYTES, dtype=np.uint8)  # what the remote must hold
    for _ in range(NUM_BATCHES):
        entries = random_batch(rng, SEGMENT_BYTES)
        result = await engine.transfer(entries, timeout=BATCH_TIMEOUT_S)
        result.raise_for_errors()
        for e in entries:
            if e.op is Op.READ:
                expected = shadow[e.remote_offset : e.remote_offset + e.length]
                got = memory[e.local_offset : e.local_offset + e.length]
                assert np.array_equal(got, expected), f"read {e} returned wrong bytes"
        for e in entries:
            if e.op is Op.WRITE:
                shadow[e.remote_offset : e.remote_offset + e.length] = memory[
                    e.local_offset : e.local_offset + e.length
                ]
    # Every written byte landed: read the whole remote back in slices of the local one.
    step = 32 * MiB
    for start in range(0, SEGMENT_BYTES, step):
        entry = TransferEntry(Op.READ, "local", 0, "remote", start, step)
        (await engine.transfer([entry], timeout=BATCH_TIMEOUT_S)).raise_for_errors()
        assert np.array_equal(memory[:step], shadow[start : start + step])


def big_batch(op: Op, num_entries: int, entry_bytes: int) -> list[TransferEntry]:
    """Many entries over the same ranges: lots of bytes moved with little memory."""
    return [TransferEntry(op, "local", 0, "remote", 0, entry_bytes) for _ in range(num_entries)]


async def test_peer_killed_mid_batch_fails_cleanly(
    transport_kind, peer_factory, engine_factory, segment_factory
) -> None:
    peer = peer_factory({"remote": "16MiB"})
    engine = await engine_factory(peer.resolver, transports=(transport_kind,))
    engine.register(segment_factory("local", 16 * MiB))
    timeout = 15.0
    batch = big_batch(Op.WRITE, 1024, 16 * MiB)  # 16 GiB: far longer than the kill delay
    started = time.monotonic()
    task = asyncio.create_task(engine.transfer(batch, timeout=timeout))
    await asyncio.sleep(0.05)
    assert not task.done(), "batch finished before the peer could be killed"
    peer.kill()
    result = await task
    elapsed = time.monotonic() - started
    assert elapsed < timeout
    assert not result.is_ok
    with pytest.raises(PeerUnreachable) as info:
        result.raise_for_errors()
    assert info.value.segment == "remote"
    assert info.value.peer
    # The failure is prompt, not the deadline: every failed entry names the dead peer.
    assert all(isinstance(error, PeerUnreachable) for _, error in result.failed())
    # And the engine stays usable: the next batch fails fast too.
    again = await engine.transfer(big_batch(Op.READ, 1, MiB), timeout=timeout)
    assert isinstance(again.errors[0], PeerUnreachable)


async def test_dropped_connection_is_retried(
    transport_kind, peer_factory, engine_factory, segment_factory
) -> None:
    if transport_kind is TransportKind.SHM:
        pytest.skip("shm moves bytes without connections: nothing to drop")
    size = 128 * MiB
    peer = peer_factory({"remote": str(size)})
    engine = await engine_factory(peer.resolver, transports=(transport_kind,))
    local = segment_factory("local", 2 * size)
    engine.register(local)
    memory = local.array()
    memory[:size] = noise(np.random.default_rng(7), size)
    transport = engine.transport(transport_kind)
    entries = [
        TransferEntry(Op.WRITE, "local", offset, "remote", offset, 4 * MiB)
        for offset in range(0, size, 4 * MiB)
    ]
    for _ in range(2):  # the second run only starts after the first drop is seen
        task = asyncio.create_task(engine.transfer(entries, timeout=20.0))
        dropped = await _drop_one_connection(transport, peer.descriptors["remote"], task)
        (await task).raise_for_errors()
        if dropped:
            break
    assert dropped, "no connection was busy long enough to be dropped"
    assert transport.num_retries >= 1
    read_back = TransferEntry(Op.READ, "local", size, "remote", 0, size)
    (await engine.transfer([read_back], timeout=20.0)).raise_for_errors()
    assert np.array_equal(memory[size:], memory[:size])


async def _drop_one_connection(transport, descriptor, task: asyncio.Task) -> bool:
    """Shut down one busy connection of the running batch, like a network fault would."""
    pool = transport.pool(*_peer_address(descriptor))
    deadline = time.monotonic() + 5.0
    while not task.done() and time.monotonic() < deadline:
        busy = pool.busy()
        if busy:
            busy[0].abort()
            return True
        await asyncio.sleep(0.0005)
    return False


def _peer_address(descriptor) -> tuple[str, int]:
    from crescent.transfer import RdmaEndpoint, TcpEndpoint

    tcp = descriptor.endpoint(TcpEndpoint)
    if tcp is not None:
        return tcp.host, tcp.port
    rdma = descriptor.endpoint(RdmaEndpoint)
    return rdma.handshake_host, rdma.handshake_port


async def test_deadline_fires(
    transport_kind, peer_factory, engine_factory, segment_factory
) -> None:
    peer = peer_factory({"remote": "16MiB"})
    engine = await engine_factory(peer.resolver, transports=(transport_kind,))
    engine.register(segment_factory("local", 16 * MiB))
    timeout = 0.2
    started = time.monotonic()
    result = await engine.transfer(big_batch(Op.WRITE, 1024, 16 * MiB), timeout=timeout)
    elapsed = time.monotonic() - started
    assert elapsed < timeout + 0.5
    assert not result.is_ok
    assert all(isinstance(error, TransferTimeout) for _, error in result.failed())
    with pytest.raises(asyncio.TimeoutError):
        result.raise_for_errors()
    # The transport recovered: the next batch runs normally.
    (await engine.transfer(big_batch(Op.READ, 2, MiB), timeout=10.0)).raise_for_errors()


async def test_bad_input_fails_only_its_entry(
    transport_kind, peer_factory, engine_factory, segment_factory
) -> None:
    peer = peer_factory({"remote": "1MiB"})
    engine = await engine_factory(peer.resolver, transports=(transport_kind,))
    local = segment_factory("local", MiB)
    engine.register(local)
    local.array()[:4096] = 42
    write = TransferEntry(Op.WRITE, "local", 0, "remote", 0, 4096)
    (await engine.transfer([write], timeout=10.0)).raise_for_errors()
    entries = [
        TransferEntry(Op.READ, "local", 8192, "remote", 0, 4096),
        TransferEntry(Op.READ, "local", 0, "nowhere", 0, 16),
        TransferEntry(Op.READ, "missing-local", 0, "remote", 0, 16),
        TransferEntry(Op.READ, "local", 0, "remote", MiB - 8, 16),
        TransferEntry(Op.WRITE, "local", MiB - 8, "remote", 0, 16),
        TransferEntry(Op.READ, "local", 0, "remote", 0, -1),
        TransferEntry(Op.READ, "local", -5, "remote", 0, 1),
        TransferEntry(Op.READ, "local", 16384, "remote", 0, 0),
    ]
    result = await engine.transfer(entries, timeout=10.0)
    errors = result.errors
    assert errors[0] is None and errors[7] is None
    assert isinstance(errors[1], SegmentNotFound) and errors[1].segment == "nowhere"
    assert isinstance(errors[2], SegmentNotFound) and errors[2].segment == "missing-local"
    assert isinstance(errors[3], OutOfBounds) and errors[3].segment == "remote"
    assert isinstance(errors[4], OutOfBounds) and errors[4].segment == "local"
    assert isinstance(errors[5], BadEntry)
    assert isinstance(errors[6], BadEntry)
    assert result.num_failed == 6
    assert np.all(local.array()[8192 : 8192 + 4096] == 42)
    # The peer keeps serving after refusing.
    (await engine.transfer([write, entries[0]], timeout=10.0)).raise_for_errors()
