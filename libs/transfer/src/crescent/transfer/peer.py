"""A process that only serves segments: the remote side for tests, benchmarks and
debugging a data path by hand.

    python -m crescent.transfer.peer --segment a:64MiB --segment b:4KiB

creates the segments (zero-filled), registers them, prints their descriptors as one JSON
line (a list), and serves them until its stdin closes, so it never outlives the process
that started it with a pipe.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from contextlib import ExitStack

import msgspec

from crescent.transfer.config import TransferConfig, TransportKind
from crescent.transfer.engine import TransferEngine
from crescent.transfer.resolver import DictResolver
from crescent.transfer.segment import ShmSegment

_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}


def parse_size(text: str) -> int:
    """'4096', '64KiB', '16MiB', '1GiB' -> bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if match is None or match.group(2).upper() not in _UNITS:
        raise ValueError(f"bad size {text!r}; use e.g. 4096, 64KiB, 16MiB, 1GiB")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def parse_segment(text: str) -> tuple[str, int]:
    """'name:size' -> (name, bytes)."""
    name, sep, size = text.rpartition(":")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME:SIZE, got {text!r}")
    try:
        return name, parse_size(size)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m crescent.transfer.peer", description=__doc__)
    parser.add_argument("--segment", type=parse_segment, action="append", required=True)
    parser.add_argument("--node", default="peer")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--transports",
        default=None,
        help="comma-separated, e.g. shm,tcp (default: all that can run here)",
    )
    return parser


async def serve(args: argparse.Namespace) -> None:
    transports = None
    if args.transports:
        transports = tuple(TransportKind(name) for name in args.transports.split(","))
    config = TransferConfig(
        node=args.node, transports=transports, tcp_host=args.host, tcp_port=args.port
    )
    with ExitStack() as stack:
        async with TransferEngine(DictResolver(), config) as engine:
            descriptors = [
                engine.register(stack.enter_context(ShmSegment.create(name, size)))
                for name, size in args.segment
            ]
            sys.stdout.buffer.write(msgspec.json.encode(descriptors) + b"\n")
            sys.stdout.flush()
            await asyncio.to_thread(sys.stdin.buffer.read)


def main(argv: list[str] | None = None) -> None:
    asyncio.run(serve(build_parser().parse_args(argv)))


if __name__ == "__main__":
    main()
