"""Free ports come from below the kernel's ephemeral range, where no bind-to-0 or outgoing
connection can take them between the pick and the bind."""

import socket

import pytest

from crescent.common import ports


def test_a_free_port_lies_below_the_ephemeral_range_and_can_be_bound():
    start = ports._ephemeral_start()
    if start <= ports.LOWEST_PORT:
        pytest.skip(f"the ephemeral range starts at {start}: no room below it")
    for _ in range(20):
        port = ports.free_port()
        assert ports.LOWEST_PORT <= port < start
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: ports.LOWEST_PORT)
    assert ports.free_port() > 0
