"""Fixtures shared by the integration tests: a NATS server with its monitoring endpoint, and a tcp
proxy that cuts links mid-batch for the data plane and the store."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator

import pytest

from crescent.cluster.infra import nats_spec
from crescent.cluster.processes import ManagedProcess
from crescent.common.ports import free_port


class CuttingProxy:
    """A real tcp proxy in front of (host, port) that drops every connection once it has
    forwarded `cut_after` bytes from the client: a link that breaks mid-batch, every time."""

    def __init__(self, host: str, port: int, cut_after: int) -> None:
        self._target = (host, port)
        self._cut_after = cut_after
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.num_cuts = 0
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target, timeout=5)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(
                target=self._forward, args=(client, upstream, True), daemon=True
            ).start()
            threading.Thread(
                target=self._forward, args=(upstream, client, False), daemon=True
            ).start()

    def _forward(self, source: socket.socket, sink: socket.socket, is_cut: bool) -> None:
        forwarded = 0
        try:
            while True:
                limit = self._cut_after - forwarded if is_cut else 1 << 16
                data = source.recv(min(limit, 1 << 16))
                if not data:
                    break
                sink.sendall(data)
                forwarded += len(data)
                if is_cut and forwarded >= self._cut_after:
                    with self._lock:
                        self.num_cuts += 1
                    break
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            sock.close()


@pytest.fixture
def cutting_proxy() -> Iterator[Callable[[str, int, int], CuttingProxy]]:
    """Starts CuttingProxy instances, closed after the test."""
    proxies: list[CuttingProxy] = []

    def start(host: str, port: int, cut_after: int) -> CuttingProxy:
        proxy = CuttingProxy(host, port, cut_after)
        proxies.append(proxy)
        return proxy

    yield start
    for proxy in proxies:
        proxy.close()


@pytest.fixture
def monitored_nats(tmp_path):
    """A NATS server whose monitoring endpoint answers: (client url, /connz url)."""
    port, monitor_port = free_port(), free_port()
    process = ManagedProcess(nats_spec(port, monitor_port=monitor_port), tmp_path / "logs")
    process.start()
    process.wait_ready(30)
    yield f"nats://127.0.0.1:{port}", f"http://127.0.0.1:{monitor_port}/connz"
    process.stop()
