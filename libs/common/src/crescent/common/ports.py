"""Free TCP ports for services and test clusters, picked below the kernel's ephemeral range.

A port found free is handed to a process that binds it later, seconds later for a worker that
starts its engine first. A port the kernel chose (bind to port 0) comes from its ephemeral
range, which is also where every outgoing connection and every other bind-to-0 takes its port
from (vLLM's internal sockets, NATS and etcd clients), so one of those could take it in
between. A port below that range is only ever taken by someone who asks for it by number; one
process never hands out the same one twice. A process that listens itself binds at once
(`listening_socket`) and needs no pick at all.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000
TRIES = 64
# Ports this process has handed out: a cluster picks several before any of them is bound, and
# a random pick may repeat an earlier one that nothing listens on yet.
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, below the ephemeral range where there is room (the
    kernel's choice otherwise)."""
    highest = _ephemeral_start() - 1
    for _ in range(TRIES if highest > LOWEST_PORT else 0):
        port = random.randint(LOWEST_PORT, highest)
        if port in _handed_out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port), ready to listen on; port 0 takes one the kernel
    picks, held from this moment, so nothing can take it between the pick and the listen."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
