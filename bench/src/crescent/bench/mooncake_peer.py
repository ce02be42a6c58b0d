"""The Mooncake Store side of `crescent bench store`, run by the Mooncake venv's python.

It imports nothing of Crescent: Mooncake lives in its own venv (store_bench.py makes it), so
this file is run by path, never imported. Two roles, each its own process, so that the
bytes cross processes exactly as they do for Crescent's store:

  segment  contributes the global segment (the memory that holds the blocks) and waits for
           SIGTERM;
  client   contributes no segment and runs the workload from two registered buffers with
           batch_put_from / batch_get_into, Mooncake's zero-copy batch path (no staging
           copy through its local buffer), then writes its timings as JSON.

Both speak tcp on loopback only (MC_TCP_BIND_ADDRESS=127.0.0.1 in the environment) and find
each other by P2P handshake, so no metadata server is needed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
from pathlib import Path

from mooncake.store import MooncakeDistributedStore

HOST = "127.0.0.1"
METADATA = "P2PHANDSHAKE"
LOCAL_BUFFER_BYTES = 16 << 20  # staging for the unregistered put/get paths, unused here


def _connect(master: str, segment_bytes: int) -> MooncakeDistributedStore:
    store = MooncakeDistributedStore()
    code = store.setup(HOST, METADATA, segment_bytes, LOCAL_BUFFER_BYTES, "tcp", "", master)
    if code != 0:
        sys.exit(f"MooncakeDistributedStore.setup failed with code {code}")
    return store


def _write_atomically(path: Path, text: str) -> None:
    """The parent polls for `path`; a rename means it never reads a half-written file."""
    partial = path.with_suffix(".partial")
    partial.write_text(text)
    partial.rename(path)


def serve_segment(master: str, segment_bytes: int, ready: Path) -> None:
    # Blocked before setup, so Mooncake's threads inherit the mask and sigwait gets the signal.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    store = _connect(master, segment_bytes)
    _write_atomically(ready, "ready\n")
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    store.close()


def _address(buffer: bytearray) -> int:
    return ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))


def _check(op: str, codes: list[int], expected: int) -> None:
    bad = [code for code in codes if code != expected]
    if bad:
        raise RuntimeError(
            f"{op}: {len(bad)} of {len(codes)} blocks failed (first result {bad[0]})"
        )


def run_client(
    master: str, num_blocks: int, block_bytes: int, batch_blocks: int, repeat: int
) -> dict:
    """Same rounds as Crescent's side: one warm-up round, then `repeat` timed ones, each with
    new keys that are removed (untimed) afterwards; bytes are verified in the warm-up round."""
    store = _connect(master, 0)
    src = bytearray(os.urandom(num_blocks * block_bytes))
    dst = bytearray(len(src))
    src_at, dst_at = _address(src), _address(dst)
    for address, size in ((src_at, len(src)), (dst_at, len(dst))):
        if store.register_buffer(address, size) != 0:
            raise RuntimeError("register_buffer failed")
    batches = [
        range(start, min(start + batch_blocks, num_blocks))
        for start in range(0, num_blocks, batch_blocks)
    ]
    timings: dict[str, list[float]] = {"put_s": [], "get_s": []}
    for round_ in range(repeat + 1):
        keys = [f"r{round_}/b{i}" for i in range(num_blocks)]
        started = time.perf_counter()
        for batch in batches:
            codes = store.batch_put_from(
                [keys[i] for i in batch],
                [src_at + i * block_bytes for i in batch],
                [block_bytes] * len(batch),
            )
            _check("batch_put_from", codes, 0)
        put_s = time.perf_counter() - started
        started = time.perf_counter()
        for batch in batches:
            sizes = store.batch_get_into(
                [keys[i] for i in batch],
                [dst_at + i * block_bytes for i in batch],
                [block_bytes] * len(batch),
            )
            _check("batch_get_into", sizes, block_bytes)
        get_s = time.perf_counter() - started
        if round_ == 0:
            if dst != src:
                raise RuntimeError("Mooncake read back other bytes than it put")
        else:
            timings["put_s"].append(put_s)
            timings["get_s"].append(get_s)
        _check("batch_remove", store.batch_remove(keys, True), 0)
    for address in (src_at, dst_at):
        store.unregister_buffer(address)
    store.close()
    return timings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--master", required=True, help="mooncake_master's host:port")
    roles = parser.add_subparsers(dest="role", required=True)
    segment = roles.add_parser("segment")
    segment.add_argument("--segment-bytes", type=int, required=True)
    segment.add_argument(
        "--ready", type=Path, required=True, help="written once the segment is mounted"
    )
    client = roles.add_parser("client")
    for name in ("--num-blocks", "--block-bytes", "--batch-blocks", "--repeat"):
        client.add_argument(name, type=int, required=True)
    client.add_argument("--out", type=Path, required=True, help="where to write the timings (JSON)")
    args = parser.parse_args(argv)
    if os.environ.get("MC_TCP_BIND_ADDRESS") != HOST:
        sys.exit(f"set MC_TCP_BIND_ADDRESS={HOST}: the benchmark stays on loopback")
    if args.role == "segment":
        serve_segment(args.master, args.segment_bytes, args.ready)
    else:
        timings = run_client(
            args.master, args.num_blocks, args.block_bytes, args.batch_blocks, args.repeat
        )
        _write_atomically(args.out, json.dumps(timings))


if __name__ == "__main__":
    main()
