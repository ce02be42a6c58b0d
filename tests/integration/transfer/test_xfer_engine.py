"""TransferEngine behaviour beyond the transport contract: lifecycle, routing, stale
descriptors, a server that survives bad clients, concurrency, and a responsive loop."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from crescent.transfer import (
    DictResolver,
    EngineNotRunning,
    EngineStatus,
    NoRoute,
    Op,
    ResolverFailed,
    SegmentDescriptor,
    SegmentNotFound,
    ShmEndpoint,
    ShmSegment,
    TcpEndpoint,
    TransferConfig,
    TransferEngine,
    TransferEntry,
    TransferTimeout,
    TransportKind,
    TransportUnavailable,
)
from crescent.transfer.transports.rdma import unavailable_reason
from crescent.transfer.transports.tcp_wire import (
    REPLY,
    Status,
    WireOp,
    decode_reply,
    encode_request,
)

MiB = 1 << 20
README = Path(__file__).parents[3] / "libs" / "transfer" / "README.md"


async def test_lifecycle_and_misuse() -> None:
    engine = TransferEngine(DictResolver(), TransferConfig(transports=(TransportKind.TCP,)))
    with pytest.raises(EngineNotRunning):
        await engine.transfer([], timeout=1)
    async with engine:
        assert engine.status is EngineStatus.RUNNING
        assert engine.transports == (TransportKind.TCP,)
        assert (await engine.transfer([], timeout=1)).is_ok
        with ShmSegment.create("a", 4096) as segment:
            descriptor = engine.register(segment)
            assert descriptor.endpoint(TcpEndpoint) is not None
            assert descriptor.endpoint(ShmEndpoint) is None  # shm transport not running
            with pytest.raises(ValueError):
                engine.register(segment)
            engine.unregister("a")
            with pytest.raises(SegmentNotFound):
                engine.descriptor("a")
    assert engine.status is EngineStatus.CLOSED
    await engine.close()  # idempotent
    with pytest.raises(EngineNotRunning):
        await engine.start()


async def test_explicit_transport_that_cannot_run_fails_start() -> None:
    if unavailable_reason() is None:
        pytest.skip("this machine has RDMA")
    engine = TransferEngine(DictResolver(), TransferConfig(transports=(TransportKind.RDMA,)))
    with pytest.raises(TransportUnavailable, match="rdma"):
        await engine.start()


async def test_route_prefers_shm_on_the_same_host_and_tcp_elsewhere(peer_factory, engine_factory):
    peer = peer_factory({"remote": "1MiB"})
    descriptor = peer.descriptors["remote"]
    engine = await engine_factory(peer.resolver)
    assert engine.route(descriptor) is TransportKind.SHM
    elsewhere = msgspec.structs.replace(descriptor, host_id="another-kernel")
    assert engine.route(elsewhere) is TransportKind.TCP
    shm_only = await engine_factory(peer.resolver, transports=(TransportKind.SHM,))
    with pytest.raises(NoRoute):
        shm_only.route(elsewhere)


async def test_batches_to_a_peer_on_another_host_run_over_tcp(
    peer_factory, engine_factory, segment_factory
) -> None:
    peer = peer_factory({"remote": "4MiB"})
    far = {
        name: msgspec.structs.replace(d, host_id="another-kernel")
        for name, d in peer.descriptors.items()
    }
    engine = await engine_factory(DictResolver(far))
    local = segment_factory("local", 8 * MiB)
    engine.register(local)
    local.array()[: 4 * MiB] = np.arange(4 * MiB, dtype=np.uint64).view(np.uint8)[: 4 * MiB]
    batch = [
        TransferEntry(Op.WRITE, "local", 0, "remote", 0, 4 * MiB),
    ]
    (await engine.transfer(batch, timeout=10)).raise_for_errors()
    read = [TransferEntry(Op.READ, "local", 4 * MiB, "remote", 0, 4 * MiB)]
    (await engine.transfer(read, timeout=10)).raise_for_errors()
    assert np.array_equal(local.array()[4 * MiB :], local.array()[: 4 * MiB])
    assert engine.transport(TransportKind.TCP).pool(*_tcp(far["remote"])).num_connects >= 1


def _tcp(descriptor: SegmentDescriptor) -> tuple[str, int]:
    endpoint = descriptor.endpoint(TcpEndpoint)
    assert endpoint is not None
    return endpoint.host, endpoint.port


async def test_descriptor_without_a_usable_endpoint_fails_with_no_route(
    engine_factory, segment_factory
) -> None:
    lonely = SegmentDescriptor("lonely", "n", "another-kernel", 4096)
    engine = await engine_factory(DictResolver({"lonely": lonely}))
    engine.register(segment_factory("local", 4096))
    result = await engine.transfer([TransferEntry(Op.READ, "local", 0, "lonely", 0, 10)], timeout=5)
    assert isinstance(result.errors[0], NoRoute)


@pytest.mark.parametrize("kind", [TransportKind.SHM, TransportKind.TCP])
async def test_unregistered_segment_is_not_served_any_more(
    kind, engine_factory, segment_factory
) -> None:
    resolver = DictResolver()
    owner = await engine_factory(resolver, transports=(kind,))
    client = await engine_factory(resolver, transports=(kind,))
    remote = segment_factory("remote", MiB)
    resolver.publish(owner.register(remote))
    client.register(segment_factory("local", MiB))
    entry = TransferEntry(Op.WRITE, "local", 0, "remote", 0, 1024)
    (await client.transfer([entry], timeout=5)).raise_for_errors()
    owner.unregister("remote")
    if kind is TransportKind.SHM:
        remote.close()  # the owner frees the memory; its shm file goes with it
    error = (await client.transfer([entry], timeout=5)).errors[0]
    assert isinstance(error, (SegmentNotFound, NoRoute))
    assert error.segment == "remote"


async def test_server_refuses_bad_requests_and_keeps_serving(
    peer_factory, engine_factory, segment_factory
) -> None:
    peer = peer_factory({"remote": "1MiB"})
    host, port = _tcp(peer.descriptors["remote"])
    segment_id = peer.descriptors["remote"].endpoint(TcpEndpoint).segment_id
    with socket.create_connection((host, port), timeout=5) as sock:
        # Unknown segment: refused with a message, connection stays usable.
        sock.sendall(encode_request(WireOp.READ, 1, 999, [0], [16]))
        assert _reply(sock).status is Status.UNKNOWN_SEGMENT
        # A write with one entry out of bounds: its payload is skipped, the request refused.
        request = encode_request(WireOp.WRITE, 2, segment_id, [0, MiB - 4], [4, 8])
        sock.sendall(request + b"x" * 12)
        assert _reply(sock).status is Status.OUT_OF_BOUNDS
        sock.sendall(encode_request(WireOp.WRITE, 3, segment_id, [0, 100], [2, 2]) + b"good")
        assert _reply(sock).status is Status.OK
        sock.sendall(encode_request(WireOp.READ, 4, segment_id, [100, 0], [2, 2]))
        reply = _reply(sock)
        assert (reply.status, reply.seq, _recv(sock, 4)) == (Status.OK, 4, b"odgo")
        assert bytes(_recv_nothing_more(sock)) == b""
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(b"garbage that is not a request header")
        try:  # a broken stream is closed (reset: our extra bytes were never read)...
            assert sock.recv(1) == b""
        except ConnectionResetError:
            pass
    # ...and the server still serves everyone else.
    engine = await engine_factory(peer.resolver, transports=(TransportKind.TCP,))
    local = segment_factory("local", MiB)
    engine.register(local)
    reads = [TransferEntry(Op.READ, "local", 0, "remote", 0, 2)]
    reads.append(TransferEntry(Op.READ, "local", 2, "remote", 100, 2))
    (await engine.transfer(reads, timeout=5)).raise_for_errors()
    assert bytes(local.array()[:4]) == b"good"


def _reply(sock: socket.socket):
    reply = decode_reply(_recv(sock, REPLY.size))
    if reply.status is not Status.OK:
        assert _recv(sock, reply.length)  # the error message
    return reply


def _recv_nothing_more(sock: socket.socket) -> bytes:
    """What else the server sent within a moment: nothing, for a request fully answered."""
    sock.setblocking(False)
    try:
        return sock.recv(1)
    except BlockingIOError:
        return b""
    finally:
        sock.setblocking(True)
        sock.settimeout(5)


def _recv(sock: socket.socket, num_bytes: int) -> bytes:
    data = b""
    while len(data) < num_bytes:
        chunk = sock.recv(num_bytes - len(data))
        assert chunk, "connection closed"
        data += chunk
    return data


@pytest.mark.parametrize("kind", [TransportKind.SHM, TransportKind.TCP])
async def test_concurrent_batches_to_one_peer(kind, peer_factory, engine_factory, segment_factory):
    peer = peer_factory({"remote": "32MiB"})
    engine = await engine_factory(peer.resolver, transports=(kind,))
    local = segment_factory("local", 64 * MiB)
    engine.register(local)
    memory = local.array()
    memory[: 32 * MiB] = np.random.default_rng(3).random(4 * MiB).view(np.uint8)
    writes = [
        [TransferEntry(Op.WRITE, "local", o, "remote", o, 4 * MiB)]
        for o in range(0, 32 * MiB, 4 * MiB)
    ]
    results = await asyncio.gather(*(engine.transfer(w, timeout=10) for w in writes))
    assert all(r.is_ok for r in results)
    reads = [
        [TransferEntry(Op.READ, "local", 32 * MiB + o, "remote", o, 4 * MiB)]
        for o in range(0, 32 * MiB, 4 * MiB)
    ]
    results = await asyncio.gather(*(engine.transfer(r, timeout=10) for r in reads))
    assert all(r.is_ok for r in results)
    assert np.array_equal(memory[32 * MiB :], memory[: 32 * MiB])


@pytest.mark.parametrize("kind", [TransportKind.SHM, TransportKind.TCP])
async def test_event_loop_stays_responsive_during_a_large_batch(
    kind, peer_factory, engine_factory, segment_factory
) -> None:
    peer = peer_factory({"remote": "64MiB"})
    engine = await engine_factory(peer.resolver, transports=(kind,))
    engine.register(segment_factory("local", 64 * MiB))
    batch = [TransferEntry(Op.WRITE, "local", 0, "remote", 0, 64 * MiB)] * 16  # 1 GiB
    worst_lag = 0.0
    task = asyncio.create_task(engine.transfer(batch, timeout=30))
    while not task.done():
        before = time.monotonic()
        await asyncio.sleep(0.001)
        worst_lag = max(worst_lag, time.monotonic() - before - 0.001)
    (await task).raise_for_errors()
    assert worst_lag < 0.05, f"event loop stalled for {worst_lag * 1000:.1f} ms"


async def test_readme_example_runs(peer_factory) -> None:
    """The README's example, run against a peer that serves n2/kv."""
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL).group(1)
    peer = peer_factory({"n2/kv": "1MiB"})
    namespace: dict[str, object] = {}
    exec(compile(code, str(README), "exec"), namespace)
    await namespace["copy_one"](peer.resolver)  # type: ignore[operator]


