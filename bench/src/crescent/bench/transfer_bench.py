"""Data-plane benchmark: crescent.transfer's shm and tcp transports against their limits.

For each entry size the client writes batches of `size`-byte entries (16 MiB per batch, at
least one entry) from a local segment into a segment owned by ANOTHER process (spawned
here), and compares with the limit measured in the same run on the same memory:

- shm: numpy copies of the same sizes from the local segment into a mapping of the remote
  segment (the memcpy limit);
- tcp: one plain blocking socket over loopback sending the same bytes, entry by entry, to
  that other process, which receives them into the remote segment (the loopback limit).

Entries lie back to back on both sides (`shm-64KiB`: one 16 MiB region as 256 entries), and,
where a batch has several entries, also `scattered`: the remote offsets are a fixed random
permutation of the entry slots, as a store's free slots are, so no two entries are adjacent
in the remote segment; the limit copies to the same offsets.

GB/s is 1e9 bytes per second, from the median of `repeat` timed runs; runs of ours and of
the limit alternate, so that drift of a shared machine affects both alike.

    python -m crescent.bench.transfer_bench --json transfer.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

import msgspec
import numpy as np

from crescent.transfer import (
    DictResolver,
    Op,
    SegmentDescriptor,
    ShmEndpoint,
    ShmSegment,
    TransferConfig,
    TransferEngine,
    TransferEntry,
    TransportKind,
)
from crescent.transfer.segment import ShmMapping

KiB = 1 << 10
MiB = 1 << 20
DEFAULT_SIZES = [64 * KiB, MiB, 16 * MiB, 64 * MiB]
BATCH_BYTES = 16 * MiB
SERVER_START_TIMEOUT_S = 30.0
BATCH_TIMEOUT_S = 60.0
_SIZE = struct.Struct("<Q")


def run_transfer_bench(sizes: list[int] | None = None, repeat: int = 15) -> dict:
    """Measure every size on shm then tcp; returns {"bench": "transfer", "cases": [...]}."""
    sizes = sizes or DEFAULT_SIZES
    segment_bytes = max(_batch_shape(size)[0] * size for size in sizes)
    return asyncio.run(_run(sizes, repeat, segment_bytes))


def _batch_shape(size: int) -> tuple[int, int]:
    """(entries per batch, entry size)."""
    return max(1, BATCH_BYTES // size), size


async def _run(sizes: list[int], repeat: int, segment_bytes: int) -> dict:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    server = context.Process(target=_serve, args=(child, segment_bytes), daemon=True)
    server.start()
    try:
        if not parent.poll(SERVER_START_TIMEOUT_S):
            raise RuntimeError("benchmark server did not start in time")
        encoded, sink_port = parent.recv()
        remote = msgspec.msgpack.decode(encoded, type=SegmentDescriptor)
        cases = []
        with ShmSegment.create("bench/local", segment_bytes) as local:
            local.array()[:] = np.random.default_rng(0).random(segment_bytes // 8).view(np.uint8)
            cases += await _shm_cases(sizes, repeat, local, remote)
            cases += await _tcp_cases(sizes, repeat, local, remote, sink_port)
        return {"bench": "transfer", "cases": cases}
    finally:
        parent.close()
        server.join(10)
        if server.is_alive():
            server.kill()


async def _shm_cases(
    sizes: list[int], repeat: int, local: ShmSegment, remote: SegmentDescriptor
) -> list[dict]:
    endpoint = remote.endpoint(ShmEndpoint)
    assert endpoint is not None
    mapping = ShmMapping(endpoint.shm_name, remote.size, endpoint.device, endpoint.inode)
    src = local.array()
    dst = np.frombuffer(mapping.view, dtype=np.uint8)
    cases = []
    async with _client(remote, TransportKind.SHM, local) as engine:
        for size, slots in _layouts(sizes):
            num = len(slots)

            def memcpy(num: int = num, size: int = size, slots: list[int] = slots) -> None:
                for i in range(num):
                    to = slots[i] * size
                    np.copyto(dst[to : to + size], src[i * size : (i + 1) * size])

            ours, limit = await _time_pair(engine, remote.name, slots, size, memcpy, repeat)
            cases.append(_case(f"shm-{_label(size)}{_suffix(slots)}", num * size, ours, limit))
    mapping.close()
    return cases


async def _tcp_cases(
    sizes: list[int], repeat: int, local: ShmSegment, remote: SegmentDescriptor, sink_port: int
) -> list[dict]:
    cases = []
    view = local.view()
    with socket.create_connection(("127.0.0.1", sink_port), timeout=BATCH_TIMEOUT_S) as sock:
        async with _client(remote, TransportKind.TCP, local) as engine:
            for size, slots in _layouts(sizes):
                num = len(slots)

                def loopback(num: int = num, size: int = size) -> None:
                    sock.sendall(_SIZE.pack(num * size))
                    for i in range(num):
                        sock.sendall(view[i * size : (i + 1) * size])
                    if sock.recv(1) != b"\x01":
                        raise RuntimeError("loopback sink failed")

                ours, limit = await _time_pair(engine, remote.name, slots, size, loopback, repeat)
                cases.append(_case(f"tcp-{_label(size)}{_suffix(slots)}", num * size, ours, limit))
        sock.sendall(_SIZE.pack(0))
    return cases


def _layouts(sizes: list[int]) -> list[tuple[int, list[int]]]:
    """(entry size, remote slot of each entry): back to back, then scattered where a batch
    has several entries."""
    layouts = []
    for size in sizes:
        num, _ = _batch_shape(size)
        layouts.append((size, list(range(num))))
        if num > 1:
            layouts.append((size, [int(s) for s in np.random.default_rng(size).permutation(num)]))
    return layouts


def _suffix(slots: list[int]) -> str:
    return "" if slots == sorted(slots) else "-scattered"


class _client:
    """A client engine using one transport, with the local segment registered."""

    def __init__(self, remote: SegmentDescriptor, kind: TransportKind, local: ShmSegment):
        self._engine = TransferEngine(
            DictResolver({remote.name: remote}), TransferConfig(node="bench", transports=(kind,))
        )
        self._local = local

    async def __aenter__(self) -> TransferEngine:
        await self._engine.start()
        self._engine.register(self._local)
        return self._engine

    async def __aexit__(self, *exc: object) -> None:
        await self._engine.close()


async def _time_pair(
    engine: TransferEngine,
    remote: str,
    slots: list[int],
    size: int,
    limit: Callable[[], None],
    repeat: int,
) -> tuple[float, float]:
    """Median seconds of one batch of writes of `size` bytes, entry i from local slot i to
    remote slot `slots[i]`, and of one run of the limit on the same bytes. Runs alternate, so
    that the drift of a shared machine's memory and CPU speed hits both alike; the first pair
    warms up and is dropped."""
    entries = [
        TransferEntry(Op.WRITE, "bench/local", i * size, remote, slot * size, size)
        for i, slot in enumerate(slots)
    ]
    ours, limits = [], []
    for _ in range(repeat + 1):
        started = time.perf_counter()
        result = await engine.transfer(entries, timeout=BATCH_TIMEOUT_S)
        ours.append(time.perf_counter() - started)
        result.raise_for_errors()
        started = time.perf_counter()
        limit()
        limits.append(time.perf_counter() - started)
    return statistics.median(ours[1:]), statistics.median(limits[1:])


def _case(name: str, num_bytes: int, seconds: float, limit_seconds: float) -> dict:
    return {
        "case": name,
        "gbps": round(num_bytes / seconds / 1e9, 3),
        "limit_gbps": round(num_bytes / limit_seconds / 1e9, 3),
    }


def _label(size: int) -> str:
    if size % MiB == 0:
        return f"{size // MiB}MiB"
    if size % KiB == 0:
        return f"{size // KiB}KiB"
    return f"{size}B"


def _serve(conn: Connection, segment_bytes: int) -> None:
    """The other process: owns the remote segment, serves it with a transfer engine, and
    runs the loopback sink that receives plain-socket bytes into the same memory."""
    asyncio.run(_serve_async(conn, segment_bytes))


async def _serve_async(conn: Connection, segment_bytes: int) -> None:
    config = TransferConfig(node="bench-server", transports=(TransportKind.SHM, TransportKind.TCP))
    with ShmSegment.create("bench/remote", segment_bytes) as segment:
        async with TransferEngine(DictResolver(), config) as engine:
            descriptor = engine.register(segment)
            listener = socket.create_server(("127.0.0.1", 0))
            sink = threading.Thread(target=_sink, args=(listener, segment.view()), daemon=True)
            sink.start()
            conn.send((msgspec.msgpack.encode(descriptor), listener.getsockname()[1]))
            try:
                await asyncio.to_thread(conn.recv)
            except EOFError:
                pass
            listener.close()


def _sink(listener: socket.socket, memory: memoryview) -> None:
    """Receive `size`-prefixed byte runs into `memory` (wrapping), ack each with one byte."""
    sock, _ = listener.accept()
    header = bytearray(_SIZE.size)
    with sock:
        while True:
            _recv_into(sock, memoryview(header))
            (remaining,) = _SIZE.unpack(header)
            if remaining == 0:
                return
            while remaining:
                chunk = memory[: min(remaining, memory.nbytes)]
                _recv_into(sock, chunk)
                remaining -= chunk.nbytes
            sock.sendall(b"\x01")


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        num = sock.recv_into(view)
        if num == 0:
            raise EOFError("benchmark client went away")
        view = view[num:]


def format_table(report: dict) -> str:
    lines = [f"{'case':<22} {'GB/s':>8} {'limit GB/s':>11} {'% of limit':>11}"]
    for case in report["cases"]:
        share = 100 * case["gbps"] / case["limit_gbps"]
        lines.append(
            f"{case['case']:<22} {case['gbps']:>8.2f} {case['limit_gbps']:>11.2f} {share:>10.0f}%"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", metavar="FILE", help="also write the report here")
    parser.add_argument("--repeat", type=int, default=15, help="timed runs per case")
    parser.add_argument(
        "--sizes", help="entry sizes in bytes, comma-separated (default 64KiB,1MiB,16MiB,64MiB)"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    report = run_transfer_bench(sizes, repeat=args.repeat)
    print(format_table(report))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
