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


def test_a_port_handed_out_is_not_handed_out_again(monkeypatch):
    if ports._ephemeral_start() <= ports.LOWEST_PORT:
        pytest.skip("no room below the ephemeral range")
    first = ports.free_port()
    picks = iter([first, first, first + 1 if first + 1 < ports._ephemeral_start() else first - 1])
    monkeypatch.setattr(ports.random, "randint", lambda low, high: next(picks))
    assert ports.free_port() != first


def test_a_listening_socket_on_port_0_holds_the_port_the_kernel_picked():
    with ports.listening_socket("127.0.0.1", 0) as held:
        port = held.getsockname()[1]
        assert port > 0
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))


def test_a_listening_socket_on_a_taken_port_is_refused():
    with ports.listening_socket("127.0.0.1", 0) as held:
        held.listen()
        with pytest.raises(OSError):
            ports.listening_socket("127.0.0.1", held.getsockname()[1])