@pytest.mark.parametrize("kind", [TransportKind.SHM, TransportKind.TCP])
async def test_cancelled_batch_stops_and_the_engine_goes_on(
    kind, peer_factory, engine_factory, segment_factory
) -> None:
    peer = peer_factory({"remote": "16MiB"})
    engine = await engine_factory(peer.resolver, transports=(kind,))
    engine.register(segment_factory("local", 16 * MiB))
    batch = [TransferEntry(Op.WRITE, "local", 0, "remote", 0, 16 * MiB)] * 512  # 8 GiB
    task = asyncio.create_task(engine.transfer(batch, timeout=60))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    started = time.monotonic()
    small = [TransferEntry(Op.READ, "local", 0, "remote", 0, MiB)]
    (await engine.transfer(small, timeout=10)).raise_for_errors()
    assert time.monotonic() - started < 2.0  # the cancelled batch's threads let go


async def test_a_failing_resolver_fails_its_entries(engine_factory, segment_factory) -> None:
    def broken(name: str) -> SegmentDescriptor:
        raise ConnectionError("etcd is down")

    engine = await engine_factory(broken)
    engine.register(segment_factory("local", 4096))
    result = await engine.transfer([TransferEntry(Op.READ, "local", 0, "x", 0, 1)], timeout=5)
    assert isinstance(result.errors[0], ResolverFailed)
    assert result.errors[0].segment == "x" and "etcd is down" in result.errors[0].cause


async def test_a_transport_that_hangs_still_times_out(
    monkeypatch, peer_factory, engine_factory, segment_factory
) -> None:
    """The engine's own bound on a batch, for a transport that breaks its contract."""
    from crescent.transfer.engine import GRACE_S
    from crescent.transfer.transports.shm import ShmTransport

    async def hang(self, items, deadline):
        await asyncio.sleep(3600)

    peer = peer_factory({"remote": "1MiB"})
    engine = await engine_factory(peer.resolver, transports=(TransportKind.SHM,))
    engine.register(segment_factory("local", MiB))
    monkeypatch.setattr(ShmTransport, "execute", hang)
    started = time.monotonic()
    result = await engine.transfer(
        [TransferEntry(Op.READ, "local", 0, "remote", 0, 8)], timeout=0.2
    )
    assert time.monotonic() - started < 0.2 + GRACE_S + 0.5
    assert isinstance(result.errors[0], TransferTimeout)
