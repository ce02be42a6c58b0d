"""Settings of a `TransferEngine`; plain data, so services build it from their own config."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field

from crescent.transfer.plan import DEFAULT_SLICE_BYTES


class TransportKind(enum.Enum):
    SHM = "shm"
    TCP = "tcp"
    RDMA = "rdma"


# Preference order when several transports reach a peer: memcpy beats one-sided verbs,
# which beat sockets.
ALL_TRANSPORTS = (TransportKind.SHM, TransportKind.RDMA, TransportKind.TCP)


def parse_transports(text: str) -> tuple[TransportKind, ...] | None:
    """`"tcp"`, `"shm,tcp"`, … → those transports in that order; `""` → None (every transport
    that can run here). ValueError names what is wrong."""
    names = [name.strip().lower() for name in text.split(",") if name.strip()]
    if not names:
        return None
    known = {kind.value: kind for kind in TransportKind}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(f"unknown transport {', '.join(unknown)}: choose from {', '.join(known)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a transport is named twice in {text!r}")
    return tuple(known[name] for name in names)


def default_num_connections() -> int:
    """Lanes to one peer: two, so one lane sends while the other waits for its reply; more
    only where there are cores for them (each lane's bytes are copied by the kernel on the
    lane's own thread, so lanes beyond the cores take turns), up to four. On two cores, two
    lanes matched one plain loopback socket from 1 MiB entries in 30 of 36 measured cases,
    four lanes in 20 of 36 (bench/README.md, transfer)."""
    return max(2, min(4, os.cpu_count() or 1))


@dataclass(frozen=True, slots=True)
class TransferConfig:
    """How an engine serves its segments and reaches its peers.

    `transports=None` means every transport that can run here (rdma only with pyverbs and
    a device); an explicit tuple means exactly those, in that order of preference, and
    `start()` fails with TransportUnavailable if one of them cannot run.
    """

    node: str = "local"
    transports: tuple[TransportKind, ...] | None = None
    tcp_host: str = "127.0.0.1"
    tcp_advertise_host: str | None = None
    tcp_port: int = 0
    num_connections: int = field(default_factory=default_num_connections)
    slice_bytes: int = DEFAULT_SLICE_BYTES
    max_group_slices: int = 1024
    max_reconnects: int = 3
    connect_timeout: float = 2.0
    server_io_timeout: float = 30.0
    server_idle_timeout: float = 300.0
    shm_inline_bytes: int = 16 << 20
    shm_parallel_entry_bytes: int = 2 << 20
    shm_parallel_bytes: int = 4 << 20
    shm_copy_threads: int = 2
    max_threads: int = 16
    close_timeout: float = 10.0
    rdma_device: str | None = None
    rdma_port: int = 1
    rdma_gid_index: int = 0

    def __post_init__(self) -> None:
        if self.num_connections < 1:
            raise ValueError("num_connections must be >= 1")
        if self.slice_bytes < 1 or self.max_group_slices < 1:
            raise ValueError("slice_bytes and max_group_slices must be >= 1")
        if self.max_threads < max(self.num_connections, self.shm_copy_threads):
            raise ValueError("max_threads must cover num_connections and shm_copy_threads")
