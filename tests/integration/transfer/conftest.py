"""Fixtures for crescent.transfer integration tests: a serving peer in another process
(`python -m crescent.transfer.peer`), client engines, and local segments."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import msgspec
import pytest
import pytest_asyncio

from crescent.transfer import (
    DictResolver,
    SegmentDescriptor,
    ShmEndpoint,
    ShmSegment,
    TransferConfig,
    TransferEngine,
    TransportKind,
)
from crescent.transfer.transports.rdma import unavailable_reason

PEER_START_TIMEOUT_S = 20.0


@dataclass
class Peer:
    """A serving process and the descriptors of its segments."""

    proc: subprocess.Popen[bytes]
    descriptors: dict[str, SegmentDescriptor]

    @property
    def resolver(self) -> DictResolver:
        return DictResolver(self.descriptors)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        # A killed peer cannot unlink its shm files; do it for it.
        for descriptor in self.descriptors.values():
            endpoint = descriptor.endpoint(ShmEndpoint)
            if endpoint is not None:
                try:
                    os.unlink(f"/dev/shm/{endpoint.shm_name}")
                except FileNotFoundError:
                    pass


def start_peer(segments: dict[str, str]) -> Peer:
    args = [sys.executable, "-m", "crescent.transfer.peer", "--node", "peer"]
    for name, size in segments.items():
        args += ["--segment", f"{name}:{size}"]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], PEER_START_TIMEOUT_S)
    if not ready:
        proc.kill()
        raise RuntimeError("peer process did not print its descriptors in time")
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RuntimeError(f"peer process exited with {proc.returncode}")
    descriptors = msgspec.json.decode(line, type=list[SegmentDescriptor])
    return Peer(proc, {d.name: d for d in descriptors})


@pytest.fixture
def peer_factory() -> Iterator[Callable[[dict[str, str]], Peer]]:
    """Starts peers (`{"name": "64MiB"}`) and stops them, and their shm files, after."""
    peers: list[Peer] = []

    def factory(segments: dict[str, str]) -> Peer:
        peer = start_peer(segments)
        peers.append(peer)
        return peer

    yield factory
    for peer in peers:
        peer.stop()


@pytest.fixture(params=["shm", "tcp", "rdma"])
def transport_kind(request: pytest.FixtureRequest) -> TransportKind:
    """Every transport; those that cannot run here are skipped, saying why."""
    kind = TransportKind(request.param)
    if kind is TransportKind.RDMA:
        reason = unavailable_reason()
        if reason is not None:
            pytest.skip(f"rdma transport: {reason}")
    return kind


@pytest_asyncio.fixture
async def engine_factory() -> AsyncIterator[Callable[..., TransferEngine]]:
    """Builds started client engines; all are closed after the test."""
    engines: list[TransferEngine] = []

    async def factory(resolver: object, **config: object) -> TransferEngine:
        engine = TransferEngine(resolver, TransferConfig(node="client", **config))  # type: ignore[arg-type]
        await engine.start()
        engines.append(engine)
        return engine

    yield factory
    for engine in engines:
        await engine.close()


@pytest.fixture
def segment_factory() -> Iterator[Callable[[str, int], ShmSegment]]:
    """Creates local shm segments, closed after the test."""
    segments: list[ShmSegment] = []

    def factory(name: str, size: int) -> ShmSegment:
        segment = ShmSegment.create(name, size)
        segments.append(segment)
        return segment

    yield factory
    for segment in segments:
        segment.close()
